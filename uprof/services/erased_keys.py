"""The data stores' own record of the keys erasures destroyed: ids only.

The erasure ledger lives in the key folder, so that a copy or a restore of the *data*
cannot bring erased data back: every start and every restore re-applies it
(``uprof.services.recovery``). The other direction was open: a *key folder* put back
from a copy older than an erasure (its ledger and key database predate it) held the
subject's keys again, and the events still in the log were readable again: the
crypto-shredding undone. This table mirrors the ledger's destructive records in the data
stores (``views`` branch): an erased subject's stream id, an erased capture's id. Every
start takes the union of both records, writes each side's missing ones into the other,
and destroys every key either names. Only a rollback of both the data and the key folder
to before an erasure undoes it, and the audit log's published checkpoints then show the
rollback.

What it holds after an erasure: random stream and capture ids and a time (residue "ids
only", as ``shredded_streams`` on the key side).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa

from domain.naming import NAMING_CONVENTION

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

#: The subject's own keys (its data keys, index and alias rows) in ``capture_id``.
WHOLE_SUBJECT = ""

erased_keys = sa.Table(
    "erased_keys",
    metadata,
    sa.Column("stream_id", sa.String(36), primary_key=True),
    sa.Column("capture_id", sa.String(32), primary_key=True),
    sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
    #: A subject erasure's erased-name mark (keyed by the master secret, as in the ledger:
    #: it names nobody without the key folder), so the name still answers "erased".
    sa.Column("mark", sa.String(64), nullable=True),
)


@dataclass
class ErasedKeys:
    """What the table records: erased subjects' streams, erased captures by stream."""

    streams: set[str] = field(default_factory=set)
    captures: dict[str, set[str]] = field(default_factory=dict)
    marks: dict[str, str] = field(default_factory=dict)


def record(
    engine: sa.Engine,
    stream_id: str,
    capture_ids: Iterable[str] = (),
    *,
    now: datetime,
    mark: str | None = None,
) -> None:
    """Record an erasure (the whole subject without ``capture_ids``), before its keys go.

    Idempotent: a row already there (a retry, a start copying the ledger's records) is
    kept as it is, also when another process inserts it between this one's read and its
    insert (an erasure and a starting process joining the ledger): the insert then fails
    on the key, and the next attempt finds the row."""
    wanted = [WHOLE_SUBJECT] if not capture_ids else sorted(set(capture_ids))
    for attempt in range(_ATTEMPTS):
        try:
            _insert_missing(engine, stream_id, wanted, now=now, mark=mark)
            return
        except sa.exc.IntegrityError:
            if attempt == _ATTEMPTS - 1:
                raise


#: Each failed attempt means another process inserted a row this one was about to: the
#: next finds it. More than two only if rows keep appearing (a bug, reported).
_ATTEMPTS = 3


def _insert_missing(
    engine: sa.Engine, stream_id: str, wanted: list[str], *, now: datetime, mark: str | None
) -> None:
    with engine.begin() as conn:
        where = sa.and_(erased_keys.c.stream_id == stream_id, erased_keys.c.capture_id.in_(wanted))
        present = set(conn.execute(sa.select(erased_keys.c.capture_id).where(where)).scalars())
        missing = [c for c in wanted if c not in present]
        if missing:
            conn.execute(
                erased_keys.insert(),
                [
                    {
                        "stream_id": stream_id,
                        "capture_id": c,
                        "erased_at": now,
                        "mark": mark if c == WHOLE_SUBJECT else None,
                    }
                    for c in missing
                ],
            )


def read(engine: sa.Engine) -> ErasedKeys:
    found = ErasedKeys()
    with engine.connect() as conn:
        for stream_id, capture_id, mark in conn.execute(
            sa.select(erased_keys.c.stream_id, erased_keys.c.capture_id, erased_keys.c.mark)
        ):
            if capture_id == WHOLE_SUBJECT:
                found.streams.add(stream_id)
                if mark:
                    found.marks[stream_id] = mark
            else:
                found.captures.setdefault(stream_id, set()).add(capture_id)
    return found
