"""A worker decides each capture by its subject's tenant's policy (found by the review of
decisions 0097 and 0101, 2026-12-05).

Tenants on one set of stores share the event log, and a worker extracts every tenant's
captures (decision 0101 relies on it). What a capture may become is bounded by the
capturing app's ``capture`` rights (``bootstrap.capture_permits``). They were decided for
the worker's tenant (``settings.tenant``) by the worker's authorizer, which holds only its
own tenant's policy stream, so whichever tenant's worker reached a capture first decided:
a narrower policy of the worker's tenant dropped the other tenant's items, a wider one
let a capture yield categories its own tenant's policy withholds from that app. Now the
worker reads the subject's tenant from the subject index (one read per batch) and
decides with that tenant's policy stream in the shared policy store. Both backends; both
tests fail on 3640e66.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, other_tenant, say, settings_for
from tests.kernel.test_erased_items_not_reborn import SAIL, items_of
from uprof.settings import Settings


def without_capture_of(folder: Path, name: str, *categories: str) -> Path:
    """The seed policy without ``app:planner``'s assistants' right to capture these."""
    seed = Settings().policy_path.read_text(encoding="utf-8")
    path = folder / name
    path.write_text(
        "\n".join(
            line
            for line in seed.splitlines()
            if not any(f", capture, {c}," in line for c in categories)
        ),
        encoding="utf-8",
    )
    return path


def extracted_first_by_the_default_tenant(
    mine: Settings, other: Settings, clock: FakeClock
) -> dict[str, list[str]]:
    kernel = build_kernel(other, clock)
    try:
        consent(kernel)
        kernel.capture("alice", say(SAIL))
    finally:
        kernel.close()
    # The default tenant's worker, a process of its own, gets there first.
    worker = PythonChild(
        textwrap.dedent(
            f"""
            from pathlib import Path
            from tests.fakes.ports import FakeClock
            from tests.kernel.conftest import build_kernel
            from uprof.settings import Settings

            settings = Settings.model_validate_json({mine.model_dump_json()!r})
            kernel = build_kernel(settings, FakeClock())
            try:
                kernel.process()
            finally:
                kernel.close()
            """
        )
    )
    _, err = worker.communicate(180)
    assert worker.returncode == 0, err[-3000:]
    kernel = build_kernel(other, clock)
    try:
        kernel.process()
        return items_of(kernel)
    finally:
        kernel.close()


def test_a_narrower_policy_of_the_workers_tenant_drops_nothing_of_another(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    narrow = without_capture_of(tmp_path, "narrow.csv", "location", "goal")
    mine = settings_for(backend).model_copy(update={"policy_path": narrow})
    found = extracted_first_by_the_default_tenant(mine, other_tenant(mine, tmp_path), clock)
    assert found["attribute"] == ["home_location=Paris"]
    assert found["intent"] == ["learn to sail"]


def test_a_wider_policy_of_the_workers_tenant_adds_nothing_to_another(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    mine = settings_for(backend)
    narrow = without_capture_of(tmp_path, "narrow.csv", "location", "goal")
    theirs = other_tenant(mine, tmp_path, seed=narrow)
    found = extracted_first_by_the_default_tenant(mine, theirs, clock)
    assert found["attribute"] == [] and found["intent"] == []
    assert found["memory"] == [SAIL]
