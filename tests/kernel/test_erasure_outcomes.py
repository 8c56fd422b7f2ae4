"""Every requested erasure ends with an outcome on the audit log (bug GX, decision
0141-exact-erasure-attribution), on SQLite and PostgreSQL.

A request that fails on a storage error between its ``erasure.requested`` entry and
its ledger record (a lock timeout, a lost connection) answered with the error and left
the request without any outcome entry: neither ``projection.purged`` nor
``erasure.refused``. It now ends with ``erasure.failed`` (``reason_code`` the error's
class), and asking again is a new request that completes.

A request whose process is killed in that window (GY) is settled by the next start:
``erasure.abandoned`` (``reason_code`` ``process-ended``), never for a request whose
process is alive (it holds its in-flight mark in the key folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc

from tests import children
from tests.conftest import OTHER_TENANT, Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    build_kernel,
    consent,
    consented_settings,
    other_tenant,
    running,
    say,
    settings_for,
)
from tests.kernel.test_simultaneous_erasure_receipts import Held, by_request
from tests.kernel.test_two_erasures_at_once import outcomes_of_every_request
from uprof.settings import Settings


def _storage_error(*args: Any, **kwargs: Any) -> int:
    raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database is locked"))


@pytest.mark.parametrize("step", ["tombstone", "ledger"])
def test_a_subject_erasure_failing_on_storage_before_its_ledger_record_has_an_outcome(
    backend: Backend, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        consent(kernel, "alice")
        kernel.capture("alice", say("I want to learn to sail"))
        service = kernel.erasure_service
        if step == "tombstone":
            monkeypatch.setattr(service._app, "append_subject_tombstone", _storage_error)
        else:
            ledger = service._keystore.ledger
            assert ledger is not None
            monkeypatch.setattr(ledger, "record_subject", _storage_error)
        with pytest.raises(sqlalchemy.exc.OperationalError):
            kernel.erase_subject("alice")
        monkeypatch.undo()
        failed = [e.entry for e in kernel.audit_log.entries(action="erasure.failed")]
        assert [(e["reason_code"]) for e in failed] == ["OperationalError"], failed
        outcomes = outcomes_of_every_request(kernel)
        assert list(outcomes.values()) == [["erasure.failed"]], outcomes  # main: [[]]
        receipt = kernel.erase_subject("alice").receipt  # a new request, which completes
        assert receipt["body"]["request"]["request_id"] != failed[0]["request_id"]
        assert sorted(map(sorted, outcomes_of_every_request(kernel).values())) == [
            ["erasure.failed"],
            ["projection.purged"],
        ]
    finally:
        kernel.close()


def test_an_event_erasure_failing_on_storage_before_its_ledger_record_has_an_outcome(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        consent(kernel, "alice")
        capture_id = kernel.capture("alice", say("I want to learn to sail")).capture_id
        monkeypatch.setattr(kernel.erasure_service._app, "with_retry", _storage_error)
        with pytest.raises(sqlalchemy.exc.OperationalError):
            kernel.erase_capture("alice", capture_id)
        monkeypatch.undo()
        outcomes = outcomes_of_every_request(kernel)
        assert list(outcomes.values()) == [["erasure.failed"]], outcomes  # main: [[]]
    finally:
        kernel.close()


@pytest.fixture
def settings(backend: Backend) -> Settings:
    return consented_settings(backend)


def _outcomes(settings: Settings) -> dict[str, list[str]]:
    kernel = build_kernel(settings, FakeClock())  # a start: it settles dead requests
    try:
        return outcomes_of_every_request(kernel)
    finally:
        kernel.close()


@pytest.mark.parametrize("hold", ["after-requested", "after-tombstone"])
def test_a_request_killed_before_its_ledger_record_is_abandoned_at_the_next_start(
    settings: Settings, hold: str
) -> None:
    """GY: a subject erasure killed (SIGKILL) after its ``erasure.requested`` entry and
    before its ledger record (before or after its tombstone) left that entry without an
    outcome for good. The next start writes ``erasure.abandoned`` for it (its process is
    gone: it holds no in-flight mark), and a new erasure then completes, citing the dead
    request's tombstone when it appended one."""
    dead = Held(settings, hold)
    dead.begin()
    dead.kill()
    outcomes = _outcomes(settings)
    assert list(outcomes.values()) == [["erasure.abandoned"]], outcomes  # main: [[]]
    (dead_request,) = outcomes
    kernel = build_kernel(settings, FakeClock())
    try:
        (entry,) = [e.entry for e in kernel.audit_log.entries(action="erasure.abandoned")]
        assert entry["request_id"] == dead_request
        assert entry["reason_code"] == "process-ended"
        receipt = kernel.erase_subject("alice").receipt
    finally:
        kernel.close()
    tombstone_by = by_request(receipt, "tombstone_appended")
    assert tombstone_by == ([dead_request] if hold == "after-tombstone" else [None])
    outcomes = _outcomes(settings)
    assert sorted(map(sorted, outcomes.values())) == [
        ["erasure.abandoned"],
        ["projection.purged"],
    ], outcomes


