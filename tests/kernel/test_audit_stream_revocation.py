"""An audit export being read stops when its reader's `audit` right is taken away.

The policy decided an export once, before its first byte, and the stream then sent the
whole trail however long it was read for. Reproduced with two processes (2026-12-04): a
`uprof serve` streaming `POST /v1/audit/export` to an operator key, `uprof policy revoke`
of the operators' `audit` rule in a CLI process after 50 records: the open stream sent the
remaining 4,962 records, while a new export was refused (403). The door now asks again every
`STREAM_RECHECK_RECORDS` records.
"""

from __future__ import annotations

import pytest

from domain.errors import PermissionDeniedError
from domain.principal import Principal
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from uprof.facade import STREAM_RECHECK_RECORDS, Facade

OPERATOR = Principal.local_operator("default")
ENTRIES = 3 * STREAM_RECHECK_RECORDS


def test_an_open_export_stops_once_the_audit_right_is_revoked_elsewhere(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend).model_copy(update={"policy_refresh_s": 0.0})
    serving = build_kernel(settings, clock)
    other = build_kernel(settings, clock)  # another process: the CLI
    try:
        serving.audit.record_many(
            [("access.denied", {"app_id": "app:x", "reason_code": "read"})] * ENTRIES
        )
        records = iter(Facade(serving, OPERATOR).stream_audit().records)
        sent = [next(records) for _ in range(10)]
        other.policy_revoke(
            requested_by="operator:local#cli",
            role="role:operator",
            actions=["audit"],
            categories=["any"],
            purpose="compliance",
        )
        with pytest.raises(PermissionDeniedError):
            sent.extend(records)
        denied = list(serving.audit_entries(action="access.denied"))
    finally:
        other.close()
        serving.close()

    assert len(sent) == STREAM_RECHECK_RECORDS  # not one record past the next check
    assert len(denied) == ENTRIES + 1  # the refusal is audited
