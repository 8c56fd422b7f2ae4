"""Child processes for the read-then-write sweep's tests (decision
0121-read-then-write-sweep): each builds its own kernel on the test's stores, as another
server or CLI process would, and meets the other racer at a barrier placed right before a
chosen statement (``idem_child.before_first``)."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from tests.kernel.idem_child import before_first
from uprof.settings import Settings


def _meet(barrier: Any, timeout_s: float) -> None:
    """Wait for the other racer; go on alone if it cannot come (on SQLite a racer whose
    transaction has written holds the file's write lock, so the other waits on the lock,
    never reaching the barrier: the interleaving the barrier asks for cannot happen)."""
    try:
        barrier.wait(timeout=timeout_s)
    except threading.BrokenBarrierError:
        pass


def bind_at_once(
    settings: Settings, kind: str, alias: str, subject: str, barrier: Any, out: Any
) -> None:
    """Bind ``alias`` (a session id or an identifier) to ``subject`` with the other racer:
    both are right before the statement that stores the binding (barrier)."""
    kernel = build_kernel(settings, FakeClock())
    try:
        before_first(kernel.keys_engine, "INSERT INTO SUBJECT_ALIASES", lambda: _meet(barrier, 3.0))
        try:
            if kind == "session":
                kernel.register_session(alias, subject)
            else:
                kernel.register_identifier(alias, subject)
            out.put(("ok", ""))
        except Exception as error:  # reported to the test, which names it
            out.put(("error", f"{type(error).__name__}: {error}"[:500]))
    finally:
        kernel.close()


#: How long the second racer first tries the revocation lock before it queues for it as
#: ``revoke_api_key`` does: refused, it says so, and the first need not wait for it.
LOCK_TRY_S = 0.5


def _first_of(events: list[Any], timeout_s: float) -> None:
    """Wait until any of ``events`` is set, at most ``timeout_s``; go on alone after."""
    deadline = time.monotonic() + timeout_s
    while not any(e.is_set() for e in events) and time.monotonic() < deadline:
        events[0].wait(timeout=0.02)


def revoke_in_step(
    settings: Settings, key_id: str, role: str, sync: dict[str, Any], out: Any
) -> None:
    """Revoke ``key_id`` in step with the other racer: both read the key live; ``first``
    revokes it and waits before its audit append until ``second`` (which revokes only
    after ``first`` committed) has finished its whole call.

    Since bug DL the second cannot read, nor finish, while the first holds the
    revocation lock: the first would wait out both bounds (3 s, then 10 s) for what
    cannot come. The second first tries the lock for ``LOCK_TRY_S``; refused (the
    first holds it), it sets ``second_locked_out`` and queues for it as before, and the
    first goes on alone at once. A kernel without the lock never refuses it: the racers
    then meet as before."""
    from uprof.apikeys.store import ApiKeyStore
    from uprof.backends import backend_for

    kernel = build_kernel(settings, FakeClock())
    live_app_of, revoke = ApiKeyStore.live_app_of, ApiKeyStore.revoke
    record_many = kernel.audit.record_many
    backend = type(backend_for(kernel.keys_engine))
    named_lock = backend.named_lock

    def read_live(self: ApiKeyStore, kid: str) -> str | None:
        found = live_app_of(self, kid)
        if role == "first":
            sync["first_read"].set()
            _first_of([sync["second_read"], sync["second_locked_out"]], 3.0)
        else:
            sync["second_read"].set()
        return found

    def revoke_in_turn(self: ApiKeyStore, kid: str) -> bool:
        if role == "second":
            assert sync["first_revoked"].wait(timeout=60)
        done = revoke(self, kid)
        if role == "first":
            sync["first_revoked"].set()
        return done

    def append_in_turn(*args: Any, **kwargs: Any) -> Any:
        if role == "first":  # on a fixed kernel the second writes none
            _first_of([sync["second_done"], sync["second_locked_out"]], 10.0)
        return record_many(*args, **kwargs)

    def lock_tried_first(self: Any, engine: Any, name: str, **kwargs: Any) -> Any:
        if role == "second" and name == "apikey-revocation":
            with named_lock(self, engine, name, **{**kwargs, "wait_s": LOCK_TRY_S}) as held:
                pass
            if not held:
                sync["second_locked_out"].set()
        return named_lock(self, engine, name, **kwargs)

    ApiKeyStore.live_app_of = read_live  # type: ignore[method-assign]
    ApiKeyStore.revoke = revoke_in_turn  # type: ignore[method-assign]
    kernel.audit.record_many = append_in_turn  # type: ignore[method-assign]
    backend.named_lock = lock_tried_first  # type: ignore[method-assign]
    try:
        if role == "second":  # the roles as named, whichever process starts first
            assert sync["first_read"].wait(timeout=60)
        revoked = kernel.revoke_api_key(key_id)
        if role == "second":
            sync["second_done"].set()
        out.put((role, revoked))
    finally:
        kernel.close()


def recreate_at_once(settings: Settings, subject: str, barrier: Any, out: Any) -> None:
    """Re-create an erased ``subject`` with the other racer: both have found the name
    marked erased before either records the re-creation (barrier)."""
    kernel = build_kernel(settings, FakeClock())
    ledger = kernel.keystore.ledger
    assert ledger is not None
    is_erased = ledger.is_erased

    def found_erased(tenant: str, ref: str) -> bool:
        erased = is_erased(tenant, ref)
        _meet(barrier, 60.0)
        return erased

    ledger.is_erased = found_erased  # type: ignore[method-assign]
    try:
        out.put(kernel.recreate_subject(subject))
    finally:
        kernel.close()
