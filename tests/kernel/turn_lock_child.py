"""A child process taking one named lock again and again (``test_turn_locks``): under the
lock it reads a counter file, pauses, and writes it back one higher, so two holders at
once lose an increment. It builds its own engine, as another server process would."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from uprof.backends import backend_for


def count_under_lock(url: str, name: str, counter: str, rounds: int) -> None:
    engine = sa.create_engine(url)
    try:
        backend = backend_for(engine)
        path = Path(counter)
        for _ in range(rounds):
            with backend.named_lock(engine, name, wait_s=60) as held:
                assert held, "the lock was not free within 60 s"
                seen = int(path.read_text() or "0")
                time.sleep(0.002)  # widen the window two holders at once would share
                path.write_text(str(seen + 1))
    finally:
        engine.dispose()


def hold_until_killed(url: str, name: str, holding: Any) -> None:
    """Take the lock ``name`` and keep it until this process is killed (kill -9)."""
    engine = sa.create_engine(url)
    with backend_for(engine).named_lock(engine, name, wait_s=60) as held:
        assert held, "the lock was not free within 60 s"
        holding.set()
        time.sleep(600)
