"""Review of decision 0105 (2026-12-05): a worker that already decided another tenant's
captures keeps that tenant's authorizer; a change that tenant's own process makes to its
policy afterwards must decide the worker's next extraction of its captures, as a change
to the worker's own tenant's policy does (decision 0064). The change is made by a real
process of the other tenant; both backends."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, other_tenant, say, settings_for
from tests.kernel.test_erased_items_not_reborn import items_of
from uprof.settings import Settings


def revoked_elsewhere(theirs: Settings) -> None:
    child = PythonChild(
        textwrap.dedent(
            f"""
            from tests.fakes.ports import FakeClock
            from tests.kernel.conftest import build_kernel
            from uprof.settings import Settings

            settings = Settings.model_validate_json({theirs.model_dump_json()!r})
            kernel = build_kernel(settings, FakeClock())
            try:
                kernel.policy.revoke(
                    requested_by="operator:test",
                    role="role:assistant",
                    actions=["capture"],
                    categories=["location"],
                    purpose="personalization",
                )
            finally:
                kernel.close()
            """
        )
    )
    _, err = child.communicate(180)
    assert child.returncode == 0, err[-3000:]


def test_a_policy_change_of_another_tenant_decides_the_workers_next_batch(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    mine = settings_for(backend)
    theirs = other_tenant(mine, tmp_path)
    kernel = build_kernel(theirs, clock)
    try:
        consent(kernel, "alice")
        consent(kernel, "bob")
        kernel.capture("alice", say("I live in Paris"))
    finally:
        kernel.close()
    worker = build_kernel(mine, clock)  # the default tenant's worker
    try:
        worker.process()  # meets the other tenant: builds its authorizer
        assert worker.extraction.lag() == 0
        revoked_elsewhere(theirs)
        kernel = build_kernel(theirs, clock)
        try:
            kernel.capture("bob", say("I live in Lyon"))
        finally:
            kernel.close()
        worker.process()
        assert worker.extraction.lag() == 0  # the worker extracted bob's capture
    finally:
        worker.close()
    kernel = build_kernel(theirs, clock)
    try:
        kernel.process()
        assert items_of(kernel, "alice")["attribute"] == ["home_location=Paris"]
        assert items_of(kernel, "bob")["attribute"] == []
        assert items_of(kernel, "bob")["memory"] == ["I live in Lyon"]
    finally:
        kernel.close()
