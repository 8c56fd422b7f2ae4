"""Rate limits at the edges: 429 with ``Retry-After``.

Every limit of a deployment goes through ``KeyRateLimiter`` here: ``UPROF_RATE_LIMIT`` per
authenticated API key id (REST, MCP and the console share one allowance per key; never
an id the request states, never an IP: many apps may share a gateway), and
``UPROF_PRIVACY_RATE_LIMIT`` per privacy-center session (``uprof.web.pages``). The
counters are in the deployment's database (``Uprof.rate_limiter``, decision
0115-shared-rate-limits): every server process counts against the same allowance, and a
restart keeps it. When the counters cannot be read the request is refused with a 503
(``RateLimitUnavailableError``), never let through uncounted. Off unless configured, in
the `limits` notation: ``"50/second"``, ``"50/second;1000/minute"``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from limits import RateLimitItem

from uprof.api.errors import EdgeError

if TYPE_CHECKING:
    from uprof.kernel import Uprof

#: The namespace of API keys' buckets (REST, MCP and console pages alike).
API_KEYS = "api-key"
#: The namespace of privacy-center sessions' buckets (keyed by the link that opened them).
PRIVACY_LINKS = "privacy-link"


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
    """Moving-window limits per key of one namespace (a key over any one is refused)."""

    def __init__(self, kernel: Uprof, spec: str, namespace: str = API_KEYS) -> None:
        self._limiter = kernel.rate_limiter(spec, namespace)

    def check(self, key: str) -> None:
        """Count one request for ``key``, or raise ``RateLimitedError`` (over a limit) or
        ``RateLimitUnavailableError`` (the counters did not answer)."""
        refusal = self._limiter.check(key)
        if refusal is not None:
            raise RateLimitedError(refusal.limit, max(1, math.ceil(refusal.retry_after_s)))


def limiter_for(
    kernel: Uprof, spec: str | None, namespace: str = API_KEYS
) -> KeyRateLimiter | None:
    """The limiter of ``spec`` over the deployment's counters (None: no limit)."""
    return KeyRateLimiter(kernel, spec, namespace) if spec else None
