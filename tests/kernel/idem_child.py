"""Child processes for the idempotency tests (spawned: each is its own deployment)."""

from __future__ import annotations

import os
import signal
from dataclasses import asdict
from typing import Any

from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, say
from uprof.settings import Settings


def keyed_capture(kernel: Any, key: str, text: str, *, app: str = APP, kill: str = "") -> Any:
    """A capture as AppScope sends it with an Idempotency-Key; ``kill`` dies mid-way."""

    def execute(token: str) -> tuple[dict[str, Any], int]:
        if kill == "before-write":
            os.kill(os.getpid(), signal.SIGKILL)
        ack = kernel.capture("alice", say(text, app=app), request_token=token)
        if kill == "after-write":
            os.kill(os.getpid(), signal.SIGKILL)
        return asdict(ack), 201

    return kernel.idempotent(app, key, "capture", {"text": text, "app": app}, execute)


def race(settings: Settings, keys: list[str], barrier: Any, out: Any) -> None:
    """Send each key once, in step with the other racer (barrier before each)."""
    kernel = build_kernel(settings, FakeClock())
    try:
        for key in keys:
            barrier.wait(timeout=60)
            outcome = keyed_capture(kernel, key, f"I like tea number {key}")
            out.put((key, outcome.response, outcome.status))
    finally:
        kernel.close()


def die_during(settings: Settings, key: str, kill: str) -> None:
    """Claim the key and be killed before or after the write (never answers)."""
    kernel = build_kernel(settings, FakeClock())
    keyed_capture(kernel, key, "I like green tea", kill=kill)


def before_first(engine: Any, sql_start: str, action: Any) -> None:
    """Run ``action()`` once, right before the first statement on ``engine`` whose SQL
    starts with ``sql_start`` (a test's hook into a real process's timing)."""
    import sqlalchemy as sa

    done: list[bool] = []

    def hook(*_args: Any, **_kwargs: Any) -> None:
        statement = _args[2]
        if not done and statement.lstrip().upper().startswith(sql_start):
            done.append(True)
            action()

    sa.event.listen(engine, "before_cursor_execute", hook)


def reclaim_at_once(settings: Settings, key: str, hours: float, barrier: Any, out: Any) -> None:
    """Send ``key`` ``hours`` after the first start (its row expired), with the other
    racer: both have read the expired row before either removes it (barrier)."""
    import time

    clock = FakeClock()
    clock.advance(hours=hours)
    kernel = build_kernel(settings, clock)
    try:
        store = kernel.idempotency
        assert store is not None
        # A process that purged less than a minute ago: the expired row is still there.
        store._last_purge = time.monotonic()
        before_first(
            kernel.views_engine,
            "DELETE FROM IDEMPOTENCY_KEYS",
            lambda: barrier.wait(timeout=60),
        )
        outcome = keyed_capture(kernel, key, "I like green tea")
        out.put((outcome.response, outcome.status, outcome.replayed))
    finally:
        kernel.close()
