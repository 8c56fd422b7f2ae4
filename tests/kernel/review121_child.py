"""Child processes for the review of decision 0121 (decision 0127-review-of-0121): each
builds its own kernel on the test's stores, as another server or CLI process would, and
is held at a chosen statement while the test process acts."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from uprof.settings import Settings


def bind_beside_an_erasure(
    settings: Settings, subject: str, alias: str, hold: str, sync: dict[str, Any], out: Any
) -> None:
    """Register ``alias`` as a session of ``subject`` while the test erases the subject.

    ``hold="before"``: the binder has found the subject live and waits right before the
    statement that stores the binding until the test has erased the subject.
    ``hold="after"``: the binder has stored the binding (not committed) and waits up to
    3 s for the test's erasure before it commits (an erasure that waits on the binding's
    locks cannot come; one that does not wait finishes meanwhile)."""
    kernel = build_kernel(settings, FakeClock())
    held: list[bool] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if hold == "before" and not held and "INTO SUBJECT_ALIASES" in statement.upper():
            held.append(True)
            sync["ready"].set()
            assert sync["erased"].wait(timeout=120)

    def after(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if hold == "after" and not held and "INTO SUBJECT_ALIASES" in statement.upper():
            held.append(True)
            sync["ready"].set()
            sync["erased"].wait(timeout=3)

    sa.event.listen(kernel.keys_engine, "before_cursor_execute", before)
    sa.event.listen(kernel.keys_engine, "after_cursor_execute", after)
    try:
        kernel.register_session(alias, subject)
        out.put(("ok", ""))
    except Exception as error:  # reported to the test, which names it
        out.put(("error", f"{type(error).__name__}: {error}"[:500]))
    finally:
        kernel.close()


def revoke_then_hold(
    settings: Settings, key_id: str, sync: dict[str, Any], out: Any, hold_s: float = 5.0
) -> None:
    """Revoke ``key_id`` (the key store's UPDATE commits), then wait up to ``hold_s``
    before the audit append: for the test's ``go``, or a process killed by the test."""
    kernel = build_kernel(settings, FakeClock())
    record_many = kernel.audit.record_many

    def append_later(*args: Any, **kwargs: Any) -> Any:
        sync["revoked"].set()
        sync["go"].wait(timeout=hold_s)
        return record_many(*args, **kwargs)

    kernel.audit.record_many = append_later  # type: ignore[method-assign]
    try:
        out.put(("first", kernel.revoke_api_key(key_id)))
    finally:
        kernel.close()


def revoke_once(
    settings: Settings,
    key_id: str,
    role: str,
    barrier: Any,
    out: Any,
    lock_wait_s: float | None = None,
) -> None:
    """Ask to revoke ``key_id`` (after the barrier, if any), as ``uprof apps revoke``."""
    kernel = build_kernel(settings, FakeClock())
    if lock_wait_s is not None:
        kernel.REVOCATION_LOCK_WAIT_S = lock_wait_s  # type: ignore[misc]
    try:
        if barrier is not None:
            barrier.wait(timeout=60)
        out.put((role, kernel.revoke_api_key(key_id)))
    finally:
        kernel.close()


def erase_at_once(settings: Settings, subject: str, barrier: Any, out: Any) -> None:
    """Erase ``subject`` with the other racer: both have found it live (barrier right
    after the erasure's own lookup) before either records anything."""
    import threading

    kernel = build_kernel(settings, FakeClock())
    service = kernel.erasure_service
    require = service._require

    def found_live(ref: str) -> Any:
        handle = require(ref)
        try:
            barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            pass
        return handle

    service._require = found_live  # type: ignore[method-assign]
    try:
        result = kernel.erase_subject(subject)
        out.put(("ok", result.receipt))
    except Exception as error:  # reported to the test, which names it
        out.put(("error", f"{type(error).__name__}: {error}"[:500]))
    finally:
        kernel.close()
