"""Reading and rewriting a subject stream's stored rows directly, as a writer of the event
store (damage, forgery, a cut) would: one place for the SQL every such test needs."""

from __future__ import annotations

from uuid import UUID

import sqlalchemy as sa

from uprof.kernel import Uprof


def stored_rows(k: Uprof, stream: UUID) -> list[tuple[int, str, bytes]]:
    """``(version, topic, stored state)`` of every row of ``stream``, in version order."""
    app = k.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    with app.events_engine.connect() as conn:
        return [
            (int(r[0]), str(r[1]), bytes(r[2]))
            for r in conn.execute(
                sa.text(
                    f"SELECT originator_version, topic, state FROM {table} "
                    "WHERE originator_id = :s ORDER BY originator_version"
                ),
                {"s": app.backend.stream_key(stream)},
            )
        ]


def head_row(k: Uprof, stream: UUID) -> tuple[int, str, bytes]:
    """The newest stored row of ``stream``."""
    return stored_rows(k, stream)[-1]


def rewrite_row(k: Uprof, stream: UUID, version: int, topic: str, state: bytes) -> None:
    """Replace the topic and stored state of one row of ``stream``, in place."""
    app = k.app
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    with app.events_engine.begin() as conn:
        done = conn.execute(
            sa.text(
                f"UPDATE {table} SET topic = :t, state = :st "
                "WHERE originator_id = :s AND originator_version = :v"
            ),
            {"t": topic, "st": state, "s": app.backend.stream_key(stream), "v": version},
        )
        assert done.rowcount == 1


def flip_last_byte(state: bytes) -> bytes:
    """``state`` with its last byte (inside a sealed row's GCM tag) flipped: flipped
    again, the row is whole."""
    return state[:-1] + bytes([state[-1] ^ 0x01])
