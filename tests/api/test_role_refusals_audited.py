"""Every refusal at the door is audited: a key without the operator role, over REST.

Until this test, a policy denial wrote ``access.denied`` (docs/security.md, "Audit
entries name who asked") but a route refused for a missing role (403 ``role_required``)
wrote nothing, so the trail did not show an app probing the operator routes. Each
operator-only route is asked once by an app key; each refusal writes exactly one
``access.denied`` naming the key's principal, and nothing else. Both backends.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, bearer
from uprof.kernel import Uprof

#: Every REST route that needs the operator role, with a body its schema accepts (the
#: role is checked after the body is read: a 422 would come first).
OPERATOR_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/profile/read", {"subject": "alice"}),
    ("POST", "/v1/evidence/read", {"subject": "alice", "item_id": "item-1"}),
    ("POST", "/v1/memories/list", {"subject": "alice"}),
    ("POST", "/v1/subjects/list", {}),
    ("POST", "/v1/audit/export", {}),
    ("POST", "/v1/audit/entries", {}),
    ("POST", "/v1/audit/receipts", {}),
    ("POST", "/v1/audit/proof", {"old_size": 1}),
    ("POST", "/v1/audit/verify", {"content": "{}"}),
    ("GET", "/v1/quarantine", None),
    ("POST", "/v1/quarantine/retry", {}),
    ("GET", "/v1/policy", None),
    ("GET", "/v1/policy/history", None),
    ("POST", "/v1/policy/grant", {}),
    ("POST", "/v1/policy/revoke", {}),
    (
        "POST",
        "/v1/policy/onboard",
        {"app_id": "app:newcomer", "read": ["preferences"], "purpose": "personalization"},
    ),
    ("POST", "/v1/privacy/links", {"subject": "alice"}),
]


@pytest.mark.parametrize(("method", "path", "body"), OPERATOR_ROUTES, ids=lambda v: str(v))
def test_a_key_without_the_operator_role_is_refused_and_audited(
    http: httpx.Client,
    apps: Apps,
    kernel: Uprof,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    before = kernel.audit_log.size()
    response = http.request(method, path, headers=bearer(apps.planner), json=body)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "role_required"

    written = [e.entry for e in kernel.audit_log.entries()][before:]
    assert len(written) == 1, written  # the refusal, and nothing else
    (entry,) = written
    assert entry["action"] == "access.denied"
    assert entry["reason_code"] == "role-required"
    assert entry["rule"] == "operator"
    assert entry["app_id"] == "app:planner"
    assert entry["principal"].startswith("app:planner#")


def test_an_operator_key_is_not_refused(http: httpx.Client, apps: Apps, kernel: Uprof) -> None:
    before = len(list(kernel.audit_log.entries(action="access.denied")))
    response = http.post("/v1/audit/entries", headers=bearer(apps.planner_operator), json={})
    assert response.status_code == 200, response.text
    assert len(list(kernel.audit_log.entries(action="access.denied"))) == before
