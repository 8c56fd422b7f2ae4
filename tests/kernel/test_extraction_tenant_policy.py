"""Found by the review of decisions 0097 and 0101 (2026-12-05), left: a worker decides
another tenant's captures with its own tenant's policy.

Tenants on one set of stores share the event log, and a worker extracts every tenant's
captures (decision 0101 relies on it). What a capture may become is bounded by the
capturing app's ``capture`` rights (``bootstrap.capture_permits``), decided for the
worker's tenant (``settings.tenant``) by the worker's authorizer, which holds only its own
tenant's policy stream. Whichever tenant's worker reaches a capture first decides: here the
default tenant's policy lets ``app:planner`` capture neither locations nor goals, the other
tenant's lets it capture both, and the other tenant's subject loses its attribute and
intent (the opposite policies would let a capture yield categories its tenant's policy
withholds). Closing it needs the worker to decide with the subject's tenant's policy (an
authorizer per tenant met, over the shared policy store). Both backends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, other_tenant, say, settings_for
from tests.kernel.test_erased_items_not_reborn import SAIL, items_of
from uprof.settings import Settings


@pytest.mark.xfail(
    strict=True,
    reason="left: the worker decides another tenant's captures with its own tenant's policy",
)
def test_another_tenants_worker_extracts_by_the_subjects_tenants_policy(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    seed = Settings().policy_path.read_text(encoding="utf-8")
    narrow = tmp_path / "seed-default.csv"
    narrow.write_text(
        "\n".join(
            line
            for line in seed.splitlines()
            if ", capture, location," not in line and ", capture, goal," not in line
        ),
        encoding="utf-8",
    )
    mine = settings_for(backend).model_copy(update={"policy_path": narrow})
    other = other_tenant(mine, tmp_path)
    kernel = build_kernel(other, clock)
    try:
        consent(kernel)
        kernel.capture("alice", say(SAIL))
    finally:
        kernel.close()
    kernel = build_kernel(mine, clock)  # the default tenant's worker gets there first
    try:
        kernel.process()
    finally:
        kernel.close()
    kernel = build_kernel(other, clock)
    try:
        kernel.process()
        found = items_of(kernel)
        assert found["attribute"] == ["home_location=Paris"]
        assert found["intent"] == ["learn to sail"]
    finally:
        kernel.close()
