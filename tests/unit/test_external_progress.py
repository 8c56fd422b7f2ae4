"""``ExternalProgress``: how long pending pipeline work has not moved, as a ``--no-worker``
server's readiness reports it (bug WA of 0232-review-of-0226-and-0231)."""

from __future__ import annotations

from uprof.api.runtime import ExternalProgress
from uprof.kernel import Lag


def test_new_captures_are_not_progress_and_done_work_is() -> None:
    now = [100.0]
    progress = ExternalProgress(monotonic=lambda: now[0])
    assert progress.unmoved_s(Lag(3, 1, 3)) == 0.0  # the first look starts the count
    now[0] += 5
    # Two more captures arrived; nothing was done: still unmoved.
    assert progress.unmoved_s(Lag(5, 3, 5)) == 5.0
    now[0] += 2
    # A worker extracted and projected two events: moved.
    assert progress.unmoved_s(Lag(5, 1, 3)) == 0.0
    now[0] += 3
    assert progress.unmoved_s(Lag(5, 1, 3)) == 3.0
    # Caught up: 0, and the count starts again from there.
    assert progress.unmoved_s(Lag(5, 0, 0)) == 0.0
    now[0] += 4
    assert progress.unmoved_s(Lag(6, 1, 1)) == 0.0
    now[0] += 1
    assert progress.unmoved_s(Lag(6, 1, 1)) == 1.0
