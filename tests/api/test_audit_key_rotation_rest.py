"""REST after an audit key rotation: ``GET /v1/audit/key`` publishes the key history, and
``POST /v1/audit/verify`` still accepts a receipt the old key signed (until 2026-12-05 a
replaced key made it refuse every receipt issued before)."""

from __future__ import annotations

import json

import httpx

from audit.receipts import verify_receipt
from domain.principal import Principal
from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.facade import Facade
from uprof.kernel import Uprof


def test_old_receipts_verify_after_a_rotation_over_rest_and_offline(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    before = http.get("/v1/audit/key", headers=bearer(apps.planner)).json()
    assert [k["key_id"] for k in before["key_history"]["keys"]] == [before["key_id"]]
    consent_id = grant(http, apps.planner, subject="bob")
    ack = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "bob", **interaction("I keep bees")},
    )
    assert ack.status_code == 201, ack.text
    withdrawn = http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.planner),
        json={"subject": "bob", "consent_id": consent_id, "erase": True},
    )
    assert withdrawn.status_code == 200, withdrawn.text
    receipt = withdrawn.json()["erasure"]["receipt"]

    Facade(kernel, Principal.local_operator(kernel.subjects.tenant)).rotate_audit_key()

    after = http.get("/v1/audit/key", headers=bearer(apps.planner)).json()
    assert after["key_id"] != before["key_id"]
    history = after["key_history"]
    assert [k["key_id"] for k in history["keys"]] == [before["key_id"], after["key_id"]]
    checked = http.post(
        "/v1/audit/verify",
        headers=bearer(apps.planner_operator),
        json={"kind": "receipt", "content": json.dumps(receipt)},
    ).json()
    assert checked["ok"] is True, checked
    # Offline: the first key pinned before the rotation, and the published history.
    verify_receipt(receipt, before["public_key_pem"], origin=before["origin"], key_history=history)
    export = http.post("/v1/audit/export", headers=bearer(apps.planner_operator), json={}).text
    checked = http.post(
        "/v1/audit/verify", headers=bearer(apps.planner_operator), json={"content": export}
    ).json()
    assert checked["ok"] is True, checked
