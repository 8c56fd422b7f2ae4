"""Requests per API key, limited by the `limits` library: 429 with ``Retry-After``.

One limiter per server process, keyed by the authenticated key id (never by an id the
request states, and never by IP: many apps may share a gateway). The counters live in
the process's memory, so with N server processes a key gets up to N times the rate;
docs/api.md says so. Off unless configured (``UPROF_RATE_LIMIT`` or ``uprof serve
--rate-limit``), in the `limits` notation: ``"50/second"``, ``"50/second;1000/minute"``.
"""

from __future__ import annotations

import math
import time

from limits import RateLimitItem
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from uprof.api.errors import EdgeError
from uprof.settings import parse_rate_limit


class RateLimitedError(EdgeError):
    """429: the key used up its allowance; ``retry_after_s`` says when to come back."""

    def __init__(self, limit: RateLimitItem, retry_after_s: int) -> None:
        super().__init__(
            429,
            "rate_limited",
            f"this API key is over its limit of {limit}",
            hint=f"retry after {retry_after_s} s (header Retry-After)",
        )
        self.retry_after_s = retry_after_s


class KeyRateLimiter:
    """Moving-window limits per API key id (a key over any one of them is refused)."""

    def __init__(self, spec: str) -> None:
        self._items = parse_rate_limit(spec)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def check(self, key_id: str) -> None:
        """Count one request for ``key_id``, or raise ``RateLimitedError``."""
        for item in self._items:
            if not self._limiter.hit(item, key_id):
                reset_at = self._limiter.get_window_stats(item, key_id).reset_time
                raise RateLimitedError(item, max(1, math.ceil(reset_at - time.time())))
