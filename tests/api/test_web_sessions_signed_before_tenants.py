"""A session cookie another tenant signed before sessions named their tenant opens
nothing on the default tenant either (review of 0138, bug HQ; both backends, two tenants
on the same stores).

Round 7 (bug HJ) put the tenant in the session signature's salt, except for the default
tenant, whose salt stayed the one every tenant signed with before, "so its sessions
survive the upgrade". Every other tenant's cookie of before the upgrade was signed with
that same salt: for the hour such a cookie lives, it was a valid session on the default
tenant's server, and with a key issued before keys named their tenant (live in every
tenant) it did there what HJ's test shows it doing across tenants: the default tenant,
knowing no subject of that name, served its privacy center and recorded a consent,
creating the subject. Now every tenant signs with its own salt, the default one too (the
default tenant's sessions are signed out once, at the upgrade).
"""

from __future__ import annotations

import httpx
from itsdangerous import URLSafeTimedSerializer

from tests.api.conftest import PLANNER, LiveServer, grant
from tests.api.test_web_sessions_per_tenant import _csrf, _legacy, _signed_in
from tests.conftest import OTHER_TENANT
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.web.pages import USER_COOKIE

#: How every server signed a session before round 7 (and the default tenant's after it).
BEFORE = "uprof.web.session/1"


def test_a_cookie_of_another_tenant_signed_before_the_upgrade_is_no_session_here(
    kernel: Uprof, keys: ApiKeyStore, other: tuple[Uprof, ApiKeyStore]
) -> None:
    other_kernel, other_keys = other
    operator = _legacy(other_keys, "app:privacy-desk", ["app", "operator"])
    with LiveServer(create_server(other_kernel, other_keys)) as there:
        with httpx.Client(base_url=there.url, timeout=60) as http:
            grant(http, _legacy(other_keys, PLANNER, ["app"]), subject="erin")
            cookie = _signed_in(http, operator, "erin")
            own = http.get("/privacy", cookies={USER_COOKIE: cookie})
    # The same session as the other tenant's server signed it before the upgrade.
    secret = other_kernel.web_session_key
    fields = URLSafeTimedSerializer(secret, salt=f"{BEFORE}/tenant/{OTHER_TENANT}").loads(cookie)
    before = URLSafeTimedSerializer(secret, salt=BEFORE).dumps(fields)
    assert kernel.subjects.tenant == "default"
    with (
        LiveServer(create_server(kernel, keys)) as here,
        httpx.Client(base_url=here.url, timeout=60) as elsewhere,
    ):
        page = elsewhere.get("/privacy", cookies={USER_COOKIE: before})
        granted = elsewhere.post(
            "/privacy/consents/grant",
            cookies={USER_COOKIE: before},
            data={
                "csrf": _csrf(own.text),
                "app_id": PLANNER,
                "category": "*",
                "purpose": "personalization",
            },
            follow_redirects=False,
        )
    assert own.status_code == 200, own.text[:300]
    assert (page.status_code, granted.status_code) == (401, 401), (
        granted.headers.get("location"),
        page.text[:300],
    )
    assert not kernel.subject_exists("erin"), "a subject of another tenant created here"
