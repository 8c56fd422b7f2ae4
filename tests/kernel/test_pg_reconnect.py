"""A PostgreSQL connection the server ended (a restart, an administrator's terminate) is
replaced on its next checkout, not handed to the next query.

The engines check each pooled connection out with a ping (``pool_pre_ping``): this test
is what any cheaper setting has to pass (decision 0044-start-cost kept the ping).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.conftest import Backend, _admin
from tests.kernel.conftest import consent
from uprof.apikeys.store import ApiKeyStore
from uprof.kernel import Uprof


def _terminate_other_connections(database: str) -> int:
    with _admin().connect() as conn:
        ended = conn.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = :db AND pid <> pg_backend_pid()"
            ),
            {"db": database},
        ).scalar_one()
    return int(ended)


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_pooled_connections_ended_by_the_server_are_replaced(
    backend: Backend, kernel: Uprof
) -> None:
    consent(kernel)
    size = kernel.audit_log.size()
    keys = ApiKeyStore.open(kernel.settings)
    try:
        token = keys.create("app:planner").token
        assert _terminate_other_connections(backend.pg_dbname) > 0
        # The views engine (audit log) and the key store's engine each hand out a pooled
        # connection whose server process is gone.
        assert kernel.audit_log.size() == size
        assert keys.authenticate(token) is not None
    finally:
        keys.close()
