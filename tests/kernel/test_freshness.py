"""Freshness is surfaced wherever a read waits (I7): 503 ``read_timeout``, never stale views.

A deployment with background workers waits for them, bounded. Here the workers are not
running (as when they are stuck or down), so every wait runs out: a whole-view read must
refuse with ReadTimeoutError instead of showing a profile without the newest writes, and a
slice must say ``fresh: false``. Once the writes are processed, the same reads answer.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from domain.errors import ReadTimeoutError
from domain.values import ProposalBatch
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consent, say, settings_for
from uprof.api.errors import classify
from uprof.kernel import Uprof


def _slice(kernel: Uprof):
    return kernel.slice(
        "alice",
        "where do I live",
        budget_tokens=256,
        purpose="personalization",
        app_id=APP,
        agent_id="agent:one",
    )


@pytest.fixture
def stalled(backend: Backend, clock: FakeClock) -> Iterator[Uprof]:
    """A kernel that relies on background workers that never run."""
    settings = settings_for(backend).model_copy(
        update={"background_workers": True, "read_wait_timeout_s": 0.2}
    )
    k = build_kernel(settings, clock)
    try:
        yield k
    finally:
        k.close()


def test_whole_view_reads_refuse_when_the_views_are_behind(stalled: Uprof) -> None:
    consent(stalled)
    stalled.capture("alice", say("I live in Porto"))
    with pytest.raises(ReadTimeoutError, match="read_wait_timeout_s"):
        stalled.profile("alice")
    with pytest.raises(ReadTimeoutError):
        stalled.evidence("alice", "no-such-item")
    with pytest.raises(ReadTimeoutError):
        stalled.submit_proposals(
            "alice", ProposalBatch(proposals=(), author=APP, owner_agent="agent:one")
        )
    with pytest.raises(ReadTimeoutError):
        stalled.item_reads("alice")
    # A slice is still served, and says it could not wait for the newest write.
    assert _slice(stalled).fresh is False
    # Maintenance does its job and says the views do not show it yet.
    assert stalled.run_maintenance()["views_caught_up"] == 0


def test_the_same_reads_answer_once_the_views_caught_up(stalled: Uprof) -> None:
    consent(stalled)
    stalled.capture("alice", say("I live in Porto"))
    stalled.process()  # what the workers would have done
    assert stalled.profile("alice") is not None
    assert stalled.item_reads("alice") == []
    assert _slice(stalled).fresh is True


def test_read_timeout_is_a_503_with_its_code() -> None:
    assert classify(ReadTimeoutError("behind")) == (503, "read_timeout")