def test_a_start_beside_a_live_request_does_not_abandon_it(settings: Settings) -> None:
    """Attack on GY's fix (two processes): a request held alive after its
    ``erasure.requested`` entry while another process starts. The start must not take it
    for dead; let go, it completes, and it has exactly one outcome."""
    live = Held(settings, "after-tombstone")
    live.begin()
    outcomes = _outcomes(settings)
    assert list(outcomes.values()) == [[]], outcomes  # still running: no outcome yet
    kind, receipt = live.answer()
    assert kind == "ok", receipt
    assert list(_outcomes(settings).values()) == [["projection.purged"]]


def _start(settings: Settings, go: Any) -> None:
    go.wait(60)
    build_kernel(settings, FakeClock()).close()


def test_two_starts_at_once_abandon_a_dead_request_once(settings: Settings) -> None:
    """Attack on GY's fix (two processes): a request killed after its
    ``erasure.requested`` entry, then two processes starting at the same moment, each
    settling dead requests. The request gets one ``erasure.abandoned``, not two: the
    second re-reads the log while holding the dead request's mark."""
    dead = Held(settings, "after-tombstone")
    dead.begin()
    dead.kill()
    ctx = children.CONTEXT
    go = ctx.Event()
    starts = [ctx.Process(target=_start, args=(settings, go)) for _ in range(2)]
    for p in starts:
        p.start()
    go.set()
    for p in starts:
        p.join(120)
        assert p.exitcode == 0
    assert list(_outcomes(settings).values()) == [["erasure.abandoned"]]


def test_a_start_settles_another_tenants_dead_request_in_that_tenants_trail(
    backend: Backend, tmp_path: Path
) -> None:
    """LZ: tenants on one set of stores share the audit log and the key folder's
    in-flight marks (decision 0089), and every start settles every dead request it finds
    there (GY). Tenant B's erasure killed (SIGKILL, a real child) after its
    ``erasure.requested`` entry was settled by tenant A's start as A's: A's auditors read
    B's subject's pseudonym and request id, and B's trail showed the request with no
    outcome. The ``erasure.abandoned`` entry names the request's tenant now."""
    settings = settings_for(backend)
    theirs = other_tenant(settings, tmp_path)
    with running(theirs, FakeClock()) as setup:
        consent(setup, "alice")
    dead = Held(theirs, "after-requested")
    dead.begin()
    dead.kill()
    ours = build_kernel(settings, FakeClock())  # tenant A's start settles dead requests
    try:
        (requested,) = [e.entry for e in ours.audit_log.entries(action="erasure.requested")]
        (abandoned,) = [e.entry for e in ours.audit_log.entries(action="erasure.abandoned")]
        assert abandoned["request_id"] == requested["request_id"]
        assert abandoned["subject_ref"] == requested["subject_ref"]
        assert (requested["tenant"], abandoned["tenant"]) == (OTHER_TENANT, OTHER_TENANT)
        assert list(ours.audit_entries(action="erasure.abandoned")) == []
    finally:
        ours.close()
    other = build_kernel(theirs, FakeClock())
    try:
        (seen,) = [e.entry for e in other.audit_entries(action="erasure.abandoned")]
        assert seen["request_id"] == requested["request_id"]
        assert seen["reason_code"] == "process-ended"
    finally:
        other.close()
