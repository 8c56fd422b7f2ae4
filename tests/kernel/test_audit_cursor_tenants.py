"""A cursor is bound to its tenant: another tenant's app of the same name cannot use it.

Found in the attack review of 2026-12-05 (decision 0094's cursors carry the listing's bound):
tenants on shared stores share the deployment's cursor key, and a listing was bound to the
principal's kind and app id but not its tenant. Tenant B's ``app:planner`` could page with
the cursor tenant A's ``app:planner`` was given: B's listing then started at A's position and
stopped at A's bound, silently skipping B's own entries before that position (no entry of A
was shown: the tenant's scope held). Now the cursor is refused as any cursor issued to
another principal (422 naming ``cursor``). Both backends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.errors import InvalidInputError
from domain.principal import Principal, PrincipalKind
from tests.conftest import seed_policy_for
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from uprof.facade import Facade
from uprof.kernel import Uprof

ROLES = frozenset({"app", "operator"})


def test_another_tenants_cursor_is_refused(kernel: Uprof, tmp_path: Path) -> None:
    there = kernel.settings.model_copy(
        update={"tenant": "t2", "policy_path": seed_policy_for("t2", tmp_path)}
    )
    other = build_kernel(there, FakeClock())
    try:
        for i in range(6):
            kernel.audit.record("consent.granted", subject_ref=f"subj_a{i}")
            other.audit.record("consent.granted", subject_ref=f"subj_b{i}")
        here = Facade(
            kernel, Principal(kernel.settings.tenant, "app:planner", "k1", PrincipalKind.APP, ROLES)
        )
        there_door = Facade(other, Principal("t2", "app:planner", "k2", PrincipalKind.APP, ROLES))
        first = here.list_audit_entries(limit=3)
        assert first.next_cursor
        with pytest.raises(InvalidInputError) as refused:
            there_door.list_audit_entries(cursor=first.next_cursor, limit=50)
        assert refused.value.field == "cursor"
        # Each tenant's own walk is whole.
        assert here.list_audit_entries(cursor=first.next_cursor, limit=50).items
        own = there_door.list_audit_entries(action="consent.granted", limit=50).items
        assert [e.entry["subject_ref"] for e in own] == [f"subj_b{i}" for i in range(6)]
    finally:
        other.close()
