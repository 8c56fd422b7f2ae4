"""A privacy-center or console session opens the pages of the tenant it was signed in to
only (hostile callers round 7, bug HJ; both backends, two tenants on the same stores).

Session cookies are signed with a key derived from the deployment's master secret, which
every tenant on shared stores shares (as the cursor key: decision 0095), and named no
tenant. A cookie signed in on tenant A's server was a valid cookie on tenant B's. What
refused it there was a second check only: the session's API key (the console's own, the
privacy link's issuer) must be live *in B*. A key issued before keys named their tenant
(``tenant`` NULL, kept working in every tenant until replaced: docs/security.md) is live
in both, so a data subject of tenant A who signed in with a link such a key issued could
replay the cookie on tenant B's server and act there as the subject of the same name:
while B knows no subject by that name, the incarnation check passes ("the name stands
for none") and B's privacy center served its pages and recorded the consents it was given,
creating the subject in B. The data subject of one tenant is nobody in another; a
session now names its tenant in its signature, and another tenant's cookie is no
session (401, as a forged one).

With keys of the tenants' own (the normal case) a console or privacy cookie replayed on
another tenant's server was already refused (the key is unknown there):
``tests/web/test_web_attacks_round_3.py``.
"""

from __future__ import annotations

import re

import httpx

from tests.api.conftest import PLANNER, LiveServer, bearer, grant
from uprof.api import ApiKeyStore
from uprof.apikeys.tables import api_keys
from uprof.kernel import Uprof
from uprof.server import create_server
from uprof.web.pages import USER_COOKIE


def _legacy(keys: ApiKeyStore, app_id: str, roles: list[str]) -> str:
    """A key as the tenant migration leaves one issued before it (tenant NULL)."""
    issued = keys.create(app_id, roles)
    with keys._engine.begin() as conn:
        conn.execute(
            api_keys.update().where(api_keys.c.key_id == issued.info.key_id).values(tenant=None)
        )
    return issued.token


def _signed_in(client: httpx.Client, operator: str, subject: str) -> str:
    issued = client.post("/v1/privacy/links", headers=bearer(operator), json={"subject": subject})
    assert issued.status_code == 201, issued.text
    token = issued.json()["token"]
    signed = client.post("/privacy/login", data={"token": token}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    return str(signed.cookies[USER_COOKIE])


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


def test_a_privacy_session_of_one_tenant_is_no_session_in_another(
    kernel: Uprof, keys: ApiKeyStore, other: tuple[Uprof, ApiKeyStore]
) -> None:
    other_kernel, other_keys = other
    operator = _legacy(keys, "app:privacy-desk", ["app", "operator"])
    with LiveServer(create_server(kernel, keys)) as here:
        with httpx.Client(base_url=here.url, timeout=60) as http:
            grant(http, _legacy(keys, PLANNER, ["app"]), subject="dora")
            cookie = _signed_in(http, operator, "dora")
            own = http.get("/privacy", cookies={USER_COOKIE: cookie})
    with (
        LiveServer(create_server(other_kernel, other_keys)) as there,
        httpx.Client(base_url=there.url, timeout=60) as elsewhere,
    ):
        page = elsewhere.get("/privacy", cookies={USER_COOKIE: cookie})
        csrf = _csrf(own.text)  # the session's own token, as any page of it shows
        granted = elsewhere.post(
            "/privacy/consents/grant",
            cookies={USER_COOKIE: cookie},
            data={"csrf": csrf, "app_id": PLANNER, "category": "*", "purpose": "personalization"},
            follow_redirects=False,
        )
    assert own.status_code == 200, own.text[:300]
    assert page.status_code == 401, page.text[:300]
    assert granted.status_code == 401, granted.text[:300]
    assert not other_kernel.subject_exists("dora"), "a subject of A created in B"
