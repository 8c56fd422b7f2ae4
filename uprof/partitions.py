"""Partitions of the pipeline: which worker extracts and projects which subjects.

With ``UPROF_WORKER_PARTITIONS=M`` every subject belongs to one partition,
``stream_id.int % M`` (stream ids are random uuid4s, so partitions are even and the
mapping is the same in every process). Partition ``k`` has its own extraction
position (a row of eventsourcing's tracking table) and its own projection position
(a row of ``projection_tracking``), so M workers never wait on or redo each other's
work; two workers given the same partition are kept apart by the guarded save
(``uprof.recorders``): one commits, the other re-reads.

M is a property of the database, not of one process: a server that answered
read-your-writes from a 1-way position while workers moved 3-way positions would
wait on a row nobody moves, and workers of two layouts would each extract every
capture once. So the first process records M in the database and every later one
must agree (``claim``); changing M on a database that already has positions is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from uuid import UUID

import sqlalchemy as sa

from domain.errors import UprofError

#: The tracking row that records a database's partition count.
LAYOUT_ROW = "uprof.partitions"


class PartitioningMismatchError(UprofError):
    hint = (
        "start every server and worker of this database with the same "
        "UPROF_WORKER_PARTITIONS (the count the database records)"
    )


@dataclass(frozen=True)
class Partitioning:
    """M partitions by subject; position names per partition."""

    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 1024:
            raise ValueError("worker_partitions must be between 1 and 1024")

    def of(self, stream_id: UUID | str) -> int:
        # Notifications type their originator id as UUID or str (text-id applications).
        return (stream_id if isinstance(stream_id, UUID) else UUID(stream_id)).int % self.count

    def check(self, partitions: Iterable[int]) -> tuple[int, ...]:
        owned = tuple(sorted(set(partitions)))
        bad = [k for k in owned if not 0 <= k < self.count]
        if bad or not owned:
            raise ValueError(
                f"partition must be in 0..{self.count - 1} (worker_partitions={self.count})"
            )
        return owned

    @property
    def all(self) -> tuple[int, ...]:
        return tuple(range(self.count))

    def name(self, base: str, k: int) -> str:
        """The position name of partition k: the plain name when there is one partition
        (so a 1-way deployment keeps the positions it always had)."""
        return base if self.count == 1 else f"{base}.p{k}of{self.count}"

    def names(self, base: str) -> list[str]:
        return [self.name(base, k) for k in self.all]


def claim(engine: sa.Engine, tracking_table: str, extraction_base: str, count: int) -> None:
    """Record the partition count in the database, or check it against the recorded one.

    Raises PartitioningMismatchError when the database records another count, or when
    it has none recorded yet but its 1-way extraction position has already moved and
    ``count`` is not 1 (re-partitioning a running log is not supported).
    """
    with engine.begin() as conn:
        # A write first: on SQLite it takes the write lock (two first starters then
        # queue instead of one failing on a stale snapshot); on PostgreSQL it is a no-op.
        conn.execute(
            sa.text(
                f"UPDATE {tracking_table} SET notification_id = notification_id "
                "WHERE application_name = :n"
            ),
            {"n": LAYOUT_ROW},
        )
        recorded = conn.execute(
            sa.text(f"SELECT notification_id FROM {tracking_table} WHERE application_name = :n"),
            {"n": LAYOUT_ROW},
        ).scalar()
        if recorded is None:
            if count != 1:
                moved = conn.execute(
                    sa.text(
                        f"SELECT notification_id FROM {tracking_table} WHERE application_name = :n"
                    ),
                    {"n": extraction_base},
                ).scalar()
                if moved:
                    raise PartitioningMismatchError(
                        f"worker_partitions={count}, but this database's workers already ran "
                        "unpartitioned (re-partitioning an existing log is not supported)"
                    )
            conn.execute(
                sa.text(
                    f"INSERT INTO {tracking_table} (application_name, notification_id) "
                    "VALUES (:n, :m) ON CONFLICT (application_name) DO NOTHING"
                ),
                {"n": LAYOUT_ROW, "m": count},
            )
            recorded = conn.execute(
                sa.text(
                    f"SELECT notification_id FROM {tracking_table} WHERE application_name = :n"
                ),
                {"n": LAYOUT_ROW},
            ).scalar_one()
    if int(recorded) != count:
        raise PartitioningMismatchError(
            f"worker_partitions={count}, but this database records {recorded} partitions"
        )


def owned_or_all(partitioning: Partitioning, partitions: Sequence[int] | None) -> tuple[int, ...]:
    return partitioning.all if partitions is None else partitioning.check(partitions)
