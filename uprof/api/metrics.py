"""Prometheus metrics, written out by hand in the text exposition format (version 0.0.4).

Why not prometheus-client: a handful of series is all the service needs, and its
global default registry is the kind of import-time state STYLE §4 warns about. Here
one ``Metrics`` object belongs to one app.

Series:

- ``uprof_http_requests_total{method,route,status}``: counter;
- ``uprof_http_request_duration_seconds{method,route}``: histogram;
- ``uprof_projection_lag_events{stage}`` and ``uprof_log_position``: gauges read at scrape time;
- ``uprof_pipeline_failures_total``: counter of failed background pipeline runs.

Labels are route templates (``/v1/slices``), never raw paths, so nothing a caller
sends (and no subject reference) becomes a label; a method outside the standard set is
counted as ``OTHER``. The series set is bounded by routes × methods × statuses.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Latency buckets in seconds: a slice should land in the low milliseconds.
BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS_S))
    total: int = 0
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        index = bisect.bisect_left(BUCKETS_S, seconds)
        if index < len(BUCKETS_S):
            self.counts[index] += 1
        self.total += 1
        self.sum_s += seconds


#: Methods counted under their own name; anything else a caller sends is "OTHER".
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


class Metrics:
    """Request counters and latency histograms of one app, plus gauges read on demand."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str], int] = {}
        self._latency: dict[tuple[str, str], _Histogram] = {}
        self._gauges: list[Callable[[], list[str]]] = []

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in KNOWN_METHODS else "OTHER"
        with self._lock:
            key = (method, route, str(status))
            self._requests[key] = self._requests.get(key, 0) + 1
            self._latency.setdefault((method, route), _Histogram()).observe(seconds)

    def add_collector(self, collect: Callable[[], list[str]]) -> None:
        """Register a function returning exposition lines computed at scrape time."""
        self._gauges.append(collect)

    def render(self) -> str:
        lines = [
            "# HELP uprof_http_requests_total HTTP requests answered, by route and status.",
            "# TYPE uprof_http_requests_total counter",
        ]
        with self._lock:
            requests = sorted(self._requests.items())
            latency = sorted(
                (k, _Histogram(list(h.counts), h.total, h.sum_s)) for k, h in self._latency.items()
            )
        for (method, route, status), count in requests:
            lines.append(
                f"uprof_http_requests_total{_labels(method=method, route=route, status=status)} "
                f"{count}"
            )
        lines += [
            "# HELP uprof_http_request_duration_seconds Time to answer an HTTP request.",
            "# TYPE uprof_http_request_duration_seconds histogram",
        ]
        for (method, route), hist in latency:
            cumulative = 0
            for bound, count in zip(BUCKETS_S, hist.counts, strict=True):
                cumulative += count
                labels = _labels(method=method, route=route, le=repr(bound))
                lines.append(f"uprof_http_request_duration_seconds_bucket{labels} {cumulative}")
            labels = _labels(method=method, route=route, le="+Inf")
            lines.append(f"uprof_http_request_duration_seconds_bucket{labels} {hist.total}")
            base = _labels(method=method, route=route)
            lines.append(f"uprof_http_request_duration_seconds_sum{base} {hist.sum_s:.6f}")
            lines.append(f"uprof_http_request_duration_seconds_count{base} {hist.total}")
        for collect in self._gauges:
            lines.extend(collect())
        return "\n".join(lines) + "\n"


class MetricsMiddleware:
    """Time every HTTP request and count it under its route template."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = scope.get("route")
            # Unmatched paths share one label, so scanners cannot grow the series set.
            template = getattr(route, "path", None) or "<unmatched>"
            self.metrics.observe(scope["method"], template, status, time.perf_counter() - began)
