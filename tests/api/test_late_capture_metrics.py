"""A failing check of extracted captures against the audit log is seen in ``/metrics``
and the server's pipeline is not failing for it (decision 0101; both backends).

Before, the check's driver error went up through the background pipeline run: the run
failed (``uprof_pipeline_failures_total`` rose, readiness said the worker was failing,
nothing was projected after the batch) and no series said it was the check.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import Apps, api_settings, bearer, grant, interaction
from tests.conftest import Backend
from uprof.kernel import Uprof
from uprof.settings import Settings


@pytest.fixture
def settings(backend: Backend) -> Settings:
    return api_settings(backend, background=True).model_copy(update={"late_capture_check_s": 0})


def metric(text: str, name: str) -> float:
    (line,) = [x for x in text.splitlines() if x.startswith(f"{name} ")]
    return float(line.split()[1])


def test_a_failing_check_is_counted_and_the_pipeline_goes_on(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    late = kernel.extraction._late
    assert late is not None
    calls = 0

    def failing(*_a: Any, **_k: Any) -> Any:
        nonlocal calls
        calls += 1
        raise sa.exc.OperationalError("SELECT", {}, Exception("the audit store went away"))

    late._log.holding = failing  # type: ignore[method-assign]
    grant(http, apps.planner)
    ack = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Oslo")},
    )
    assert ack.status_code == 201, ack.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready = http.get("/readyz").json()
        if calls and ready["extraction_pending"] == 0 and ready["projection_pending"] == 0:
            break
        time.sleep(0.05)
    assert calls >= 1
    text = http.get("/metrics").text
    assert metric(text, "uprof_pipeline_failures_total") == 0
    assert metric(text, "uprof_late_capture_check_failures_total") == calls
    assert metric(text, "uprof_late_captures_unchecked_total") == 0
    assert ready["ready"] is True, ready
