"""A subject's ``destroy`` reports the keys it deleted, not the keys it saw (review of
decision 0131, bug GK; SQLite and PostgreSQL).

Two erasures of one subject at once may both call ``destroy``: each receipt cites as its
own only the keys its destroy deleted, and the keys the other deleted ``by_request``
(bug GH). So a destroy that waits for another transaction deleting the same keys must
answer none: on PostgreSQL it read the keys, then its DELETE waited for the other's
commit and deleted nothing, and it still reported them.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import sqlalchemy as sa

from tests.kernel.conftest import consent, say
from uprof.crypto.tables import subject_keys
from uprof.kernel import Uprof


def _signal_key_deletes(engine: sa.Engine) -> threading.Event:
    """An Event set when a thread other than this one sends a DELETE of subject keys."""
    sent = threading.Event()
    me = threading.get_ident()

    @sa.event.listens_for(engine, "before_cursor_execute")
    def seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if threading.get_ident() != me and statement.lstrip().upper().startswith(
            f"DELETE FROM {subject_keys.name.upper()}"
        ):
            sent.set()

    return sent


def _until_waiting(
    engine: sa.Engine, other: sa.Connection, deleting: threading.Event, worker: threading.Thread
) -> None:
    """Until the worker's destroy waits for ``other``'s uncommitted DELETE: on PostgreSQL,
    the server lists ``other`` as what blocks a session; on SQLite (no lock table), the
    worker has sent its DELETE, which cannot run while ``other`` holds the write lock."""
    assert deleting.wait(60), "the destroy never sent its DELETE"
    if engine.dialect.name == "postgresql":
        holder = other.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        blocked = sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE :h = ANY(pg_blocking_pids(pid))"
        )
        deadline = time.monotonic() + 60
        with engine.connect() as look:
            while not look.execute(blocked, {"h": holder}).scalar_one():
                assert worker.is_alive(), "the destroy ended without waiting for the lock"
                assert time.monotonic() < deadline, "the destroy never waited for the lock"
                time.sleep(0.01)
                look.rollback()
    assert worker.is_alive(), "the destroy ended without waiting for the lock"


def test_a_destroy_waiting_for_another_deleting_the_keys_reports_none(kernel: Uprof) -> None:
    consent(kernel, "alice")
    kernel.capture("alice", say("I want to learn to sail"))
    handle = kernel.subjects.find("alice")
    assert handle is not None
    stream = str(handle.stream_id)
    engine = kernel.keystore._engine
    assert kernel.keystore.destruction_preview(stream).deks, "alice has no key to destroy"
    answers: list[object] = []
    deleting = _signal_key_deletes(engine)
    with engine.connect() as other:
        other.begin()
        # Another erasure's destroy, its DELETE done, not yet committed.
        other.execute(subject_keys.delete().where(subject_keys.c.stream_id == stream))
        worker = threading.Thread(
            target=lambda: answers.append(
                kernel.keystore.destroy(stream, now=datetime(2026, 1, 1, tzinfo=UTC))
            )
        )
        worker.start()
        _until_waiting(engine, other, deleting, worker)
        other.commit()
    worker.join(60)
    assert not worker.is_alive()
    assert len(answers) == 1, answers
    (destruction,) = answers
    assert destruction.deks == (), destruction  # type: ignore[attr-defined]
    assert kernel.keystore.destruction_preview(stream).deks == ()
