"""Bug KJ (review of 0159-turn-locks): during an upgrade a process of the previous
release may still serve requests (docs/operations.md, "Upgrading a deployment"). That
release (decision 0158) took a keyed withdrawal's turn as one of 256 shard locks; this
one takes a lock of the key's own, which the old process never sees. A withdrawal with
erase sent to an old process and resent with its key to a new one ran in both at once:
two erasures of one key, bug JG again. The new release also holds the key's old shard
lock, *shared*: the old release's exclusive holder and it exclude each other, while two
holders of this release (two keys on one old shard) still never wait for each other
(bug KC)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, settings_for
from tests.kernel.previous_release_turn_child import hold_previous_release_lock, hold_previous_turn
from tests.kernel.turn_lock_child import hold_until_killed
from uprof.backends import backend_for as backend_of
from uprof.services.idempotency import RequestInProgressError
from uprof.storage import layout_for


def test_a_key_whose_first_request_runs_in_a_previous_release_process_is_not_run_again(
    backend: Backend,
) -> None:
    settings = settings_for(backend)
    kernel = build_kernel(settings, FakeClock())
    holding, release = children.CONTEXT.Event(), children.CONTEXT.Event()
    old = None
    try:
        store = kernel.idempotency
        assert store is not None
        store.in_progress_wait_s = 1.0
        key = "withdraw-during-upgrade"
        old = children.CONTEXT.Process(
            target=hold_previous_turn,
            args=(layout_for(settings).views_url, store.token(APP, key), holding, release),
        )
        old.start()
        assert holding.wait(60), "the previous release's process did not take its turn"
        ran: list[str] = []

        def execute(token: str) -> tuple[dict[str, object], int]:
            ran.append(token)  # the erasure, a second time for this key
            return {"receipt": None}, 200

        body = {"subject": "alice", "consent_id": "c-1", "erase": True}
        with pytest.raises(RequestInProgressError):
            kernel.idempotent(APP, key, "consent.withdraw", body, execute)
        assert ran == []
    finally:
        release.set()
        if old is not None:
            old.join(60)
        kernel.close()


def test_a_turn_whose_holder_was_killed_is_taken_by_the_next_and_its_file_goes(
    backend: Backend, tmp_path: Path
) -> None:
    """Attack of the review of 0159: kill -9 of a process holding a key's turn. The next
    taker gets it at once (PostgreSQL ends the session's advisory lock; on SQLite the
    flock dies with the process and its file, left behind, is taken over by the next
    holder of the name and deleted by it)."""
    database = tmp_path / "locks.sqlite"
    url = backend.url if backend.kind == "postgres" else f"sqlite:///{database}"
    holding = children.CONTEXT.Event()
    holder = children.CONTEXT.Process(
        target=hold_until_killed, args=(url, "idempotency-turn-killed", holding)
    )
    holder.start()
    try:
        assert holding.wait(60), "the holder did not take the lock"
        engine = sa.create_engine(url)
        try:
            with backend_of(engine).named_lock(engine, "idempotency-turn-killed", wait_s=0) as held:
                assert not held  # a live holder keeps it
            os.kill(holder.pid or 0, signal.SIGKILL)
            holder.join(30)
            assert holder.exitcode == -signal.SIGKILL
            if backend.kind == "sqlite":  # the dead holder's file is still there
                assert len(list((tmp_path / "locks.sqlite.locks").iterdir())) == 1
            with backend_of(engine).named_lock(engine, "idempotency-turn-killed", wait_s=5) as held:
                assert held
        finally:
            engine.dispose()
    finally:
        if holder.is_alive():
            holder.kill()
            holder.join(30)
    if backend.kind == "sqlite":
        assert list((tmp_path / "locks.sqlite.locks").iterdir()) == []


def test_a_previous_release_process_cannot_take_a_key_this_release_runs(
    backend: Backend,
) -> None:
    """The other way round: while this release runs a key (its turn held), a process of
    the previous release finds that key's turn taken."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, FakeClock())
    try:
        store = kernel.idempotency
        assert store is not None
        token = store.token(APP, "withdraw-during-upgrade")
        engine = kernel.views_engine
        with backend_of(engine).named_lock(
            engine,
            store.turn_name(token),
            wait_s=0,
            previous_release_shared=store.previous_release_turn_name(token),
        ) as held:
            assert held
            holding, release = children.CONTEXT.Event(), children.CONTEXT.Event()
            release.set()
            old = children.CONTEXT.Process(
                target=hold_previous_turn,
                args=(layout_for(settings).views_url, token, holding, release),
            )
            old.start()
            old.join(60)
            assert old.exitcode == 3  # its turn was not free
    finally:
        kernel.close()


def test_a_revocation_waits_for_a_previous_release_process_revoking(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The API-key revocation lock moved into the lock folder on SQLite too: a revocation
    in a process of the previous release (its lock ``<keys database>.apikey-revocation-
    lock``) and one in this release ran at once, the race of bug DL. Now this release
    also holds the old file shared: it finds the old holder, waits, and (as a revocation
    does past its wait) revokes without the lock, saying so. PostgreSQL kept the lock's
    advisory key: the same there before and after."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, FakeClock())
    holding, release = children.CONTEXT.Event(), children.CONTEXT.Event()
    old = children.CONTEXT.Process(
        target=hold_previous_release_lock,
        args=(layout_for(settings).keys_url, "apikey-revocation", holding, release),
    )
    try:
        issued = kernel.issue_api_key(APP, ["app"])
        monkeypatch.setattr(type(kernel), "REVOCATION_LOCK_WAIT_S", 0.5)
        old.start()
        assert holding.wait(60), "the previous release's process did not take its lock"
        with caplog.at_level(logging.WARNING, logger="uprof.kernel"):
            assert kernel.revoke_api_key(issued.info.key_id)
        assert any("revoking without it" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
        if old.pid is not None:
            old.join(60)
        kernel.close()
