"""``ExternalProgress``: how long pending pipeline work has not moved, as a ``--no-worker``
server's readiness reports it (bug WA of 0232-review-of-0226-and-0231; bug WE of
XXXX-review-of-0232: moved means a worker's position moved)."""

from __future__ import annotations

from uprof.api.runtime import ExternalProgress
from uprof.kernel import Lag


def test_new_captures_are_not_progress_and_done_work_is() -> None:
    now = [100.0]
    progress = ExternalProgress(monotonic=lambda: now[0])
    assert progress.unmoved_s(Lag(3, 1, 3, worked_to=(0, 0))) == 0.0  # the first look
    now[0] += 5
    # Two more captures arrived; nothing was done: still unmoved.
    assert progress.unmoved_s(Lag(5, 3, 5, worked_to=(0, 0))) == 5.0
    now[0] += 2
    # A worker extracted and projected two events: moved.
    assert progress.unmoved_s(Lag(5, 1, 3, worked_to=(2, 2))) == 0.0
    now[0] += 3
    assert progress.unmoved_s(Lag(5, 1, 3, worked_to=(2, 2))) == 3.0
    # Caught up: 0, and the count starts again from there.
    assert progress.unmoved_s(Lag(5, 0, 0, worked_to=(5, 5))) == 0.0
    now[0] += 4
    assert progress.unmoved_s(Lag(6, 1, 1, worked_to=(5, 5))) == 0.0
    now[0] += 1
    assert progress.unmoved_s(Lag(6, 1, 1, worked_to=(5, 5))) == 1.0


def test_we_writes_that_are_no_capture_are_not_progress() -> None:
    """Bug WE, the contract: a consent or an erasure moves the log position and leaves
    what is pending to extract as it was; no worker position moved, so nothing did."""
    now = [100.0]
    progress = ExternalProgress(monotonic=lambda: now[0])
    assert progress.unmoved_s(Lag(3, 1, 3, worked_to=(0, 0))) == 0.0
    now[0] += 5
    assert progress.unmoved_s(Lag(4, 1, 4, worked_to=(0, 0))) == 5.0  # a consent
    now[0] += 5
    assert progress.unmoved_s(Lag(9, 1, 9, worked_to=(0, 0))) == 10.0  # an erasure's five
