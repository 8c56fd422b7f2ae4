"""0216's fix of TF (the consent's erasure turn, ``Uprof._consent_erasure_turn``: a named
lock of the deployment's around an erasing withdrawal) attacked with real processes on
both backends (0219-review-of-0216-and-tf): its holder killed with SIGKILL in the middle
of the erasure while another request waits for the turn, the two requests let go one
after the other in the order TF's double click gave them, and consent ids a hostile
caller chooses reaching the lock's name. All held.

The waiter is seen waiting before the holder is killed or let go: on SQLite by the
name's turnstile file (``<lock>.turn``, made by a process that waits), on PostgreSQL by
its advisory lock request queued and not granted in ``pg_locks``."""

from __future__ import annotations

import functools
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from audit.receipts import RECEIPT_ACTION
from domain.errors import UprofError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from tests.kernel.test_simultaneous_erasure_receipts import WAIT_S, Held, request_of
from tests.kernel.test_withdrawal_erasure_killed import collected, setup, unkeyed_withdrawal
from uprof.settings import Settings

__all__ = ["setup"]  # the fixture, shared with RE's tests


class _Nothing:
    receipt = None


def _withdrawal_or_nothing(consent_id: str, kernel: Any) -> Any:
    """``call`` for ``Held``: an unkeyed withdrawal with erase that may find nothing left
    (``None``, answered as a receipt of ``None``)."""
    return unkeyed_withdrawal(consent_id, kernel) or _Nothing()


def _lock_file_name(settings: Settings, consent_id: str) -> str:
    """The sha256 the turn's lock is named by (its file's name on SQLite)."""
    kernel = build_kernel(settings, FakeClock())
    try:
        stream = kernel.stream_of("alice")
    finally:
        kernel.close()
    return hashlib.sha256(f"consent-erasure/{stream}/{consent_id}".encode()).hexdigest()


def _lock_files(settings: Settings) -> list[Path]:
    """Every file in the deployment's named-lock folders (SQLite)."""
    return sorted(p for folder in settings.data_dir.glob("*.locks") for p in folder.iterdir())


def waiting_for_turn(settings: Settings, name: str) -> bool:
    """Whether a process waits for the named lock ``name`` of the deployment's: on SQLite
    its turnstile file (made by a process that waits), on PostgreSQL an advisory lock
    request queued and not granted."""
    if settings.database_url is None:
        return any(p.name == f"{name}.turn" for p in _lock_files(settings))
    engine = sa.create_engine(settings.database_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            queued = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON l.database = d.oid "
                    "WHERE l.locktype = 'advisory' AND NOT l.granted "
                    "AND d.datname = current_database()"
                )
            ).scalar_one()
    finally:
        engine.dispose()
    return bool(queued)


def wait_until_waiting_for_turn(settings: Settings, name: str) -> None:
    """Until a process waits for ``name``'s lock (a generous bound)."""
    deadline = time.monotonic() + WAIT_S
    while not waiting_for_turn(settings, name):
        assert time.monotonic() < deadline, "the second request never waited for the turn"
        time.sleep(0.05)


def _receipts_and_requests(settings: Settings, consent_id: str) -> tuple[int, list[str], list[str]]:
    """(receipts on the log, consent-withdrawal erasure requests, what is still collected)."""
    kernel = build_kernel(settings, FakeClock())
    try:
        kernel.process()
        kernel.reads.drain()
        receipts = sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == RECEIPT_ACTION)
        requested = [
            e.entry["request_id"]
            for e in kernel.audit_entries(action="erasure.requested")
            if e.entry.get("reason_code") == "consent-withdrawal"
        ]
        return receipts, requested, collected(kernel, consent_id)
    finally:
        kernel.close()


