"""OpenTelemetry spans (issue 18): the trees an operator sees, on both backends.

A REST capture: the request's server span, ``uprof.capture`` under it, and the capture
writer's ``uprof.capture.group`` (linked to the capture, since a group serves many
requests) with its three commits as children. The server's worker: an extraction batch
and a projection batch with their steps. A slice: gate, rank and pack under it.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, bearer, grant, interaction
from uprof import telemetry

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _by_name(exporter: Any, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _children(exporter: Any, parent: Any) -> dict[str, Any]:
    return {
        s.name: s
        for s in exporter.get_finished_spans()
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    }


def _wait_for(exporter: Any, name: str, timeout_s: float = 15.0) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while not (found := _by_name(exporter, name)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def _slice(http: httpx.Client, key: str, query: str = "what do I want to do?") -> httpx.Response:
    return http.post(
        "/v1/slices",
        headers=bearer(key),
        json={
            "subject": "alice",
            "query": query,
            "budget_tokens": 200,
            "purpose": "personalization",
            "agent_id": "agent:one",
        },
    )


def test_a_rest_capture_is_a_request_span_a_capture_and_a_group_commit(
    spans: Any, http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner)
    parent = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"
    answer = http.post(
        "/v1/captures",
        headers=bearer(apps.planner) | {"traceparent": parent},
        json={"subject": "alice", **interaction("I live in Lisbon")},
    )
    assert answer.status_code == 201, answer.text

    (request,) = _wait_for(spans, "POST /v1/captures")
    # The caller's trace goes on inside uprof.
    assert f"{request.context.trace_id:032x}" == CALLER_TRACE
    assert request.attributes["http.route"] == "/v1/captures"
    assert request.attributes["http.response.status_code"] == 201
    capture = _children(spans, request)["uprof.capture"]
    assert capture.attributes["uprof.captures"] == 1
    assert capture.attributes["uprof.outcome"] == "written"

    groups = [
        g
        for g in _wait_for(spans, "uprof.capture.group")
        if any(link.context.span_id == capture.context.span_id for link in g.links)
    ]
    assert len(groups) == 1, "the group that committed the capture links to it"
    group = groups[0]
    assert group.attributes["uprof.outcome"] == "committed"
    assert group.attributes["uprof.captures"] >= 1
    commits = _children(spans, group)
    assert set(commits) == {
        "uprof.capture.commit.keys",
        "uprof.capture.commit.events",
        "uprof.capture.commit.audit",
    }
    keys, events, audit = (
        commits[f"uprof.capture.commit.{n}"] for n in ("keys", "events", "audit")
    )
    # Keys, then events, then the audit entry (decision 0017), inside the group's span.
    assert group.start_time <= keys.start_time <= keys.end_time <= events.start_time
    assert events.end_time <= audit.start_time <= audit.end_time <= group.end_time


def test_the_worker_traces_an_extraction_batch_and_a_projection_batch(
    spans: Any, http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner)
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    )
    assert _slice(http, apps.planner).status_code == 200

    deadline = time.monotonic() + 60
    while not (extraction := _saved_batches(spans)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert extraction, "a batch that extracted the capture"
    batch = extraction[0]
    assert batch.parent is None  # a worker batch starts its own trace
    assert batch.attributes["uprof.partition"] == 0
    assert batch.attributes["uprof.proposals"] >= 2  # the memory and the home_location
    steps = _children(spans, batch)
    assert set(steps) == {"uprof.extraction.extract", "uprof.extraction.save"}
    assert steps["uprof.extraction.extract"].attributes["uprof.captures"] == 1

    projection = _wait_for(spans, "uprof.projection.batch")
    assert projection and all(p.attributes["uprof.notifications"] >= 1 for p in projection)
    assert set(_children(spans, projection[0])) == {
        "uprof.projection.embed",
        "uprof.projection.apply",
    }


def _saved_batches(exporter: Any) -> list[Any]:
    """Extraction batches that extracted a capture and saved (not an attempt that lost a
    race with the slice's read record and was redone: those end in error)."""
    return [
        b
        for b in _by_name(exporter, "uprof.extraction.batch")
        if b.attributes["uprof.captures"] and "uprof.error" not in b.attributes
    ]


def test_a_slice_span_holds_gate_rank_and_pack(spans: Any, http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to learn the cello")},
    )
    answer = _slice(http, apps.planner)
    assert answer.status_code == 200, answer.text
    served = answer.json()

    (request,) = _wait_for(spans, "POST /v1/slices")
    sliced = _children(spans, request)["uprof.slice"]
    assert sliced.attributes["uprof.purpose"] == "personalization"
    assert sliced.attributes["uprof.budget_tokens"] == 200
    assert sliced.attributes["uprof.items"] == len(served["items"]) >= 1
    assert sliced.attributes["uprof.n_tokens"] == served["n_tokens"]
    steps = _children(spans, sliced)
    assert {"uprof.slice.wait", "uprof.slice.gate", "uprof.slice.rank", "uprof.slice.pack"} <= set(
        steps
    )
    gate, rank, pack = (steps[f"uprof.slice.{n}"] for n in ("gate", "rank", "pack"))
    assert gate.end_time <= rank.start_time <= rank.end_time <= pack.start_time
    assert pack.attributes["uprof.items"] == len(served["items"])


def test_a_refused_request_is_an_error_span_named_by_class_only(
    spans: Any, http: httpx.Client, apps: Apps
) -> None:
    # No consent: the capture is refused, and its message names the app.
    answer = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    )
    assert answer.status_code == 403
    (capture,) = _wait_for(spans, "uprof.capture")
    assert capture.attributes["uprof.outcome"] == "error"
    assert capture.attributes["uprof.error"] == "ConsentRequiredError"
    assert capture.status.description == "ConsentRequiredError"
    assert not capture.events  # no exception event: its message could quote data


def test_span_attributes_outside_the_allowed_set_are_refused(spans: Any) -> None:
    with pytest.raises(telemetry.TelemetryError, match="subject"):
        telemetry.span("uprof.test", subject="alice")
    with pytest.raises(telemetry.TelemetryError, match="number"):
        telemetry.span("uprof.test", captures="I live in Lisbon")
    with pytest.raises(telemetry.TelemetryError, match="label"):
        telemetry.span("uprof.test", purpose="x" * 65)
    with telemetry.span("uprof.test", captures=2, purpose="personalization") as traced:
        with pytest.raises(telemetry.TelemetryError):
            traced.set(text="I live in Lisbon")
    (done,) = _by_name(spans, "uprof.test")
    assert dict(done.attributes) == {"uprof.captures": 2, "uprof.purpose": "personalization"}


def test_tracing_off_hands_out_one_span_that_does_nothing() -> None:
    assert not telemetry.enabled()
    first = telemetry.span("uprof.test", captures=1)
    assert first is telemetry.span("uprof.other") is telemetry.NO_SPAN
    with first as traced:
        traced.set(anything="is ignored when off")
    assert telemetry.current_ids() is None
