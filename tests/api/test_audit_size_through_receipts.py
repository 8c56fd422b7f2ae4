"""An app without the ``audit`` right still learns the audit log's size: from the receipt
of an erasure it asks for itself (decision 0095, amended after the attack review of
2026-12-05).

``/v1/audit/key`` gives such an app no checkpoint, but withdrawing its own consent with
``erase`` (REST, SDK, MCP ``forget``) answers with a signed erasure receipt, and a receipt
carries the checkpoint it is proved against: the tree size of the whole log, every
tenant's entries on shared stores. Two such erasures tell the app how much the deployment
recorded in between, as two capture acknowledgements' ``notification_id`` do for the event
log. Kept (a receipt is useless without its checkpoint) and documented in docs/security.md
("What one tenant learns of another"); this test pins what the documentation says.
"""

from __future__ import annotations

import httpx

from audit.checkpoint import verify_checkpoint
from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.kernel import Uprof


def test_an_apps_own_erasure_receipt_carries_the_whole_logs_size(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    key = http.get("/v1/audit/key", headers=bearer(apps.planner))
    assert key.status_code == 200 and key.json()["checkpoint"] is None
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
    log = kernel.audit_log
    size = verify_checkpoint(receipt["checkpoint"], log.public_key, log.origin).tree_size
    receipt_leaf = receipt["inclusion"]["leaf_index"]
    assert size > receipt_leaf  # the log's size when the receipt was recorded
    assert size <= log.size()
