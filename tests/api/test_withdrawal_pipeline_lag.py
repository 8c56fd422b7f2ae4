"""A consent withdrawal takes effect for the next request whatever the pipeline's lag.

The server here runs no pipeline worker (``uprof serve --no-worker`` whose ``uprof
worker`` processes are down, or a worker kept busy): extraction and projections stand
still. Until 2026-12-04 a withdrawal read the consent from the views first and waited for
them, so it answered 503 ``read_timeout`` and withdrew nothing, while the app's captures
under that consent went on being accepted; an app could also keep the worker busy with
captures of the subject to hold a withdrawal off (reproduced with two real processes,
docs/decisions). The withdrawal is a write to the subject's stream and needs no view.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest
from mcp import Client

from tests.api.conftest import PLANNER, Apps, api_settings, bearer, grant, interaction
from tests.conftest import Backend
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import Principal
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.settings import Settings

WAIT_S = 1.0


@pytest.fixture
def settings(backend: Backend) -> Settings:
    """A server whose pipeline does not run: every view stays where it is."""
    return api_settings(backend, background=True).model_copy(
        update={"run_worker": False, "read_wait_timeout_s": WAIT_S}
    )


def _capture(http: httpx.Client, key: str, text: str) -> httpx.Response:
    return http.post(
        "/v1/captures", headers=bearer(key), json={"subject": "alice", **interaction(text)}
    )


def test_an_app_withdraws_its_consent_while_the_pipeline_stands_still(
    http: httpx.Client, apps: Apps
) -> None:
    consent_id = grant(http, apps.planner)
    assert _capture(http, apps.planner, "I am vegetarian").status_code == 201

    withdrawn = http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.planner),
        json={"subject": "alice", "consent_id": consent_id},
    )

    assert withdrawn.status_code == 200, withdrawn.text
    consent = withdrawn.json()["consent"]
    assert consent["consent_id"] == consent_id and consent["withdrawn_at"] is not None
    # The next capture and read under it are refused, with the views still behind.
    refused = _capture(http, apps.planner, "I like green tea")
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "consent_required"
    read = http.post(
        "/v1/slices",
        headers=bearer(apps.planner),
        json={
            "subject": "alice",
            "query": "food",
            "budget_tokens": 256,
            "purpose": "personalization",
            "agent_id": "agent:one",
        },
    )
    assert read.status_code == 404, read.text  # it holds no consent of alice any more


def test_another_apps_consent_id_is_still_not_found_and_withdraws_nothing(
    http: httpx.Client, apps: Apps
) -> None:
    """The stream-side lookup serves only the asking app's own consents in force."""
    planner_consent = grant(http, apps.planner)
    grant(http, apps.calendar, categories=("conversation",), purposes=("scheduling",))
    answer = http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.calendar),
        json={"subject": "alice", "consent_id": planner_consent},
    )
    assert answer.status_code in (404, 503), answer.text  # never 200: not its consent
    assert _capture(http, apps.planner, "I am vegetarian").status_code == 201


def test_mcp_forget_withdraws_while_the_pipeline_stands_still(kernel: Uprof) -> None:
    """The MCP ``forget`` tool (every consent of the app) takes the same path."""
    runtime = ServiceRuntime.for_kernel(kernel)
    runtime.start()
    server = build_server(runtime, stdio_principal=Principal(PLANNER, "k", frozenset({"app"})))
    consent_id = kernel.grant_consent(
        "alice", app_id=PLANNER, categories=["*"], purposes=["personalization"]
    )
    capture = {
        "subject": "alice",
        "agent_id": "agent:one",
        "user_input": "I am vegetarian",
        "occurred_at": "2025-01-01T09:00:00+00:00",
        "purpose": "personalization",
        "sharing": "shared",
    }

    async def scenario() -> tuple[Any, Any, Any]:
        async with Client(server) as client:
            first = await client.call_tool("capture", capture)
            forgot = await client.call_tool("forget", {"subject": "alice"})
            again = await client.call_tool("capture", capture)
            return first, forgot, again

    try:
        first, forgot, again = asyncio.run(scenario())
    finally:
        runtime.stop()
    assert not first.is_error
    assert not forgot.is_error, forgot.content
    withdrawn = json.loads(forgot.content[0].text)["withdrawn"]
    assert [c["consent_id"] for c in withdrawn] == [consent_id]
    assert withdrawn[0]["withdrawn_at"] is not None
    assert again.is_error and json.loads(again.content[0].text)["error"]["code"] == (
        "consent_required"
    )


def test_a_user_withdraws_in_the_privacy_center_while_the_pipeline_stands_still(
    http: httpx.Client, apps: Apps
) -> None:
    """The privacy center checked that the consent was the user's own in the consents
    view before withdrawing it: with the pipeline stalled, the user got an error page
    and the app's captures went on being accepted."""
    consent_id = grant(http, apps.planner)
    assert _capture(http, apps.planner, "I am vegetarian").status_code == 201
    token = http.post(
        "/v1/privacy/links", headers=bearer(apps.planner_operator), json={"subject": "alice"}
    ).json()["token"]
    http.post("/privacy/login", data={"token": token})  # the session cookie stays in the client
    # The profile page itself waits for the views (it shows them); the erasure page holds
    # the form's CSRF token too.
    page = http.get("/privacy/erase")
    assert page.status_code == 200, page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None, page.text
    withdrawn = http.post(
        "/privacy/consents/withdraw",
        data={"csrf": csrf.group(1), "consent_id": consent_id},
        follow_redirects=False,
    )
    assert withdrawn.status_code == 303, withdrawn.text
    assert withdrawn.headers["location"] == "/privacy?notice=withdrawn"
    assert _capture(http, apps.planner, "I moved to Porto").status_code == 403
