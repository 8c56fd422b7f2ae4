"""Drive the read-model projections: catch up, report lag, wait, rebuild."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from uuid import UUID

import sqlalchemy as sa

from projections.profile import tables as t
from projections.profile.projector import ProfileProjector
from uprof.eventstore import ProfilesApplication
from uprof.partitions import Partitioning, owned_or_all

Progress = Callable[[int, int], None]


class ProjectionRunner:
    """Catch-up loop over the profiles log (SQLite has no notification channel).

    Safe with any number of runners in any number of processes: a batch locks its
    position row, re-reads it and applies only what lies beyond it (``apply_batch``).
    With ``partitioning`` of M, partition k's events go to k's own position row; this
    runner runs the ``partitions`` it is given (all by default) and answers the
    positions of every partition.
    """

    def __init__(
        self,
        app: ProfilesApplication,
        engine: sa.Engine,
        projector: ProfileProjector,
        batch_size: int = 256,
        *,
        partitioning: Partitioning | None = None,
        partitions: Sequence[int] | None = None,
    ) -> None:
        self._app = app
        self._engine = engine
        self._projector = projector
        self._batch_size = batch_size
        self._partitioning = partitioning or Partitioning()
        self._owned = owned_or_all(self._partitioning, partitions)
        self._ensure_position_rows()

    def position_name(self, k: int) -> str:
        return self._partitioning.name(self._projector.name, k)

    def _ensure_position_rows(self) -> None:
        """Create the position rows up front: batches lock them, so they must exist."""
        tracking = t.projection_tracking
        for name in self._partitioning.names(self._projector.name):
            try:
                with self._engine.begin() as conn:
                    exists = conn.execute(
                        sa.select(tracking.c.notification_id).where(
                            tracking.c.projection_name == name,
                            tracking.c.application_name == self._app.name,
                        )
                    ).first()
                    if exists is None:
                        conn.execute(
                            tracking.insert(),
                            {
                                "projection_name": name,
                                "application_name": self._app.name,
                                "notification_id": 0,
                            },
                        )
            except sa.exc.IntegrityError:
                pass  # another process created it first

    def partition_position(self, k: int) -> int:
        with self._engine.connect() as conn:
            return self._projector.position(conn, self._app.name, self.position_name(k))

    @property
    def position(self) -> int:
        """The lowest position of every partition: the whole log up to it is projected."""
        if self._partitioning.count == 1:
            return self.partition_position(0)
        tracking = t.projection_tracking
        with self._engine.connect() as conn:
            low = conn.execute(
                sa.select(sa.func.min(tracking.c.notification_id)).where(
                    tracking.c.projection_name.in_(
                        self._partitioning.names(self._projector.name)
                    ),
                    tracking.c.application_name == self._app.name,
                )
            ).scalar()
        return int(low or 0)

    def position_for(self, stream_id: UUID) -> int:
        """How far the subject's events are projected (its partition's position)."""
        return self.partition_position(self._partitioning.of(stream_id))

    def lag(self) -> int:
        """Notifications recorded but not yet projected (by the slowest partition)."""
        return max(0, self._app.max_notification_id() - self.position)

    def run_once(self) -> int:
        """Project one batch per owned partition; returns how many notifications it consumed."""
        return sum(self._run_partition(k) for k in self._owned)

    def _run_partition(self, k: int) -> int:
        start = self.partition_position(k)
        notifications = self._app.notifications_after(start, self._batch_size)
        if not notifications:
            return 0
        of = self._partitioning.of
        events = [
            (n.id, self._app.decode(n))
            for n in notifications
            if self._partitioning.count == 1 or of(n.originator_id) == k
        ]
        # Embed outside the write transaction: the model is the slow part, and the
        # views database should not be locked while it runs.
        vectors = self._projector.embed_memories([e for _, e in events])
        with self._engine.begin() as conn:
            self._projector.apply_batch(
                conn,
                self._app.name,
                events,
                notifications[-1].id,
                vectors=vectors,
                projection_name=self.position_name(k),
            )
        return len(notifications)

    def run_until_idle(self, progress: Progress | None = None) -> int:
        total = 0
        target = self._app.max_notification_id()
        while consumed := self.run_once():
            total += consumed
            if progress is not None:
                progress(self.position, max(target, self.position))
        return total

    def wait_for(self, notification_id: int, timeout_s: float) -> bool:
        """Wait until the projection has passed ``notification_id``; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.position < notification_id:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def reset(self) -> None:
        """Drop every view row and reset the position, so a rebuild starts from event 1."""
        with self._engine.begin() as conn:
            for table in t.SUBJECT_TABLES:
                conn.execute(table.delete())
            conn.execute(
                t.projection_tracking.update()
                .where(
                    t.projection_tracking.c.projection_name.in_(
                        self._partitioning.names(self._projector.name)
                    )
                )
                .values(notification_id=0)
            )

    def rebuild(self, progress: Progress | None = None) -> int:
        """Reset every partition and replay the log into all of them (owned or not:
        the views were dropped for every subject)."""
        self.reset()
        total = 0
        target = self._app.max_notification_id()
        while consumed := sum(self._run_partition(k) for k in self._partitioning.all):
            total += consumed
            if progress is not None:
                progress(self.position, max(target, self.position))
        return total
