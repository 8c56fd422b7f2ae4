"""Two processes re-creating one erased subject at once (SQLite and PostgreSQL, real
processes; decision 0121-read-then-write-sweep, bug CO).

``recreate_subject`` checks that the name is marked erased, records the re-creation in
the ledger, creates the new subject (the key store's primary key lets one process create
it; the other finds it) and appends ``subject.recreated``. Two operators (or a retried
script) re-creating the same name at once both passed the check, and both appended the
entry: the log showed two re-creations of one new subject. The entry is now written once
per new subject (``once_by``), whichever processes ask.
"""

from __future__ import annotations

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, settings_for
from tests.kernel.sweep_child import recreate_at_once


def test_two_processes_recreating_one_subject_record_one_recreation(backend: Backend) -> None:
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    try:
        consent(setup, "alice")
        setup.erase_subject("alice")
    finally:
        setup.close()
    ctx = children.CONTEXT
    barrier, out = ctx.Barrier(2), ctx.Queue()
    racers = [
        ctx.Process(target=recreate_at_once, args=(settings, "alice", barrier, out))
        for _ in range(2)
    ]
    for p in racers:
        p.start()
    pseudonyms = [out.get(timeout=120) for _ in racers]
    for p in racers:
        p.join(60)
        assert p.exitcode == 0
    kernel = build_kernel(settings, FakeClock())
    try:
        # The re-created name's index row: since 0227-leftovers-of-0218-to-0223 (UT) a
        # subject is found once its stream holds events, and a re-creation writes none
        # until consent is granted again, which reuses this row.
        handle = kernel.keystore.resolve(kernel.subjects.tenant, "alice")
        assert handle is not None  # one new subject, both callers were told its pseudonym
        assert pseudonyms == [handle.pseudonym, handle.pseudonym]
        entries = [
            e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "subject.recreated"
        ]
        assert [e["subject_ref"] for e in entries] == [handle.pseudonym], entries
        consent(kernel, "alice")  # the grant makes the subject under that same pseudonym
        found = kernel.subjects.find("alice")
        assert found is not None and found.pseudonym == handle.pseudonym
    finally:
        kernel.close()


def test_each_recreation_of_a_name_erased_again_is_recorded(backend: Backend) -> None:
    # Review of 0121 (held): ``once_by=("subject_ref",)`` keys on the new subject's
    # pseudonym, drawn anew for every incarnation, so a name erased, re-created, erased
    # again and re-created again gets its second entry too.
    settings = settings_for(backend)
    kernel = build_kernel(settings, FakeClock())
    try:
        consent(kernel, "alice")
        pseudonyms = []
        for _ in range(2):
            kernel.erase_subject("alice")
            pseudonyms.append(kernel.recreate_subject("alice"))
            consent(kernel, "alice")
        entries = [
            e.entry for e in kernel.audit_log.entries() if e.entry["action"] == "subject.recreated"
        ]
        assert len(set(pseudonyms)) == 2
        assert [e["subject_ref"] for e in entries] == pseudonyms, entries
    finally:
        kernel.close()
