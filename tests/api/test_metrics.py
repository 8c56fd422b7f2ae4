"""Metrics: each app counts on a registry of its own; labels stay bounded."""

from __future__ import annotations

import prometheus_client

from uprof.api.metrics import Metrics


def test_two_apps_in_one_process_do_not_share_series() -> None:
    first, second = Metrics(), Metrics()
    first.observe("GET", "/healthz", 200, 0.002)
    assert b'route="/healthz",status="200"} 1.0' in first.render()
    assert b"/healthz" not in second.render()
    assert b"uprof_http" not in prometheus_client.generate_latest()  # not the global one


def test_unknown_methods_share_one_label() -> None:
    metrics = Metrics()
    for method in ("BREW", "PROPFIND", "X" * 40):
        metrics.observe(method, "<unmatched>", 405, 0.001)
    text = metrics.render().decode()
    assert 'uprof_http_requests_total{method="OTHER",route="<unmatched>",status="405"} 3.0' in text
    assert "BREW" not in text and "PROPFIND" not in text
