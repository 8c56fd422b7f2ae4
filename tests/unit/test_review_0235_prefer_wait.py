"""Review of 0235-key-checks-around-the-locks (decision 0244-review-of-0235-to-0242),
held: ``Prefer: wait`` edge values. A value that is no whole number of seconds is ignored
(RFC 7240, as documented in the header's description); 0 leaves the least bound; a huge
one (400 digits, read as infinity) leaves the server's own. Every wait a request takes
from it stays finite and within the server's bound, so no timeout overflows."""

from __future__ import annotations

import math
import threading

import pytest

from domain.under_lock import CHECK_UNDER_LOCK_WITHIN_S
from uprof.api.deps import client_waits, preferred_wait_s
from uprof.recorders import CHECK_LEAST_WITHIN_S, key_check_within_s
from uprof.services.idempotency import client_wait_left

IGNORED = ["wait=-1", "wait=1.5", "wait=abc", "wait=", "wait=1e3", "wait=\u0661", "wait"]


@pytest.mark.parametrize("prefer", IGNORED)
def test_held_a_wait_that_is_no_whole_number_is_ignored(prefer: str) -> None:
    assert preferred_wait_s(prefer) is None
    with client_waits(prefer):
        assert client_wait_left() is None
        assert key_check_within_s() == CHECK_UNDER_LOCK_WITHIN_S


@pytest.mark.parametrize(
    ("prefer", "bound"),
    [
        ("wait=0", CHECK_LEAST_WITHIN_S),
        ("respond-async, wait=1", 1.0),
        ("wait=" + "9" * 400, CHECK_UNDER_LOCK_WITHIN_S),
        ('wait="3"', CHECK_UNDER_LOCK_WITHIN_S),
    ],
)
def test_held_every_wait_taken_from_prefer_is_finite_and_bounded(prefer: str, bound: float) -> None:
    with client_waits(prefer):
        within = key_check_within_s()
        assert math.isfinite(within)
        assert CHECK_LEAST_WITHIN_S <= within <= bound
        threading.Event().wait(min(within, 0.01))  # a timeout the thread library takes
