"""Hostile callers, round 9 (decision XXXX-hostile-callers-round-9): the doors that changed
since round 8, attacked against a live server on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.api.conftest import Apps, bearer
from tests.web.conftest import deny_operators
from uprof.kernel import Uprof

ROTATION_PROOF = "/v1/audit/rotation-proof"


def _proofs_served(kernel: Uprof) -> int:
    kernel.reads.drain()
    return sum(1 for e in kernel.audit_log.entries() if e.entry["action"] == "audit.proof_served")


@pytest.mark.parametrize("field", ["checkpoint", "receipt"])
@pytest.mark.parametrize("junk", ["\ud800 note", "a\x00note"], ids=["surrogate", "nul"])
def test_a_rotation_proof_of_malformed_text_is_422_naming_the_field(
    http: httpx.Client, apps: Apps, kernel: Uprof, field: str, junk: str
) -> None:
    before = _proofs_served(kernel)
    answer = http.post(
        ROTATION_PROOF,
        headers={**bearer(apps.planner_operator), "Content-Type": "application/json"},
        # json.dumps writes a lone surrogate and a NUL as escapes, as a hostile client may
        content=json.dumps({field: junk}).encode(),
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["fields"][0]["field"] == field, answer.text
    assert _proofs_served(kernel) == before


def test_a_rotation_proof_is_refused_without_the_rights(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    note = http.get("/v1/audit/key", headers=bearer(apps.planner_operator)).json()["checkpoint"]
    for headers in ({}, bearer("up_not_a_key"), bearer(apps.planner)):
        refused = http.post(ROTATION_PROOF, headers=headers, json={"checkpoint": note})
        assert refused.status_code in (401, 403), refused.text
    deny_operators(kernel, "audit", "compliance")
    refused = http.post(
        ROTATION_PROOF, headers=bearer(apps.planner_operator), json={"checkpoint": note}
    )
    assert refused.status_code == 403, refused.text
