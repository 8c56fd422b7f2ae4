"""A data folder copied while a server wrote, file by file, opened by another process
(SQLite: the views and the log are two files, copied at two moments).

Copying ``events.sqlite`` before ``views.sqlite`` (the order a plain folder copy may take)
gives views ahead of their log: they hold items whose captured events the log copy lacks,
and their projection position names notifications the log has not reached. Until
2026-12-05 a process opening such a copy served those items (evidence the log does not
hold: I1, and rebuild != live: I11), and the projection skipped every event captured in
the copy until the log caught up with the copied position: acknowledged captures never
reached the views (I12). Now a start that finds a position ahead of the log rebuilds the
views from the log.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.children import run_python
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from tests.kernel.idem_child import keyed_capture
from tests.kernel.other_process import run_in_another_process
from uprof.kernel import Uprof

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def copy_file(source: Path, target: Path) -> None:
    """One database file as it is now (SQLite's backup API: a consistent copy of it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def copy_the_rest(live: Path, copy: Path) -> None:
    """After the log: the views, the key store, the policy store and the key folder's
    other files (master key, erasure ledger)."""
    for path in live.rglob("*"):
        target = copy / path.relative_to(live)
        if path.suffix == ".sqlite" and path.name != "events.sqlite":
            copy_file(path, target)
        elif path.is_file() and path.parent.name.endswith(".keys") and ".sqlite" not in path.name:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def test_a_copy_with_views_ahead_of_its_log_serves_the_log_and_projects_new_captures(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    live = backend.data_dir
    copy = Backend("sqlite", "", tmp_path / "copy")
    consent(kernel)
    kernel.capture("alice", say("I live in Porto"))
    kernel.process()
    # The log first ...
    copy_file(live / "data" / "events.sqlite", copy.data_dir / "data" / "events.sqlite")
    for i in range(3):
        kernel.capture("alice", say(f"Yesterday I met Qzxlater{i} at the market"))
    kernel.process()
    # ... then, a moment later, everything else.
    copy_the_rest(live, copy.data_dir)

    done = run_in_another_process(
        copy,
        """
        from tests.kernel.conftest import say
        kernel.capture("alice", say("I live in Lisbon"))
        kernel.process()
        print(repr(kernel.profile("alice")))
        """,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    served = done.stdout
    assert "Qzxlater" not in served  # nothing the copied log does not hold
    assert "Lisbon" in served  # the capture acknowledged in the copy is projected
    # And the copy's views are what a rebuild from its log gives.
    k = build_kernel(settings_for(copy), FakeClock())
    try:
        live_views = k.queries.table_digest()
        k.rebuild()
        assert k.queries.table_digest() == live_views
    finally:
        k.close()


def test_a_request_answered_after_the_log_was_copied_is_written_when_retried_on_the_copy(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    """The idempotency keys live beside the views: a torn copy holds answers to writes its
    log lacks. Until 2026-12-05 a client retrying such a request on the copy was told the
    subject had been erased (410) and its capture was never written; a client that gives
    up on a 410 lost it for good. The views' rebuild forgets those answers too, so the
    retry runs as a first call and the subject's stream decides what was written."""
    live = backend.data_dir
    copy = Backend("sqlite", "", tmp_path / "copy")
    consent(kernel)
    keyed_capture(kernel, "before-the-copy", "I live in Porto")
    kernel.process()
    copy_file(live / "data" / "events.sqlite", copy.data_dir / "data" / "events.sqlite")
    keyed_capture(kernel, "after-the-copy", "Yesterday I met Qzxretried at the market")
    kernel.process()
    copy_the_rest(live, copy.data_dir)

    done = run_in_another_process(
        copy,
        """
        from tests.kernel.idem_child import keyed_capture
        for key, text in [
            ("after-the-copy", "Yesterday I met Qzxretried at the market"),
            ("before-the-copy", "I live in Porto"),
        ]:
            outcome = keyed_capture(kernel, key, text)
            print(key, outcome.status, outcome.replayed)
        kernel.process()
        print(repr(kernel.profile("alice")))
        """,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # The write the copied log lacks runs (a first answer); the one it holds is not
    # written again (its stream holds the request's token).
    assert lines[0] == "after-the-copy 201 False"
    assert lines[1].startswith("before-the-copy 201")
    served = lines[2]
    assert served.count("Qzxretried") >= 1 and served.count("Porto") >= 1
    k = build_kernel(settings_for(copy), FakeClock())
    try:
        captured = [str(event) for event in k.export_subject("alice")["captured_events"]]
    finally:
        k.close()
    assert sum("Qzxretried" in event for event in captured) == 1
    assert sum("I live in Porto" in event for event in captured) == 1


def test_an_erasure_made_after_the_log_was_copied_stays_erased_on_the_copy(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    """An item erased without its evidence, and a capture erased with what was derived
    from it, after the log was copied: the copy's log lacks both erasures, its views
    (copied later) no longer list the items, and the key folder's ledger names them.
    Until 2026-12-05 the start re-applied the ledger to the views *before* rebuilding
    them from the log, found nothing to erase again, and the rebuild brought the erased
    values back: served to any app with consent (I9; decision 0053)."""
    live = backend.data_dir
    copy = Backend("sqlite", "", tmp_path / "copy")
    consent(kernel)
    kernel.capture("alice", say("I live in Qzxerasedtown"))
    doomed = kernel.capture("alice", say("My favourite colour is Qzxerasedblue"))
    kernel.process()
    profile = kernel.profile("alice")
    items = [a.item_id for a in profile.attributes if "Qzxerasedtown" in a.value]
    items += [m.item_id for m in profile.memories if "Qzxerasedtown" in m.text]
    assert len(items) == 2
    copy_file(live / "data" / "events.sqlite", copy.data_dir / "data" / "events.sqlite")
    for item_id in items:
        kernel.erase_item("alice", item_id)  # without its evidence: no key destroyed
    kernel.erase_capture("alice", doomed.capture_id)
    kernel.process()
    assert "Qzxerased" not in repr(kernel.profile("alice"))
    copy_the_rest(live, copy.data_dir)

    done = run_in_another_process(
        copy,
        """
        kernel.process()
        print(repr(kernel.profile("alice")))
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    served = done.stdout
    assert "Qzxerasedtown" not in served, served  # the erased item
    assert "Qzxerasedblue" not in served, served  # the erased capture, its items


def test_a_consent_withdrawn_after_the_log_was_copied_stays_withdrawn_on_the_copy(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    """A consent withdrawn after the log was copied: the copy's log lacks the withdrawal,
    while its audit log (beside the views, copied later) records it. Until 2026-12-05 the
    rebuild from the log put the consent back in force: the copy accepted captures and
    served the profile under a consent its own audit trail says was withdrawn (I2)."""
    live = backend.data_dir
    copy = Backend("sqlite", "", tmp_path / "copy")
    withdrawn = consent(kernel)
    kept = consent(kernel, "bob")
    kernel.capture("alice", say("I live in Porto"))
    kernel.process()
    copy_file(live / "data" / "events.sqlite", copy.data_dir / "data" / "events.sqlite")
    kernel.withdraw_consent("alice", withdrawn)
    kernel.capture("bob", say("I live in Qzxbobtown"))  # views ahead of the log
    kernel.process()
    copy_the_rest(live, copy.data_dir)

    done = run_in_another_process(
        copy,
        """
        from tests.kernel.conftest import say
        for subject in ("alice", "bob"):
            try:
                kernel.capture(subject, say("I live in Qzxlisbon"))
                print(subject, "accepted")
            except Exception as exc:
                print(subject, "refused", type(exc).__name__)
        print(sorted(c.consent_id for c in kernel.profile("bob").consents))
        actions = [e.entry for e in kernel.audit_entries(action="consent.withdrawn")]
        print(sorted(e["reason_code"] for e in actions))
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "alice refused ConsentRequiredError", lines
    assert lines[1] == "bob accepted", lines
    assert lines[2] == repr([kept]), lines
    # The withdrawal is in the copy's log again, and its re-application is audited.
    assert lines[3] == repr(["withdrawal-reapplied", "withdrawn"]), lines
    k = build_kernel(settings_for(copy), FakeClock())
    try:
        live_views = k.queries.table_digest()
        k.rebuild()
        assert k.queries.table_digest() == live_views
    finally:
        k.close()


KILLED_AFTER_THE_REBUILD = """
import os, signal
from pathlib import Path
import uprof.services.recovery as recovery
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for

real, calls = recovery.reapply_ledger, []

def reapply_then_die(kernel, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # the call after the views were rebuilt from the log
        os.kill(os.getpid(), signal.SIGKILL)
    return real(kernel, **kwargs)

recovery.reapply_ledger = reapply_then_die
build_kernel(settings_for(Backend("sqlite", "", Path({data!r}))), FakeClock())
"""


def test_a_start_killed_after_the_rebuild_leaves_the_withdrawal_for_the_next_start(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    """kill -9 of the start between the rebuild and the re-applications: the next start
    finds views no longer ahead of the log. Until 2026-12-05 it therefore did nothing,
    and the withdrawal made after the log was copied stayed lost. The start now records
    the rebuild's beginning and end in the audit log and does it all again when the end
    is missing."""
    live = backend.data_dir
    copy = Backend("sqlite", "", tmp_path / "copy")
    withdrawn = consent(kernel)
    kernel.capture("alice", say("I live in Porto"))
    kernel.process()
    copy_file(live / "data" / "events.sqlite", copy.data_dir / "data" / "events.sqlite")
    kernel.withdraw_consent("alice", withdrawn)
    kernel.process()
    copy_the_rest(live, copy.data_dir)

    killed = run_python(KILLED_AFTER_THE_REBUILD.format(data=str(copy.data_dir)))
    assert killed.returncode == -9, killed.stderr[-3000:]
    done = run_in_another_process(
        copy,
        """
        from tests.kernel.conftest import say
        try:
            kernel.capture("alice", say("I live in Qzxlisbon"))
            print("accepted")
        except Exception as exc:
            print("refused", type(exc).__name__)
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["refused", "ConsentRequiredError"], done.stdout


def test_a_subject_created_after_the_log_was_copied_can_be_written_on_the_copy(
    backend: Backend, kernel: Uprof, tmp_path: Path
) -> None:
    """The key store copied after the log holds a subject (index row, data key) whose
    stream the copied log lacks: consent, capture and profile of that subject work on
    the copy (checked sound on 6e366f0; kept so that it stays so)."""
    live = backend.data_dir
    copy = Backend("sqlite", "", tmp_path / "copy")
    consent(kernel)
    kernel.capture("alice", say("I live in Porto"))
    kernel.process()
    copy_file(live / "data" / "events.sqlite", copy.data_dir / "data" / "events.sqlite")
    consent(kernel, "bob")
    kernel.capture("bob", say("I live in Qzxbobtown"))
    kernel.process()
    copy_the_rest(live, copy.data_dir)

    done = run_in_another_process(
        copy,
        """
        from tests.kernel.conftest import consent, say
        for step in ("consent", "capture", "profile"):
            try:
                if step == "consent":
                    consent(kernel, "bob")
                elif step == "capture":
                    kernel.capture("bob", say("I live in Qzxbobcity"))
                    kernel.process()
                else:
                    print("profile", repr(kernel.profile("bob")))
                print(step, "ok")
            except Exception as exc:
                print(step, "failed", type(exc).__name__, exc)
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "failed" not in done.stdout, done.stdout
    assert "Qzxbobcity" in done.stdout
