"""A burst of one key's ``initialize`` requests cannot open more sessions than its cap
(review of 0117; both backends, a live server and several real client processes).

Decision 0117 capped a key's open MCP sessions (bug BP) by counting the SDK's record of
who opened each, and left "several ``initialize`` of one key at the same moment may each
pass the count once". That moment is long: the count is read before the SDK's bearer
check (a key read in a worker thread) and before the SDK registers the session, so every
request of a burst sent together passed the count while none was registered yet, and a
key could open as many sessions as it could send requests at once, the cap no bound at
all (found in review: 60 sent together by 3 processes opened 60 sessions with a cap of 5).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.api.conftest import PLANNER, LiveServer
from uprof.api import ApiKeyStore
from uprof.api.runtime import ServiceRuntime
from uprof.kernel import Uprof
from uprof.mcp import build_server
from uprof.mcp.server import http_app

CLIENT = Path(__file__).with_name("mcp_burst_client.py")
CAP = 5
PROCESSES = 3
EACH = 20


def test_a_burst_of_initialize_requests_opens_no_more_sessions_than_the_cap(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    hog = keys.create(PLANNER).token
    runtime = ServiceRuntime.for_kernel(kernel)
    server = build_server(runtime, keys)
    app = http_app(server, path="/mcp", max_sessions_per_key=CAP)
    runtime.start()
    try:
        with LiveServer(app) as live:
            url = f"{live.url}/mcp"
            # Several real processes, each sending its requests together.
            clients = [
                subprocess.Popen(
                    [sys.executable, str(CLIENT), url, hog, str(EACH)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(PROCESSES)
            ]
            answers = [json.loads(c.communicate(timeout=120)[0]) for c in clients]
            held = len(server.session_manager._session_owners)
    finally:
        runtime.stop()
    statuses: dict[str, int] = {}
    for answer in answers:
        for status, count in answer.items():
            statuses[status] = statuses.get(status, 0) + count
    assert sum(statuses.values()) == PROCESSES * EACH, statuses
    assert set(statuses) <= {"200", "429"}, statuses
    assert statuses.get("200", 0) <= CAP, statuses
    assert held <= CAP, (held, statuses)
    assert statuses.get("429", 0) >= PROCESSES * EACH - CAP, statuses
