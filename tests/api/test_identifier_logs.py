"""No identifier a caller sends reaches a log line, a span or a metric label (I9, issue 18).

Lines are collected at DEBUG from every logger, in the text format and in the JSON one
(``UPROF_LOG_FORMAT=json``); spans with the SDK's in-memory exporter.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.api.logconfig import DropQueryString, server_log_config
from uprof.logs import JsonFormatter

LOGGERS = (
    "",
    "uprof",
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "sqlalchemy",
    "casbin",
    "eventsourcing",
)


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.json_lines: list[str] = []
        self._json = JsonFormatter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(("httpx", "httpcore")):
            return  # the test's own HTTP client, not the server
        self.lines.append(self.format(record))
        self.json_lines.append(self._json.format(record))


@pytest.fixture
def logs() -> Iterator[Collect]:
    handler = Collect()
    saved = []
    for name in LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        for logger, level in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)


def test_identifiers_reach_no_log_line_and_no_metric_label(
    http: httpx.Client, apps: Apps, logs: Collect
) -> None:
    tag = uuid.uuid4().hex[:10]
    session, ref, ident, key = f"sess{tag}", f"ref{tag}", f"mail{tag}@x.org", f"idem{tag}"
    grant(http, apps.planner)
    body = {"subject": "alice", **interaction("I like tea", ref=ref), "session_id": session}
    assert (
        http.post(
            "/v1/captures", headers=bearer(apps.planner) | {"Idempotency-Key": key}, json=body
        ).status_code
        == 201
    )
    # Refusals and errors that concern the identifiers.
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner) | {"Idempotency-Key": key},
        json={**body, "user_input": "other"},
    )
    http.post(
        "/v1/slices",
        headers=bearer(apps.planner),
        json={
            "session_id": session,
            "query": "q",
            "budget_tokens": 64,
            "purpose": "personalization",
            "agent_id": "agent:one",
        },
    )
    http.post(
        "/v1/identifiers",
        headers=bearer(apps.planner),
        json={"identifier": ident, "subject": f"nobody{tag}"},
    )
    http.post(
        f"/v1/captures?session_id={session}",
        headers=bearer(apps.planner),
        json={"subject": f"nobody{tag}", **interaction("x", ref=ref)},
    )
    metrics = http.get("/metrics").text
    seen = "\n".join(logs.lines + logs.json_lines) + metrics
    assert logs.lines or metrics  # something was written
    for canary in (session, ref, ident, key, f"nobody{tag}"):
        assert canary not in seen, canary


def _span_dump(exporter: Any) -> tuple[set[str], str]:
    finished = exporter.get_finished_spans()
    return {s.name for s in finished}, "\n".join(s.to_json() for s in finished)


def test_canaries_reach_no_span_log_line_or_metric_through_capture_extract_slice_erase(
    spans: Any, http: httpx.Client, apps: Apps, logs: Collect
) -> None:
    tag = uuid.uuid4().hex[:10]
    text = f"zither{tag}"  # captured text, extracted into a memory and an intent
    subject = f"person{tag}@example.org"
    session, ref, key = f"sess{tag}", f"ref{tag}", f"idem{tag}"
    canaries = (text, subject, session, ref, key, tag)

    grant(http, apps.planner, subject=subject)
    captured = http.post(
        "/v1/captures",
        headers=bearer(apps.planner) | {"Idempotency-Key": key},
        json={
            "subject": subject,
            **interaction(f"I want to learn the {text}", ref=ref),
            "session_id": session,
        },
    )
    assert captured.status_code == 201, captured.text
    registered = http.post(
        "/v1/sessions",
        headers=bearer(apps.planner),
        json={"session_id": session, "subject": subject},
    )
    assert registered.status_code == 201, registered.text
    for who in ({"subject": subject}, {"session_id": session}):
        served = http.post(
            "/v1/slices",
            headers=bearer(apps.planner),
            json={
                **who,
                "query": f"what about the {text}?",
                "budget_tokens": 256,
                "purpose": "personalization",
                "agent_id": "agent:one",
            },
        )
        assert served.status_code == 200, served.text
        # The canary went all the way through: captured, extracted, projected, served.
        assert text in served.json()["text"]
    erased = http.post(
        "/v1/governance/erasures/subject", headers=bearer(apps.privacy), json={"subject": subject}
    )
    assert erased.status_code == 200, erased.text
    metrics = http.get("/metrics").text

    names, exported = _span_dump(spans)
    assert {
        "POST /v1/captures",
        "uprof.capture",
        "uprof.capture.group",
        "uprof.extraction.batch",
        "uprof.projection.batch",
        "uprof.slice",
        "uprof.erasure",
    } <= names
    assert logs.json_lines, "the server logged at DEBUG"
    for line in logs.json_lines:
        assert json.loads(line)["logger"]  # one JSON object per line
    where = {
        "spans": exported,
        "text logs": "\n".join(logs.lines),
        "JSON logs": "\n".join(logs.json_lines),
        "metrics": metrics,
    }
    for canary in canaries:
        for place, content in where.items():
            assert canary not in content, f"{canary!r} in the {place}"


def test_the_canary_check_finds_a_canary_that_is_there(spans: Any, logs: Collect) -> None:
    """The checks above can fail: a canary that reaches a span or a line is found."""
    from uprof import telemetry

    tag = uuid.uuid4().hex[:10]
    logging.getLogger("uprof.test").warning("leaked %s", tag)
    with telemetry.span("uprof.test", purpose=f"p{tag}"):
        pass
    _, exported = _span_dump(spans)
    assert tag in exported
    assert tag in "\n".join(logs.json_lines) and tag in "\n".join(logs.lines)


def test_access_log_drops_query_strings() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "POST", "/v1/captures?session_id=s1", "1.1", 201),
        None,
    )
    assert DropQueryString().filter(record)
    assert "s1" not in record.getMessage() and "/v1/captures" in record.getMessage()
    config = server_log_config()
    assert config["loggers"]["uvicorn.access"]["filters"] == ["drop_query"]
