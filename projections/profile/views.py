"""The view store on SQL: the projector writes the rows, the queries read them.

One object for the ``ViewStore`` port (``uprof.ports``): ``ProfileQueries`` plus
``apply_batch`` in a transaction of its own, and the position bookkeeping
``ProjectionRunner`` drives it with (partition positions created up front, the lowest
of them, a reset for rebuilds). The projector holds per-batch state, so one batch at a
time per store (the runner applies one at a time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from projections.profile import tables as t
from projections.profile.projector import ProfileProjector
from projections.profile.queries import ProfileQueries
from projections.profile.sealing import FieldSealer


class SqlViewStore(ProfileQueries):
    """Profile read models in one SQL database (SQLite or PostgreSQL)."""

    def __init__(self, engine: sa.Engine, sealer: FieldSealer, projector: ProfileProjector) -> None:
        super().__init__(engine, sealer)
        self.projector = projector

    @property
    def name(self) -> str:
        return self.projector.name

    def apply_batch(
        self,
        application_name: str,
        batch: Sequence[tuple[int, Any]],
        last_position: int,
        vectors: dict[str, bytes] | None = None,
        *,
        projection_name: str | None = None,
        read_after: int | None = None,
    ) -> int:
        """Apply (notification id, event) pairs and move the position in one transaction."""
        with self._engine.begin() as conn:
            return self.projector.apply_batch(
                conn,
                application_name,
                batch,
                last_position,
                vectors,
                projection_name=projection_name,
                read_after=read_after,
            )

    def ensure_positions(self, projection_names: Sequence[str], application_name: str) -> None:
        """Insert each missing position row at 0, one transaction per row."""
        tracking = t.projection_tracking
        for name in projection_names:
            try:
                with self._engine.begin() as conn:
                    exists = conn.execute(
                        sa.select(tracking.c.notification_id).where(
                            tracking.c.projection_name == name,
                            tracking.c.application_name == application_name,
                        )
                    ).first()
                    if exists is None:
                        conn.execute(
                            tracking.insert(),
                            {
                                "projection_name": name,
                                "application_name": application_name,
                                "notification_id": 0,
                            },
                        )
            except sa.exc.IntegrityError:
                pass  # another process created it between our select and insert

    def lowest_position(self, projection_names: Sequence[str], application_name: str) -> int:
        tracking = t.projection_tracking
        with self._engine.connect() as conn:
            low = conn.execute(
                sa.select(sa.func.min(tracking.c.notification_id)).where(
                    tracking.c.projection_name.in_(list(projection_names)),
                    tracking.c.application_name == application_name,
                )
            ).scalar()
        return int(low or 0)

    def reset(self, projection_names: Sequence[str]) -> None:
        """Empty the views and set the positions to 0, in one transaction.

        The position rows first: a batch locks its position row, then writes view rows,
        so the reset takes its locks in the same order. Deleting the rows first made a
        runner of another process that held its position row wait for a deleted row
        while the reset waited for the position row: PostgreSQL aborted one of them
        (DeadlockDetected), the rebuild or the server's batch (decision
        0108-rebuild-beside-live-traffic)."""
        with self._engine.begin() as conn:
            conn.execute(
                t.projection_tracking.update()
                .where(t.projection_tracking.c.projection_name.in_(list(projection_names)))
                .values(notification_id=0)
            )
            for table in t.SUBJECT_TABLES:
                conn.execute(table.delete())
