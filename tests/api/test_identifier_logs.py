"""No identifier a caller sends reaches a log line or a metric label (I9)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.api.logconfig import DropQueryString, server_log_config

LOGGERS = ("", "uprof", "uvicorn", "uvicorn.error", "uvicorn.access", "sqlalchemy", "casbin")


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(("httpx", "httpcore")):
            return  # the test's own HTTP client, not the server
        self.lines.append(self.format(record))


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
    seen = "\n".join(logs.lines) + metrics
    assert logs.lines or metrics  # something was written
    for canary in (session, ref, ident, key, f"nobody{tag}"):
        assert canary not in seen, canary


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
