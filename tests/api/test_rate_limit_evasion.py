"""A key's allowance can be neither dodged nor spent by someone else (hostile callers,
round 5; held, kept as regression guards; SQLite and PostgreSQL, a live server).

The limit is keyed by the authenticated key id only (``uprof.api.deps.authenticate``):
no header the caller writes (``X-Forwarded-For``, ``X-Real-IP``, ``Forwarded``, the user
agent, the spelling of the bearer scheme) names another allowance, and a stranger who
knows a key's id (it is in the key's first characters, and in audit entries) but not its
secret is refused before anything is counted, so it cannot use up the key's allowance.
"""

from __future__ import annotations

import httpx

from tests.api.conftest import Apps, LiveServer, bearer
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server

LIMIT = 3
SPOOFS = [
    {"X-Forwarded-For": "203.0.113.7"},
    {"X-Real-IP": "198.51.100.9", "User-Agent": "other-client/1"},
    {"Forwarded": "for=192.0.2.60;proto=https", "X-Forwarded-For": "192.0.2.61"},
    {"X-Forwarded-For": "10.0.0.1, 10.0.0.2", "X-Client-IP": "10.0.0.3"},
]


def test_spoofed_headers_give_no_new_allowance_and_a_strangers_guesses_spend_none(
    kernel: Uprof, keys: ApiKeyStore, apps: Apps
) -> None:
    key_id = apps.planner.split("_")[1]
    forged = f"upk_{key_id}_{'A' * 43}"  # the key's id, a wrong secret
    with (
        LiveServer(create_server(kernel, keys, rate_limit=f"{LIMIT}/minute")) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        strangers = [
            http.post("/v1/consents/list", headers=bearer(forged), json={"subject": "a"})
            for _ in range(2 * LIMIT)
        ]
        # The key's own requests, each dressed as another client; the scheme in other cases
        # and blanks after the scheme name the same key.
        schemes = [
            {"Authorization": f"Bearer {apps.planner}"},
            {"Authorization": f"bearer {apps.planner}"},
            {"Authorization": f"BEARER  {apps.planner}"},
            {"Authorization": f"Bearer {apps.planner}"},
        ]
        own = [
            http.post(
                "/v1/consents/list",
                headers={**spoof, **scheme},
                json={"subject": "a"},
            ).status_code
            for spoof, scheme in zip(SPOOFS, schemes, strict=True)
        ]
        other_app = http.post(
            "/v1/consents/list", headers=bearer(apps.calendar), json={"subject": "a"}
        )
    assert [s.status_code for s in strangers] == [401] * (2 * LIMIT)
    # Served (404: no such subject for this app) until the allowance is spent, whatever
    # the headers said; the stranger's guesses spent none of it.
    assert own == [404] * LIMIT + [429], own
    assert other_app.status_code == 404, other_app.text  # another key's allowance is its own
