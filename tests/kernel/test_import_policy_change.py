"""A running import follows the policy as another process changes it (SQLite and PostgreSQL).

An import decides the policy per (app, purpose) and, until 2026-12-04, kept that answer for
the whole run: `uprof policy revoke` taking an app's `capture` right away in another
process did not reach an import of that app's records already running, which went on
capturing to its end (reproduced with two CLI processes: 100,000 records, every one
captured, the last 14 s (SQLite) and 19 s (PostgreSQL) of them after the revoke had
committed). An allowed (app, purpose) is now decided again for every chunk of records; a
refusal stands for the rest of the run (it is audited once).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from domain.principal import Principal
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consent, settings_for
from uprof.facade import Facade
from uprof.services.importer import CHUNK

OPERATOR = Principal.local_operator("default")
AFTER = 10


def _record(i: int) -> str:
    return json.dumps(
        {
            "subject": "alice",
            "app_id": APP,
            "agent_id": "agent:import",
            "user_input": f"imported line {i}",
            "occurred_at": "2025-01-01T09:00:00Z",
            "purpose": "personalization",
            "sharing": "shared",
        }
    )


def test_a_capture_right_revoked_by_another_process_stops_a_running_import(
    backend: Backend, clock: FakeClock
) -> None:
    # No refresh interval: the test does not wait out the policy's staleness bound.
    settings = settings_for(backend).model_copy(update={"policy_refresh_s": 0.0})
    importing = build_kernel(settings, clock)
    other = build_kernel(settings, clock)  # another process on the same stores
    try:
        consent(importing)

        def lines() -> Iterator[str]:
            for i in range(CHUNK):
                yield _record(i)
            # The first chunk has been imported; now another process takes the role
            # that lets the app capture.
            other.policy_revoke(
                requested_by="operator:local#cli", app_id=APP, role="role:assistant"
            )
            for i in range(CHUNK, CHUNK + AFTER):
                yield _record(i)

        report = Facade(importing, OPERATOR).import_interactions(lines())
    finally:
        other.close()
        importing.close()

    assert report.captured == CHUNK
    assert len(report.failed) == AFTER
    assert {p.field for p in report.failed} == {"app_id"}