def test_held_the_turns_holder_killed_mid_erasure_lets_the_waiter_finish_it_once(
    backend: Backend, setup: tuple[Settings, str]
) -> None:
    """The holder of the turn is killed (SIGKILL) with its erasure recorded and its
    capture keys not yet destroyed, while a second process waits for the turn. The
    system drops the dead holder's lock (a flock, a session's advisory lock): the waiter
    takes it (on main's code before TF it would not have waited; a lock kept by the dead
    would have answered 409 after 60 s), finishes the killed request's erasure and
    answers its receipt: one request, one receipt, nothing left collected. On SQLite the
    dead holder's lock file is used and deleted by the waiter: no file left behind."""
    settings, consent_id = setup
    name = _lock_file_name(settings, consent_id)
    killed = Held(
        settings, "before-capture-destroy", call=functools.partial(unkeyed_withdrawal, consent_id)
    )
    waiter = Held(settings, call=functools.partial(_withdrawal_or_nothing, consent_id))
    killed.begin()  # in the turn: erasure.requested and its ledger record written
    waiter.begin()
    wait_until_waiting_for_turn(settings, name)
    killed.kill()
    kind, receipt = waiter.answer()
    assert kind == "ok" and receipt is not None, receipt
    receipts, requested, left = _receipts_and_requests(settings, consent_id)
    assert (receipts, left) == (1, []), (receipts, left)
    assert requested == [request_of(receipt)], requested  # the killed request's, finished
    if backend.kind == "sqlite":
        assert _lock_files(settings) == [], _lock_files(settings)


def test_held_two_processes_in_turn_give_one_receipt(
    backend: Backend, setup: tuple[Settings, str]
) -> None:
    """TF's interleaving, forced across processes: the second request arrives while the
    first is in the middle of its erasure (past its look for captures, before their keys
    are destroyed), waits for the turn, then reads the views after the first's erasure
    and writes nothing: one receipt."""
    settings, consent_id = setup
    name = _lock_file_name(settings, consent_id)
    first = Held(
        settings, "before-capture-destroy", call=functools.partial(unkeyed_withdrawal, consent_id)
    )
    second = Held(settings, call=functools.partial(_withdrawal_or_nothing, consent_id))
    first.begin()
    second.begin()
    wait_until_waiting_for_turn(settings, name)
    kind, receipt = first.answer()
    assert kind == "ok" and receipt is not None, receipt
    kind, nothing = second.answer()
    assert (kind, nothing) == ("ok", None), nothing
    receipts, requested, left = _receipts_and_requests(settings, consent_id)
    assert (receipts, left) == (1, []), (receipts, left)
    assert requested == [request_of(receipt)], requested
    if backend.kind == "sqlite":
        assert _lock_files(settings) == [], _lock_files(settings)


HOSTILE_CONSENT_IDS = [
    "../../../escape",
    "/",
    "a\nconsent-erasure/x",
    "\x00",
    "x" * 20_000,
    "ÿ" * 300,
]


@pytest.mark.parametrize("consent_id", HOSTILE_CONSENT_IDS, ids=range(len(HOSTILE_CONSENT_IDS)))
def test_held_a_hostile_consent_id_reaches_no_file_name(
    backend: Backend, setup: tuple[Settings, str], consent_id: str
) -> None:
    """A consent id is the caller's text and part of the turn's name: the name reaches
    the lock only as a sha256 (a file name of 64 hex digits on SQLite, a 64-bit key on
    PostgreSQL), so a path, a newline, a NUL or 20,000 characters make no file of their
    own, no error of the file system's, and no lock left held; the request is refused
    as a consent this subject does not hold."""
    settings, real_consent = setup
    kernel = build_kernel(settings, FakeClock())
    try:
        with pytest.raises(UprofError) as refused:
            kernel.withdraw_consent("alice", consent_id, erase=True)
        assert "consent" in str(refused.value), refused.value
        # The turn was let go: the subject's own consent is withdrawn and erased at once.
        result = kernel.withdraw_consent("alice", real_consent, erase=True)
        assert result is not None and result.receipt is not None
    finally:
        kernel.close()
    named = [p for p in backend.data_dir.rglob("*") if "escape" in p.name or "\n" in p.name]
    assert named == [], named
    if backend.kind == "sqlite":
        assert _lock_files(settings) == [], _lock_files(settings)
