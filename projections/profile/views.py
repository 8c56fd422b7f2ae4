"""The view store on SQL: the projector writes the rows, the queries read them.

One object for the ``ViewStore`` port (``uprof.ports``): ``ProfileQueries`` plus
``apply_batch`` in a transaction of its own. ``ProjectionRunner`` drives the same
projector with its own transactions (partitioned positions, read-ahead embeddings).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from projections.profile.projector import ProfileProjector
from projections.profile.queries import ProfileQueries
from projections.profile.sealing import FieldSealer


class SqlViewStore(ProfileQueries):
    """Profile read models in one SQL database (SQLite or PostgreSQL)."""

    def __init__(self, engine: sa.Engine, sealer: FieldSealer, projector: ProfileProjector) -> None:
        super().__init__(engine, sealer)
        self.projector = projector

    def apply_batch(
        self,
        application_name: str,
        batch: Sequence[tuple[int, Any]],
        last_position: int,
        vectors: dict[str, bytes] | None = None,
        *,
        projection_name: str | None = None,
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
            )
