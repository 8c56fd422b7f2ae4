"""``POST /v1/audit/rotation-proof`` (decision 0165-review-of-0160): the rotation proof an
erasure receipt issued before an audit key rotation needs offline with the key history."""

from __future__ import annotations

import json

import httpx
import pytest

from audit.errors import VerificationError
from audit.receipts import verify_receipt
from domain.principal import Principal
from tests.api.conftest import Apps, bearer, grant, interaction
from uprof.facade import Facade
from uprof.kernel import Uprof


def test_the_api_hands_out_the_rotation_proof_for_an_offline_check(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    before = http.get("/v1/audit/key", headers=bearer(apps.planner)).json()
    consent_id = grant(http, apps.planner, subject="bob")
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "bob", **interaction("I keep bees")},
    ).raise_for_status()
    withdrawn = http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.planner),
        json={"subject": "bob", "consent_id": consent_id, "erase": True},
    )
    receipt = withdrawn.json()["erasure"]["receipt"]
    grant(http, apps.planner, subject="carol")  # the log grows past the receipt
    Facade(kernel, Principal.local_operator(kernel.subjects.tenant)).rotate_audit_key()
    history = http.get("/v1/audit/key", headers=bearer(apps.planner)).json()["key_history"]
    origin = before["origin"]
    with pytest.raises(VerificationError, match="rotation_proof"):
        verify_receipt(receipt, before["public_key_pem"], origin=origin, key_history=history)

    refused = http.post(
        "/v1/audit/rotation-proof",
        headers=bearer(apps.planner),
        json={"receipt": json.dumps(receipt)},
    )
    answer = http.post(
        "/v1/audit/rotation-proof",
        headers=bearer(apps.planner_operator),
        json={"receipt": json.dumps(receipt)},
    )

    assert refused.status_code == 403, refused.text
    assert answer.status_code == 200, answer.text
    proof = answer.json()
    assert proof["tree_size"] == receipt["inclusion"]["tree_size"] < proof["rotation_point"]
    verify_receipt(
        receipt,
        before["public_key_pem"],
        origin=origin,
        key_history=history,
        rotation_proof=proof["rotation_proof"],
    )
    forged = {**receipt, "checkpoint": receipt["checkpoint"].replace("\n", "\n ", 1)}
    bad = http.post(
        "/v1/audit/rotation-proof",
        headers=bearer(apps.planner_operator),
        json={"receipt": json.dumps(forged)},
    )
    assert bad.status_code == 422, bad.text


@pytest.mark.parametrize("content", ["not json", '{"body": 1}', '{"a": 1, "a": 2}'])
def test_a_receipt_that_is_not_one_is_a_clear_422(
    http: httpx.Client, apps: Apps, content: str
) -> None:
    answer = http.post(
        "/v1/audit/rotation-proof",
        headers=bearer(apps.planner_operator),
        json={"receipt": content},
    )
    assert answer.status_code == 422, answer.text
    assert "receipt" in answer.text


def test_the_api_hands_out_the_rotation_proof_of_a_checkpoint_and_names_the_field(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """Decision 0175-retired-below: ``{"checkpoint": note}`` (an export's or a proof
    document's note) gets the same proof as a receipt (bugs LK, LL); exactly one of the
    two fields; a note of another key is 422 naming ``checkpoint``."""
    from audit.checkpoint import sign_checkpoint, verify_checkpoint
    from audit.keyring import trusted_keys

    before = http.get("/v1/audit/key", headers=bearer(apps.planner_operator)).json()
    grant(http, apps.planner, subject="carol")  # the log grows past the held note
    Facade(kernel, Principal.local_operator(kernel.subjects.tenant)).rotate_audit_key()
    history = http.get("/v1/audit/key", headers=bearer(apps.planner)).json()["key_history"]
    keys = trusted_keys(before["public_key_pem"], history)
    note, origin = before["checkpoint"], before["origin"]
    with pytest.raises(VerificationError, match="rotation proof from"):
        verify_checkpoint(note, keys, origin)

    def ask(body: object) -> httpx.Response:
        return http.post(
            "/v1/audit/rotation-proof", headers=bearer(apps.planner_operator), json=body
        )

    answer = ask({"checkpoint": note})
    assert answer.status_code == 200, answer.text
    proof = answer.json()
    assert proof["receipt_id"] is None and proof["tree_size"] < proof["rotation_point"]
    verify_checkpoint(note, keys, origin, rotation_proof=proof["rotation_proof"])
    for body in ({}, {"checkpoint": note, "receipt": "{}"}):
        assert ask(body).status_code == 422
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    stranger = sign_checkpoint(Ed25519PrivateKey.generate(), origin, 1, b"\0" * 32)
    refused = ask({"checkpoint": stranger})
    assert refused.status_code == 422 and "checkpoint" in refused.text
