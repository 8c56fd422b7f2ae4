"""Leftovers of decisions 0141, 0145 and 0147 (decision 0152-erasure-leftovers).

Bug IO: a restore that rolled a capture erasure's events back (its ``ErasedRefsNoted``
and its ``CaptureErased``) had the erasure's events appended again without the ref's
token, so once the idempotency retention passed, re-importing the file captured the
erased words again. Both backends, end to end: import, erase, restore a backup taken
before the erasure, ask again (or not), re-import a day later.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from domain.errors import ErasureIncompleteError, SubjectErasedError
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import SAIL, build_kernel, consent, say, settings_for
from tests.kernel.test_erasure_resume_scopes import (
    projections_stall_after_first_wait,
    unfinished_request,
)
from tests.kernel.test_import_erased_refs import captured
from tests.kernel.test_import_idempotency import record
from tests.kernel.test_simultaneous_erasure_receipts import Held
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore
from uprof.services.importer import import_interactions

ERASED = "Qzxerasedcanary lives here"
LINES = [record(ERASED, ref="r-erased"), record("I like tea", ref="r-kept")]


def imported_with_consent(kernel: Uprof, lines: list[str]) -> dict[str, str]:
    """Alice consents and her two-line file is imported (both lines captured, the views
    fresh): her capture ids by source ref."""
    consent(kernel)
    assert import_interactions(kernel, lines).captured == 2
    kernel.ensure_fresh(10)
    captures = kernel.queries.all_captures(str(kernel.stream_of("alice")))
    return {c.source_ref: c.capture_id for c in captures}


def assert_a_later_reimport_skips_the_erased_line(
    kernel: Uprof, clock: FakeClock, lines: list[str]
) -> None:
    """Once the idempotency retention has passed (its keys purged), alice's file imported
    again captures nothing: its first line is skipped as erased, and her only capture is
    the kept one (``r-kept``)."""
    clock.advance(seconds=kernel.settings.idempotency_retention_s + 3600)
    kernel.purge_idempotency_keys()
    kernel.ensure_fresh(10)
    again = import_interactions(kernel, lines)
    assert (again.captured, again.erased) == (0, ("line 1",)), again
    kernel.ensure_fresh(10)
    refs = [c.source_ref for c in kernel.queries.all_captures(str(kernel.stream_of("alice")))]
    assert refs == ["r-kept"]


@pytest.mark.parametrize("finished_before_restore", [False, True], ids=["incomplete", "receipted"])
def test_a_restored_capture_erasure_still_skips_its_reimport(
    backend: Backend,
    clock: FakeClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    finished_before_restore: bool,
) -> None:
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        erased = imported_with_consent(kernel, LINES)["r-erased"]
    finally:
        kernel.close()
    backup(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    try:
        if finished_before_restore:
            kernel.erase_capture("alice", erased)
        else:
            with monkeypatch.context() as behind:
                projections_stall_after_first_wait(kernel, behind)
                with pytest.raises(ErasureIncompleteError):
                    kernel.erase_capture("alice", erased)
            assert unfinished_request(kernel, "capture", [erased])
    finally:
        kernel.close()
    restore(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    try:
        if not finished_before_restore:
            # Asked again: the erasure's events are appended again (the log lost them).
            kernel.erase_capture("alice", erased)
        assert_a_later_reimport_skips_the_erased_line(kernel, clock, LINES)
        assert len(captured(kernel)) == 1
    finally:
        kernel.close()


# ------------------------------------------- a request killed after its ledger record


def _erase_killed_after_record(settings: Any, scope: str, target: str) -> None:
    """A child (its own process) erasing, SIGKILLed right after its ledger record."""
    kernel = build_kernel(settings, FakeClock())
    ledger = kernel.keystore.ledger
    assert ledger is not None
    method = {"item": "record_items", "capture": "record_captures", "subject": "record_subject"}
    real = getattr(ledger, method[scope])

    def recorded(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(ledger, method[scope], recorded)
    if scope == "item":
        kernel.erase_item("alice", target)
    elif scope == "capture":
        kernel.erase_capture("alice", target)
    else:
        kernel.erase_subject("alice")


def _killed_after_record(settings: Any, scope: str, target: str) -> None:
    child = children.CONTEXT.Process(
        target=_erase_killed_after_record, args=(settings, scope, target)
    )
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("scope", ["item", "capture", "subject"])
def test_a_request_killed_after_its_ledger_record_leaves_nothing_readable(
    backend: Backend, clock: FakeClock, scope: str
) -> None:
    """Decision item 4: a request killed (SIGKILL, a real process) just after its
    ledger record, beside a process that was already running and does not restart. That
    process must serve nothing the erasure takes; on main an erased item stayed listed
    (its ``ItemsErased`` comes after the record, and no key guards an item) until a
    start re-applied the ledger or someone asked again (bug IP)."""
    settings = settings_for(backend)
    running = build_kernel(settings, clock)
    try:
        consent(running)
        ack = running.capture("alice", say(f"I want to learn to {SAIL}", ref="sail"))
        running.capture("alice", say("I live in Porto", ref="porto"))
        running.process()
        (intent,) = running.profile("alice").intents
        target = intent.item_id if scope == "item" else ack.capture_id
        _killed_after_record(settings, scope, target)
        running.ensure_fresh(10)
        running.process()
        try:
            view = running.profile("alice")
            served = json.dumps(running.export_subject("alice"), default=str).lower()
        except SubjectErasedError:
            assert scope == "subject"
        else:
            assert view.intents == (), view.intents
            # An item erasure keeps its evidence (the capture): the item alone goes.
            assert (target if scope == "item" else SAIL).lower() not in served
            assert scope != "subject" or (view.memories, view.attributes) == ((), ())
        # Asked again, it finishes with the dead request's receipt.
        again = (
            running.erase_item("alice", target)
            if scope == "item"
            else running.erase_capture("alice", target)
            if scope == "capture"
            else running.erase_subject("alice")
        )
        assert again is not None
    finally:
        running.close()


# ------------------------------------------- a request left open on a host gone for good

OTHER_HOST = "host-gone-for-good"
SETTLE = "from uprof.cli.main import app; app()"


def _erase_on_other_host(settings: Any, held: Any, go: Any) -> None:
    """A subject erasure on another host (its marks name OTHER_HOST), stopped after its
    ``erasure.requested`` entry: killed there when ``held`` is None, else held until
    ``go``."""
    socket.gethostname = lambda: OTHER_HOST  # this process stands for the other host
    kernel = build_kernel(settings, FakeClock())
    service = kernel.erasure_service
    record = service._audit.record

    def recorded(action: str, **fields: Any) -> Any:
        written = record(action, **fields)
        if action == "erasure.requested":
            if held is None:
                os.kill(os.getpid(), signal.SIGKILL)
            held.set()
            assert go.wait(120)
        return written

    service._audit.record = recorded  # type: ignore[method-assign]
    kernel.erase_subject("alice")
    kernel.close()


def _cli_env(settings: Any) -> dict[str, str]:
    env = {**os.environ, "UPROF_DATA_DIR": str(settings.data_dir), "UPROF_EMBEDDER": "hashing"}
    env.pop("UPROF_DATABASE_URL", None)
    if settings.database_url:
        env["UPROF_DATABASE_URL"] = settings.database_url
    return env


def _outcomes(settings: Any) -> dict[str, list[tuple[str, str]]]:
    kernel = build_kernel(settings, FakeClock())  # a start on this host, too
    try:
        found: dict[str, list[tuple[str, str]]] = {}
        for e in kernel.audit_log.entries():
            request = e.entry.get("request_id")
            if e.entry["action"] == "erasure.requested":
                found.setdefault(str(request), [])
            elif e.entry["action"] in ("erasure.abandoned", "projection.purged"):
                found.setdefault(str(request), []).append(
                    (e.entry["action"], str(e.entry.get("reason_code", "")))
                )
        return found
    finally:
        kernel.close()


def test_an_operator_settles_the_requests_of_a_host_gone_for_good(backend: Backend) -> None:
    """Decision item 2 (0145's HY left a request dead on a host that never starts again
    without an outcome): ``uprof erase settle-host``, real processes throughout."""
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    consent(setup)
    setup.close()
    ctx = children.CONTEXT
    # On the other host: a request held alive (a real process), then one killed there.
    # (Held first: the killed one's own start, on that host, leaves a held mark alone.)
    held, go = ctx.Event(), ctx.Event()
    live = ctx.Process(target=_erase_on_other_host, args=(settings, held, go))
    live.start()
    env = _cli_env(settings)

    def settle(*args: str) -> Any:
        done = children.run_python(SETTLE, "erase", "settle-host", *args, env=env)
        # Rich wraps lines at the terminal width: compare words.
        done.stdout, done.stderr = " ".join(done.stdout.split()), " ".join(done.stderr.split())
        return done

    try:
        assert held.wait(120)
        dead = ctx.Process(target=_erase_on_other_host, args=(settings, None, None))
        dead.start()
        dead.join(120)
        assert dead.exitcode == -signal.SIGKILL
        # A start here does not judge the other host's marks (HY).
        assert sorted(map(len, _outcomes(settings).values())) == [0, 0]
        unconfirmed = settle(OTHER_HOST)
        assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
        own = settle(socket.gethostname(), "--yes")
        assert own.returncode != 0 and "is this host" in own.stdout + own.stderr
        # One of that host's marks is locked: it is not gone. Refused, nothing written.
        refused = settle(OTHER_HOST, "--yes")
        assert refused.returncode == 1, refused
        assert "locked by a running process" in refused.stderr
        seen = _outcomes(settings)
        assert sorted(map(len, seen.values())) == [0, 0], seen
    finally:
        live.kill()
        live.join(60)
    done = settle(OTHER_HOST, "--yes")
    assert done.returncode == 0, done
    assert "settled 2 erasure request(s)" in done.stdout
    outcomes = _outcomes(settings)
    assert list(outcomes.values()) == [[("erasure.abandoned", "host-gone")]] * 2
    again = settle(OTHER_HOST, "--yes")  # nothing left: one outcome each
    assert again.returncode == 0 and "settled 0" in again.stdout
    assert list(_outcomes(settings).values()) == [[("erasure.abandoned", "host-gone")]] * 2
    kernel = build_kernel(settings, FakeClock())
    try:
        (entry, _) = [e.entry for e in kernel.audit_log.entries(action="erasure.abandoned")]
        assert entry["requested_by"] == "operator:local#cli"
        kernel.audit_log.verify_integrity()
        assert kernel.erase_subject("alice").receipt  # asked again: a new request completes
    finally:
        kernel.close()


# ------------------------------------------------ the start's sweep, bounded by a mark


def _requested_leaf(settings: Any) -> dict[str, int]:
    kernel = build_kernel(settings, FakeClock())
    try:
        return {
            str(e.entry["request_id"]): e.leaf_index
            for e in kernel.audit_log.entries(action="erasure.requested")
        }
    finally:
        kernel.close()


def _mark(settings: Any) -> dict[str, Any] | None:
    kernel = build_kernel(settings, FakeClock())
    try:
        ledger = kernel.keystore.ledger
        assert ledger is not None
        raw = ledger.settled_mark()
        return None if raw is None else dict(json.loads(raw))
    finally:
        kernel.close()


def _start_killed_writing_the_mark(settings: Any) -> None:
    """A start SIGKILLed inside the mark's write (its temporary file written, not yet
    renamed): the ``os.replace`` is where a torn mark would come from."""
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if str(dst).endswith("erasures-settled-upto.json"):
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)

    os.replace = replace  # type: ignore[assignment]
    build_kernel(settings, FakeClock())


@pytest.mark.parametrize("mark", ["kept", "killed-mid-write", "damaged", "foreign-log"])
def test_the_settled_mark_never_passes_an_open_request(backend: Backend, mark: str) -> None:
    """Decision item 3: starts read only the log after the settled-up-to mark. A request
    alive across many starts (a real process, held after ``erasure.requested``) keeps the
    mark below it; killed, the next start still settles it. The mark written by a start
    killed mid-write, a damaged mark, and a mark whose leaf is not this log's (a log put
    back from a backup and grown again) each fall back to the whole log."""
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    consent(setup)
    for n in range(3):  # settled requests before it: the mark may pass these
        consent(setup, f"early-{n}")
        setup.erase_subject(f"early-{n}")
    setup.close()
    live = Held(settings, "after-tombstone")
    live.begin()
    try:
        for _ in range(2):
            build_kernel(settings, FakeClock()).close()
        leaves = _requested_leaf(settings)
        (request,) = [r for r, leaf in leaves.items() if leaf == max(leaves.values())]
        written = _mark(settings)
        assert written is not None
        assert max(leaves.values()) > written["after_leaf"] >= sorted(leaves.values())[2]
    finally:
        live.kill()
    if mark == "killed-mid-write":
        child = children.CONTEXT.Process(target=_start_killed_writing_the_mark, args=(settings,))
        child.start()
        child.join(120)
        assert child.exitcode in (-signal.SIGKILL, 0)
    elif mark in ("damaged", "foreign-log"):
        kernel = build_kernel(settings, FakeClock())
        ledger = kernel.keystore.ledger
        assert ledger is not None
        size = kernel.audit_log.size()
        text = (
            "{not json"
            if mark == "damaged"
            else json.dumps({"after_leaf": size - 1, "leaf_hash": "00" * 32})
        )
        ledger.write_settled_mark(text)  # after this start's sweep: the next one reads it
        kernel.close()
    kernel = build_kernel(settings, FakeClock())
    try:
        abandoned = [
            e.entry["request_id"] for e in kernel.audit_log.entries(action="erasure.abandoned")
        ]
        assert abandoned == [request]
        assert kernel.erase_subject("alice").receipt
    finally:
        kernel.close()
    moved = _mark(settings)
    assert moved is not None and moved["after_leaf"] >= _requested_leaf(settings)[request]
