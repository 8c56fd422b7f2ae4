"""A key over its rate limit gets ONE uncounted DELETE per session it opened, not one for
every DELETE the SDK refuses (review of 0138, bug HO; both backends, live server).

Round 7 (bug HI) let a DELETE of a session the key opened and still holds through
uncounted, "one at a time per session", and said the exemption buys "at most one
uncounted request per session the key opened". One at a time is not once: a DELETE the
SDK refuses without ending the session (a forged ``Host``, refused 421 and logged as a
warning; an ``MCP-Protocol-Version`` of the sessionless revision, routed where a DELETE
is 405) leaves the session held, so the next such DELETE was uncounted too, and the
next: a key over its allowance was served without limit, and wrote a log line per
request, what round 6 (bug FU) had closed for every other request. Now the first DELETE
of a session spends its exemption whatever the SDK answers; every later one is counted.
"""

from __future__ import annotations

import logging

import httpx

from tests.api.conftest import PLANNER, LiveServer, bearer
from tests.api.mcp_messages import HELLO, MODERN, POST_JSON, rpc
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app

#: Requests sent over the allowance, each of a kind the SDK refuses without ending the session.
ATTEMPTS = 6


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _open(client: httpx.Client, url: str, own: dict[str, str]) -> dict[str, str]:
    opened = client.post(url, json=HELLO, headers=own)
    assert opened.status_code == 200, opened.text[:200]
    session = {**own, "mcp-session-id": opened.headers["mcp-session-id"]}
    done = client.post(url, content=rpc("notifications/initialized"), headers=session)
    assert done.status_code == 202, done.text[:200]
    return session


def test_a_refused_delete_of_an_own_session_spends_its_one_uncounted_request(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """``4/minute``: two sessions opened (4 requests), the allowance is spent. Six DELETEs
    of the first with a forged ``Host``, and six of the second naming the sessionless
    revision: the SDK ends neither session; only the first of each is served (not
    counted), the other five of each are 429 ``rate_limited``, and the SDK's log has one
    refused-Host line, not six."""
    planner = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, keys, rate_limit="4/minute")
    app = http_app(server, path="/mcp", max_sessions_per_key=2)
    owners = server.session_manager._session_owners
    kept = _Kept()
    logger = logging.getLogger("mcp.server.transport_security")
    logger.addHandler(kept)
    logger.setLevel(logging.WARNING)
    runtime.start()
    try:
        with LiveServer(app) as live, httpx.Client(timeout=30) as client:
            url = f"{live.url}/mcp"
            own = {**POST_JSON, **bearer(planner)}
            first, second = _open(client, url, own), _open(client, url, own)
            forged = [
                client.delete(url, headers={**first, "Host": "evil.example"})
                for _ in range(ATTEMPTS)
            ]
            modern = [
                client.delete(url, headers={**second, "MCP-Protocol-Version": MODERN})
                for _ in range(ATTEMPTS)
            ]
            held = {first["mcp-session-id"], second["mcp-session-id"]} <= set(owners)
    finally:
        runtime.stop()
        logger.removeHandler(kept)
    assert held, "the SDK ended a session it refused to end"
    for name, answers in (("forged Host", forged), ("sessionless revision", modern)):
        statuses = [r.status_code for r in answers]
        assert statuses[0] != 429, (name, statuses)
        assert statuses[1:] == [429] * (ATTEMPTS - 1), (name, statuses)
        for refused in answers[1:]:
            assert refused.json()["error"]["code"] == "rate_limited", (name, refused.text[:200])
    assert len(kept.lines) == 1, kept.lines


def test_the_record_of_spent_exemptions_stays_bounded(keys: ApiKeyStore) -> None:
    """10,000 sessions opened, ended with their one uncounted DELETE and forgotten by the
    SDK, one at a time: the record of spent exemptions is pruned as it goes, and a session
    still held keeps its record (a second DELETE of it is counted)."""
    from typing import Any

    from uprof.mcp.server import KeyCountedMiddleware

    owners: dict[str, Any] = {"held": {"subject": "k1"}}
    counted = KeyCountedMiddleware(None, keys, None, owners)  # type: ignore[arg-type]

    def delete(session_id: str) -> dict[str, Any]:
        return {
            "type": "http",
            "method": "DELETE",
            "headers": [(b"mcp-session-id", session_id.encode())],
        }

    assert counted._own_session_ended("k1", delete("held"))
    for n in range(10_000):
        owners[f"s{n}"] = {"subject": "k1"}
        assert counted._own_session_ended("k1", delete(f"s{n}"))
        assert not counted._own_session_ended("k1", delete(f"s{n}"))
        del owners[f"s{n}"]  # the SDK forgets the ended session
    assert len(counted._spent) <= 2 * len(owners) + 64, len(counted._spent)
    assert not counted._own_session_ended("k1", delete("held"))
    assert not counted._own_session_ended("k2", delete("held"))
