"""I9 under load: subjects erased while captures and slices run in other threads."""

from __future__ import annotations

import pytest

from benchmarks.reliability import (
    ERASURE_ATTEMPTS,
    Target,
    erase_as_a_client_does,
    erasure_scenario,
)
from domain.errors import ErasureIncompleteError
from uprof.kernel import Lag


def test_erasure_under_load_leaves_no_residue(target: Target) -> None:
    r = erasure_scenario(target, erased=3, writers=2, readers=2, seconds=3.0)
    assert r["receipts_verified"] == 3, r["lag_when_incomplete"]
    assert r["residue_findings"] == 0
    assert r["streams_checked"] == 3
    assert r["unexpected_errors"] == 0, r["error_samples"]
    assert r["concurrent_captures"] > 0 and r["concurrent_slices"] > 0
    assert r["concurrent_captures_lost"] == 0
    assert r["bystanders_unchanged"], r["bystander_tables_changed"]
    assert r["rebuild_equals_live"]


class _SlowProjections:
    """A kernel whose erasures stay incomplete ``incomplete_times`` times, lag shrinking."""

    def __init__(self, incomplete_times: int) -> None:
        self.left = incomplete_times
        self.asked = 0

    def erase_subject(self, subject: str) -> str:
        self.asked += 1
        if self.left:
            self.left -= 1
            raise ErasureIncompleteError("projections behind")
        return f"receipt for {subject}"

    def lag(self) -> Lag:
        return Lag(log_position=100, extraction_pending=0, projection_pending=10 * self.left)


def test_an_incomplete_erasure_is_asked_again_as_its_error_tells_a_client() -> None:
    kernel = _SlowProjections(incomplete_times=ERASURE_ATTEMPTS - 1)
    seen: list[dict[str, int]] = []
    assert erase_as_a_client_does(kernel, "v", seen) == "receipt for v"  # type: ignore[arg-type]
    assert kernel.asked == ERASURE_ATTEMPTS
    assert [s["attempt"] for s in seen] == list(range(1, ERASURE_ATTEMPTS))
    assert seen[0]["projection_pending"] > seen[-1]["projection_pending"]


def test_an_erasure_incomplete_at_every_attempt_raises_with_the_lags_seen() -> None:
    kernel = _SlowProjections(incomplete_times=ERASURE_ATTEMPTS)
    with pytest.raises(ErasureIncompleteError, match=f"after {ERASURE_ATTEMPTS} attempts"):
        erase_as_a_client_does(kernel, "v", [])  # type: ignore[arg-type]
    assert kernel.asked == ERASURE_ATTEMPTS
