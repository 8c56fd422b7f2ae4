"""Quarantined captures over REST: readiness and metrics count them, operator keys list
and retry them through the door, and a failing worker's readiness names the error's
class only (both backends).

``/readyz`` answers without a key. Before, a failing pipeline run put
``f"{type(error).__name__}: {error}"`` in its ``detail``, and an extractor's error message
may quote the capture it choked on (tests/kernel/poison.py's does): anyone who could
reach the probe read captured text. Now the detail names the class.
"""

from __future__ import annotations

import time

import httpx

from tests.api.conftest import Apps, bearer, grant, interaction
from tests.fakes.ports import FakeExtractor
from tests.kernel.poison import MARK, PoisonExtractor
from uprof.kernel import Uprof

SECRET = f"I live in {MARK}ville, passport X1234567"


def _ready_when(http: httpx.Client, check: object, timeout_s: float = 30.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while True:
        body: dict[str, object] = http.get("/readyz").json()
        if check(body) or time.monotonic() > deadline:  # type: ignore[operator]
            return body
        time.sleep(0.05)


def test_quarantined_captures_over_rest(http: httpx.Client, kernel: Uprof, apps: Apps) -> None:
    poisoned = PoisonExtractor(FakeExtractor())
    kernel.extraction._extractor = poisoned
    grant(http, apps.planner)
    ack = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction(SECRET)},
    )
    assert ack.status_code == 201
    capture_id = ack.json()["capture_id"]
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Oslo")},
    )
    ready = _ready_when(http, lambda b: b["quarantined"] == 1 and b["extraction_pending"] == 0)
    assert ready["ready"] is True and ready["quarantined"] == 1, ready
    assert "uprof_quarantined_captures 1.0" in http.get("/metrics").text

    assert http.get("/v1/quarantine", headers=bearer(apps.planner)).status_code == 403
    listed = http.get("/v1/quarantine", headers=bearer(apps.planner_operator))
    assert listed.status_code == 200, listed.text
    [held] = listed.json()["captures"]
    assert held["capture_id"] == capture_id and held["error"] == "PoisonError"
    assert MARK not in listed.text and "X1234567" not in listed.text

    retried = http.post(
        "/v1/quarantine/retry",
        headers=bearer(apps.planner_operator),
        json={"capture_ids": [capture_id]},
    )
    assert retried.json()["outcomes"] == [
        {"capture_id": capture_id, "outcome": "still-failing", "error": "PoisonError"}
    ]
    poisoned.poisoned = False
    retried = http.post(
        "/v1/quarantine/retry", headers=bearer(apps.planner_operator), json={"capture_ids": None}
    )
    assert [o["outcome"] for o in retried.json()["outcomes"]] == ["released"]
    assert _ready_when(http, lambda b: b["quarantined"] == 0)["quarantined"] == 0
    assert http.get("/v1/quarantine", headers=bearer(apps.planner_operator)).json() == {
        "captures": []
    }


def test_a_failing_worker_shows_readiness_the_error_class_only(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    def failing() -> int:
        raise RuntimeError(f"cannot project {SECRET!r}")

    real = kernel.projections.run_once
    kernel.projections.run_once = failing  # type: ignore[method-assign]
    try:
        grant(http, apps.planner)
        body = _ready_when(http, lambda b: b["worker"] == "failing")
        assert body["worker"] == "failing" and body["ready"] is False, body
        assert "RuntimeError" in str(body["detail"])
        assert MARK not in str(body) and "X1234567" not in str(body)
    finally:
        kernel.projections.run_once = real  # type: ignore[method-assign]
