"""Web sessions signed out, for every server of a deployment and across restarts.

A web session is a signed cookie (``uprof.web.state``): any server of the deployment
accepts it until its hour is over. Signing out used to be remembered in the memory of the
server that did it, so a copy of the signed-out cookie (a shared computer, a stolen
cookie) still worked on the other servers, and on that one after a restart. Sign-outs are
now rows in the data stores (``views`` branch), read by every server: a session id
(random; it names the session, it is not a credential and names no one) and when the
cookie would have expired anyway, after which the row is useless and deleted. A restore
from a backup keeps the live rows (``uprof.services.backup``): the backup's views were
copied before them, and a session signed out since must stay signed out.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from domain.naming import NAMING_CONVENTION

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

signed_out_sessions = sa.Table(
    "signed_out_sessions",
    metadata,
    sa.Column("session_id", sa.String(64), primary_key=True),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False, index=True),
)


class SignOuts:
    """The deployment's record of signed-out web sessions."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def sign_out(self, session_id: str, *, until: datetime, now: datetime) -> None:
        """Record that ``session_id`` is signed out (its cookie would expire at ``until``);
        rows of sessions expired by ``now`` go."""
        with self._engine.begin() as conn:
            conn.execute(signed_out_sessions.delete().where(signed_out_sessions.c.expires_at < now))
        try:
            with self._engine.begin() as conn:
                conn.execute(
                    signed_out_sessions.insert().values(session_id=session_id, expires_at=until)
                )
        except IntegrityError:
            pass  # signed out already (another server, a double click): it stays so

    def in_force(self, now: datetime) -> list[tuple[str, datetime]]:
        """The sign-outs whose cookies have not expired by ``now``: (session id, until).
        None in stores not yet migrated (an empty deployment a restore fills)."""
        with self._engine.connect() as conn:
            if not sa.inspect(conn).has_table(signed_out_sessions.name):
                return []
            rows = conn.execute(
                sa.select(signed_out_sessions.c.session_id, signed_out_sessions.c.expires_at)
                .where(signed_out_sessions.c.expires_at >= now)
                .order_by(signed_out_sessions.c.session_id)
            ).all()
        return [(str(r.session_id), r.expires_at) for r in rows]

    def keep(self, sign_outs: list[tuple[str, datetime]], *, now: datetime) -> None:
        """Record ``sign_outs`` (``in_force`` of other stores) again; those already here
        stay as they are. A restore keeps the live stores' sign-outs this way: the views
        it brings back were copied before them."""
        for session_id, until in sign_outs:
            self.sign_out(session_id, until=until, now=now)

    def is_signed_out(self, session_id: str) -> bool:
        with self._engine.connect() as conn:
            found = conn.execute(
                sa.select(signed_out_sessions.c.session_id).where(
                    signed_out_sessions.c.session_id == session_id
                )
            ).first()
        return found is not None
