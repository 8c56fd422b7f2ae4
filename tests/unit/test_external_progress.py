"""``ExternalProgress``: how long pending pipeline work has not moved, as a ``--no-worker``
server's readiness reports it (bug WA of 0232-review-of-0226-and-0231; bugs WE and WG of
0236-review-of-0232: moved means a worker position with work pending moved)."""

from __future__ import annotations

from uprof.api.runtime import ExternalProgress
from uprof.kernel import Lag


def _lag(log: int, *worked_to: tuple[int, int]) -> Lag:
    """A lag of one extraction and one projection position: (position, pending) each."""
    extraction, projection = worked_to
    return Lag(log, extraction[1], projection[1], worked_to=worked_to)


def test_new_captures_are_not_progress_and_done_work_is() -> None:
    now = [100.0]
    progress = ExternalProgress(monotonic=lambda: now[0])
    assert progress.unmoved_s(_lag(3, (0, 1), (0, 3))) == 0.0  # the first look starts it
    now[0] += 5
    # Two more captures arrived; nothing was done: still unmoved.
    assert progress.unmoved_s(_lag(5, (0, 3), (0, 5))) == 5.0
    now[0] += 2
    # A worker extracted and projected two events: moved.
    assert progress.unmoved_s(_lag(5, (2, 1), (2, 3))) == 0.0
    now[0] += 3
    assert progress.unmoved_s(_lag(5, (2, 1), (2, 3))) == 3.0
    # Caught up: 0, and the count starts again from there.
    assert progress.unmoved_s(_lag(5, (5, 0), (5, 0))) == 0.0
    now[0] += 4
    assert progress.unmoved_s(_lag(6, (5, 1), (5, 1))) == 0.0
    now[0] += 1
    assert progress.unmoved_s(_lag(6, (5, 1), (5, 1))) == 1.0


def test_we_writes_that_are_no_capture_are_not_progress() -> None:
    """Bug WE, the contract: a consent or an erasure moves the log position and leaves
    what is pending to extract as it was; no worker position moved, so nothing did."""
    now = [100.0]
    progress = ExternalProgress(monotonic=lambda: now[0])
    assert progress.unmoved_s(_lag(3, (0, 1), (0, 3))) == 0.0
    now[0] += 5
    assert progress.unmoved_s(_lag(4, (0, 1), (0, 4))) == 5.0  # a consent
    now[0] += 5
    assert progress.unmoved_s(_lag(9, (0, 1), (0, 9))) == 10.0  # an erasure's five events


def test_wg_one_partitions_moves_do_not_hide_anothers_standstill() -> None:
    """Bug WG, the contract: two extraction partitions, partition 1's worker gone. The
    live partition moving (or having nothing pending) does not set the count back."""
    now = [100.0]
    progress = ExternalProgress(monotonic=lambda: now[0])

    def lag(live: tuple[int, int]) -> Lag:
        return Lag(9, live[1] + 1, 0, worked_to=(live, (0, 1)))

    assert progress.unmoved_s(lag((0, 2))) == 0.0
    now[0] += 5
    assert progress.unmoved_s(lag((4, 1))) == 5.0  # the live partition moved
    now[0] += 5
    assert progress.unmoved_s(lag((9, 0))) == 10.0  # and has nothing left
    now[0] += 1
    # The dead partition's worker is back and moves: counted from now on.
    assert progress.unmoved_s(Lag(9, 1, 0, worked_to=((9, 0), (3, 1)))) == 0.0
