"""KZ: a re-applied item erasure is audited, once, across processes.

An item erasure killed after its ledger record (a real child, SIGKILL) leaves the item
listed; the next read of the subject re-applies the erasure (bug IP): the views change
then, and the log, which promises an entry for every write, recorded nothing.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any
from uuid import UUID

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    OTHER_TENANT,
    SAIL,
    build_kernel,
    other_tenant,
    sail_intent_of_alice,
    settings_for,
)
from tests.kernel.test_erasure_leftovers import _killed_after_record
from uprof.kernel import Uprof

ACTION = "erasure.items_reapplied"


def _read_at_once(settings: Any, ready: Any, out: Any) -> None:
    """A child already running (its kernel built), reading alice when all are ready."""
    kernel = build_kernel(settings, FakeClock())
    try:
        ready.wait(120)
        out.put([i.item_id for i in kernel.profile("alice").intents])
    finally:
        kernel.close()


def _start_killed_after_its_entry(settings: Any) -> None:
    """A child starting (its start re-applies the ledger's items), SIGKILLed right after
    the re-application's audit entry is committed and before its ``ItemsErased``."""
    from uprof.adapters.audit_trail import AuditLogTrail

    real = AuditLogTrail.record_many

    def recorded(self: AuditLogTrail, entries: Any, **kwargs: Any) -> None:
        real(self, entries, **kwargs)
        if any(action == ACTION for action, _ in entries):
            os.kill(os.getpid(), signal.SIGKILL)

    AuditLogTrail.record_many = recorded  # type: ignore[method-assign]
    build_kernel(settings, FakeClock())


def _erasure_of_alices_intent_killed(settings: Any) -> Any:
    """Alice's intent (one start, closed), then its item erasure killed in a child after
    its ledger record: the item listed, its erasure to re-apply."""
    first = build_kernel(settings, FakeClock())
    try:
        intent = sail_intent_of_alice(first)
    finally:
        first.close()
    _killed_after_record(settings, "item", intent.item_id)
    return intent


def _entries(kernel: Uprof) -> list[dict[str, Any]]:
    return [dict(e.entry) for e in kernel.audit_log.entries() if e.entry["action"] == ACTION]


def _item_request(kernel: Uprof, item_id: str) -> str:
    ledger = kernel.keystore.ledger
    assert ledger is not None
    (request,) = {r.request_id for r in ledger.records() if item_id in r.item_ids}
    return request


def test_two_processes_reapplying_a_killed_item_erasure_record_it_once(
    backend: Backend,
) -> None:
    """Two real processes read the subject at once after the erasure was killed: the
    item is served by neither, and the log holds exactly one ``erasure.items_reapplied``
    entry naming the item id and the ledger's request id (no plaintext); later reads,
    which change nothing, add none."""
    settings = settings_for(backend)
    running = build_kernel(settings, FakeClock())
    ctx = children.CONTEXT
    try:
        intent = sail_intent_of_alice(running)
        _killed_after_record(settings, "item", intent.item_id)
        request = _item_request(running, intent.item_id)
        ready, out = ctx.Barrier(2), ctx.Queue()
        readers = [ctx.Process(target=_read_at_once, args=(settings, ready, out)) for _ in "ab"]
        for reader in readers:
            reader.start()
        served = [out.get(timeout=180) for _ in readers]
        for reader in readers:
            reader.join(60)
        assert [r.exitcode for r in readers] == [0, 0]
        assert served == [[], []], served
        entries = _entries(running)
        assert len(entries) == 1, entries
        (entry,) = entries
        assert entry["item_refs"] == [intent.item_id]
        assert entry["request_id"] == request
        assert entry["reason_code"] == "erasure-reapplied"
        assert SAIL.lower() not in json.dumps(entry).lower()
        running.process()
        for _ in range(3):
            assert running.profile("alice").intents == ()
        assert len(_entries(running)) == 1
    finally:
        running.close()


def test_a_start_reapplying_a_killed_item_erasure_records_it(backend: Backend) -> None:
    """The same re-application done by a start (``recovery.reapply_ledger``) goes
    through the same audited path: one entry, whatever number of starts."""
    settings = settings_for(backend)
    intent = _erasure_of_alices_intent_killed(settings)
    for _ in range(2):
        started = build_kernel(settings, FakeClock())
        try:
            entries = _entries(started)
            assert [e["item_refs"] for e in entries] == [[intent.item_id]], entries
            assert entries[0]["request_id"] == _item_request(started, intent.item_id)
        finally:
            started.close()


def test_the_same_reapplication_appended_twice_is_recorded_once(backend: Backend) -> None:
    """What keeps racing processes at one entry, made deterministic: the same items of
    the same request re-applied twice (the second as a process that read the views
    before the first's event) append two events but one ``erasure.items_reapplied``."""
    settings = settings_for(backend)
    running = build_kernel(settings, FakeClock())
    try:
        intent = sail_intent_of_alice(running)
        _killed_after_record(settings, "item", intent.item_id)
        ledger = running.keystore.ledger
        assert ledger is not None
        (stream,) = {r.stream_id for r in ledger.records() if intent.item_id in r.item_ids}
        assert stream is not None
        for _ in range(2):
            running.erasure_service.reapply_items(UUID(stream), [intent.item_id])
        assert [e["item_refs"] for e in _entries(running)] == [[intent.item_id]]
        reasons = [
            getattr(e, "reason", None)
            for e in running.app.stream_events(UUID(stream))
            if type(e).__name__ == "ItemsErased"
        ]
        assert reasons.count("erasure-reapplied") == 2, reasons
    finally:
        running.close()


def test_a_start_records_another_tenants_reapplied_items_in_that_tenants_trail(
    backend: Backend, tmp_path: Path
) -> None:
    """LF: tenants on one set of stores share the ledger, the views and the audit log
    (decision 0089). A start of tenant A re-applies tenant B's killed item erasure (the
    views are shared, so it must) and recorded it as A's: A's auditors read B's
    subject's pseudonym and request id, B's trail lacked the re-application. The entry
    names B now; A's trail holds none, and B's start (or read) writes no second one."""
    settings = settings_for(backend)
    theirs = other_tenant(settings, tmp_path)
    intent = _erasure_of_alices_intent_killed(theirs)
    ours = build_kernel(settings, FakeClock())  # tenant A's start re-applies B's item
    try:
        request = _item_request(ours, intent.item_id)
        entries = _entries(ours)
        assert [(e["tenant"], e["request_id"]) for e in entries] == [(OTHER_TENANT, request)], (
            entries
        )
        mine = [dict(e.entry) for e in ours.audit_entries(action=ACTION)]
        assert mine == [], mine
    finally:
        ours.close()
    other = build_kernel(theirs, FakeClock())
    try:
        assert other.profile("alice").intents == ()
        (seen,) = [dict(e.entry) for e in other.audit_entries(action=ACTION)]
        assert seen["item_refs"] == [intent.item_id]
        assert len(_entries(other)) == 1
    finally:
        other.close()


def test_a_start_killed_between_the_entry_and_the_event_leaves_one_entry(
    backend: Backend,
) -> None:
    """Held (review of 0169): a start SIGKILLed after the ``erasure.items_reapplied``
    entry and before the event leaves the item listed; the next read (another process,
    already running) erases it and its entry is the same one (left out): one entry,
    never an unaudited re-application, and a start after it adds none."""
    settings = settings_for(backend)
    running = build_kernel(settings, FakeClock())
    try:
        intent = sail_intent_of_alice(running)
        _killed_after_record(settings, "item", intent.item_id)
        child = children.CONTEXT.Process(target=_start_killed_after_its_entry, args=(settings,))
        child.start()
        child.join(120)
        assert child.exitcode == -signal.SIGKILL
        assert [e["item_refs"] for e in _entries(running)] == [[intent.item_id]]
        ledger = running.keystore.ledger
        assert ledger is not None
        (stream,) = {r.stream_id for r in ledger.records() if intent.item_id in r.item_ids}
        reapplied = [
            e
            for e in running.app.stream_events(UUID(str(stream)))
            if getattr(e, "reason", None) == "erasure-reapplied"
        ]
        assert reapplied == [], reapplied  # the child died before its event
        running.process()
        assert running.profile("alice").intents == ()
        assert [e["item_refs"] for e in _entries(running)] == [[intent.item_id]]
    finally:
        running.close()
    started = build_kernel(settings, FakeClock())
    try:
        assert started.profile("alice").intents == ()
        assert len(_entries(started)) == 1
    finally:
        started.close()
