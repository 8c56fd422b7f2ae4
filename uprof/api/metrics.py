"""Prometheus metrics of one app, with prometheus-client on a registry of its own.

The library's global default registry is the kind of import-time state STYLE §4 warns
about (two apps in one process would share series), so each ``Metrics`` owns a
``CollectorRegistry``.

Series:

- ``uprof_http_requests_total{method,route,status}``: counter;
- ``uprof_http_request_duration_seconds{method,route}``: histogram;
- ``uprof_projection_lag_events{stage}`` and ``uprof_log_position``: gauges read at scrape time;
- ``uprof_pipeline_failures_total``: counter of failed background pipeline runs.
- ``uprof_late_capture_check_failures_total`` and ``uprof_late_captures_unchecked_total``:
  counters of the extraction worker's failed checks of captures against the audit log
  (each tried again) and of captures it dropped unchecked (decision 0101).

Labels are route templates (``/v1/slices``), never raw paths, so nothing a caller
sends (and no subject reference) becomes a label; a method outside the standard set is
counted as ``OTHER``. The series set is bounded by routes × methods × statuses.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Latency buckets in seconds: a slice should land in the low milliseconds.
BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

#: Methods counted under their own name; anything else a caller sends is "OTHER".
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

#: The media type of ``Metrics.render``'s output.
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """Request counters and latency histograms of one app, plus collectors read on demand."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "uprof_http_requests",
            "HTTP requests answered, by route and status.",
            ("method", "route", "status"),
            registry=self.registry,
        )
        self._latency = Histogram(
            "uprof_http_request_duration_seconds",
            "Time to answer an HTTP request.",
            ("method", "route"),
            buckets=BUCKETS_S,
            registry=self.registry,
        )

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in KNOWN_METHODS else "OTHER"
        self._requests.labels(method, route, str(status)).inc()
        self._latency.labels(method, route).observe(seconds)

    def add_collector(self, collector: Collector) -> None:
        """Register a collector whose series are computed at scrape time."""
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


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
