"""Which embedding model made a store's vectors, and the embedder that refuses to mix two.

Memory vectors are computed by the projections and kept in the views; a query vector is
computed at each slice. Vectors of two models (all-MiniLM-L6-v2 and all-mpnet-base-v2, or
the hashing stand-in) are not comparable, and two of the same width would not even fail:
a slice would rank by noise. So the first process that embeds anything records its model
in the log's tracking table (a row ``embedder:<name>``, beside the partition count), and
every process checks its own model against that row before its first embedding. A
process configured with another model starts (it can still erase, export, audit and
rebuild) but refuses to embed, so it neither projects nor serves a slice, with
``EmbedderMismatchError``. ``uprof projections rebuild`` re-embeds every memory with the
configured model and records it (decision 0049).

Another process's rebuild may change the record while this one runs. So the record is
read again: by every projection batch, inside its transaction once it holds the position
lock (``check_current``: a rebuild records its model before it resets the views, and the
reset waits for that lock, so a batch never commits vectors of a model the store no longer
records); and by a slice when the last read is older than ``RECHECK_S``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import sqlalchemy as sa

from domain.errors import EmbedderMismatchError
from uprof.ports import Embedder

ROW_PREFIX = "embedder:"
#: How old the last read of the record may be for a slice's query vector (seconds): a slice
#: in a process that another process's rebuild left with the wrong model ranks by noise for
#: at most this long, then is refused.
RECHECK_S = 1.0


#: A row every claim and replace locks first, so claims by two processes that start
#: together with different models queue (PostgreSQL: the row lock; SQLite: the write
#: lock that the first write of a transaction takes) and the second sees the first's row.
LOCK_ROW = "uprof.embedder-claim"


def _lock(conn: sa.Connection, tracking_table: str) -> None:
    conn.execute(
        sa.text(
            f"INSERT INTO {tracking_table} (application_name, notification_id) "
            "VALUES (:n, 0) ON CONFLICT (application_name) DO NOTHING"
        ),
        {"n": LOCK_ROW},
    )
    conn.execute(
        sa.text(
            f"UPDATE {tracking_table} SET notification_id = notification_id "
            "WHERE application_name = :n"
        ),
        {"n": LOCK_ROW},
    )


def claim(engine: sa.Engine, tracking_table: str, name: str, dimension: int) -> str:
    """Record ``name`` as the store's model if none is recorded; return the recorded one."""
    with engine.begin() as conn:
        _lock(conn, tracking_table)
        recorded = _recorded(conn, tracking_table)
        if recorded is None:
            conn.execute(
                sa.text(
                    f"INSERT INTO {tracking_table} (application_name, notification_id) "
                    "VALUES (:n, :d)"
                ),
                {"n": ROW_PREFIX + name, "d": dimension},
            )
            recorded = name
    return recorded


def replace(engine: sa.Engine, tracking_table: str, name: str, dimension: int) -> None:
    """Record ``name`` as the store's model, whatever was recorded (a rebuild)."""
    with engine.begin() as conn:
        _lock(conn, tracking_table)
        conn.execute(
            sa.text(f"DELETE FROM {tracking_table} WHERE application_name LIKE :p"),
            {"p": f"{ROW_PREFIX}%"},
        )
        conn.execute(
            sa.text(
                f"INSERT INTO {tracking_table} (application_name, notification_id) VALUES (:n, :d)"
            ),
            {"n": ROW_PREFIX + name, "d": dimension},
        )


def recorded(engine: sa.Engine, tracking_table: str) -> str | None:
    """The store's recorded model, read without writing (None when none is recorded)."""
    with engine.connect() as conn:
        return _recorded(conn, tracking_table)


def _recorded(conn: sa.Connection, tracking_table: str) -> str | None:
    rows = conn.execute(
        sa.text(
            f"SELECT application_name FROM {tracking_table} WHERE application_name LIKE :p "
            "ORDER BY application_name"
        ),
        {"p": f"{ROW_PREFIX}%"},
    ).scalars()
    names = [str(r)[len(ROW_PREFIX) :] for r in rows]
    return names[0] if names else None


def model_name(embedder: Embedder) -> str:
    """The model an embedder runs (its ``name``; a test double without one: its class)."""
    return str(getattr(embedder, "name", type(embedder).__name__))


class RecordedModelEmbedder:
    """An ``Embedder`` that checks, once, that the store records its model (or records it
    when the store records none), and refuses to embed when the store records another."""

    def __init__(
        self,
        inner: Embedder,
        claim: Callable[[str, int], str],
        read: Callable[[], str | None] | None = None,
        *,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.inner = inner
        self.name = model_name(inner)
        self.dimension = inner.dimension
        self._claim = claim
        #: Reads the record without claiming (None: never re-read, as before).
        self._read = read
        self.recheck_s = recheck_s
        self._checked = False
        self._checked_at = 0.0
        self._recorded: str | None = None
        self._lock = threading.Lock()

    def check(self, *, max_age_s: float | None = None) -> None:
        """Raise EmbedderMismatchError when the store's vectors are another model's,
        as the record read at most ``max_age_s`` ago says (default ``recheck_s``)."""
        bound = self.recheck_s if max_age_s is None else max_age_s
        if not self._checked or (
            self._read is not None and time.monotonic() - self._checked_at >= bound
        ):
            with self._lock:
                now = time.monotonic()
                if not self._checked:
                    self._recorded = self._claim(self.name, self.dimension)
                    self._checked, self._checked_at = True, now
                elif self._read is not None and now - self._checked_at >= bound:
                    # Another process's rebuild may have recorded another model.
                    self._recorded = self._read() or self._claim(self.name, self.dimension)
                    self._checked_at = now
        if self._recorded != self.name:
            raise EmbedderMismatchError(
                f"this store's vectors were made by embedder={self._recorded}, and this "
                f"process runs embedder={self.name}"
            )

    def check_current(self) -> None:
        """``check`` against the record as it is now (a projection batch, before it
        writes vectors)."""
        self.check(max_age_s=0.0)

    def recorded(self, name: str) -> None:
        """The store now records ``name`` (after a rebuild by this process)."""
        with self._lock:
            self._recorded = name
            self._checked = True
            self._checked_at = time.monotonic()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.check()
        return self.inner.embed(texts)

    def __getattr__(self, attribute: str) -> object:
        # load(), loaded and the rest of the real embedder's surface pass through.
        return getattr(self.inner, attribute)
