"""Drive the read-model projections: catch up, report lag, wait, rebuild."""

from __future__ import annotations

import time
from collections.abc import Callable

import sqlalchemy as sa

from projections.profile import tables as t
from projections.profile.projector import ProfileProjector
from uprof.eventstore import ProfilesApplication

Progress = Callable[[int, int], None]


class ProjectionRunner:
    """Catch-up loop over the profiles log (SQLite has no notification channel)."""

    def __init__(
        self,
        app: ProfilesApplication,
        engine: sa.Engine,
        projector: ProfileProjector,
        batch_size: int = 256,
    ) -> None:
        self._app = app
        self._engine = engine
        self._projector = projector
        self._batch_size = batch_size
        self._ensure_position_row()

    def _ensure_position_row(self) -> None:
        """Create the position row up front: batches lock it, so it must always exist."""
        tracking = t.projection_tracking
        try:
            with self._engine.begin() as conn:
                exists = conn.execute(
                    sa.select(tracking.c.notification_id).where(
                        tracking.c.projection_name == self._projector.name,
                        tracking.c.application_name == self._app.name,
                    )
                ).first()
                if exists is None:
                    conn.execute(
                        tracking.insert(),
                        {
                            "projection_name": self._projector.name,
                            "application_name": self._app.name,
                            "notification_id": 0,
                        },
                    )
        except sa.exc.IntegrityError:
            pass  # another process created it first

    @property
    def position(self) -> int:
        with self._engine.connect() as conn:
            return self._projector.position(conn, self._app.name)

    def lag(self) -> int:
        """Notifications recorded but not yet projected."""
        return max(0, self._app.max_notification_id() - self.position)

    def run_once(self) -> int:
        """Project one batch; returns how many notifications it consumed."""
        start = self.position
        notifications = self._app.notifications_after(start, self._batch_size)
        if not notifications:
            return 0
        events = [(n.id, self._app.decode(n)) for n in notifications]
        # Embed outside the write transaction: the model is the slow part, and the
        # views database should not be locked while it runs.
        vectors = self._projector.embed_memories([e for _, e in events])
        with self._engine.begin() as conn:
            self._projector.apply_batch(
                conn, self._app.name, events, notifications[-1].id, vectors=vectors
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
                .where(t.projection_tracking.c.projection_name == self._projector.name)
                .values(notification_id=0)
            )

    def rebuild(self, progress: Progress | None = None) -> int:
        self.reset()
        return self.run_until_idle(progress)
