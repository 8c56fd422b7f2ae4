"""The REST API end to end over real HTTP on loopback, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.api.conftest import CALENDAR, PLANNER, Apps, LiveServer, bearer, grant, interaction
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.settings import Settings

SLICE = {
    "query": "what do I want to do?",
    "budget_tokens": 512,
    "purpose": "personalization",
    "agent_id": "agent:one",
}


def slice_for(http: httpx.Client, key: str, **overrides: object) -> httpx.Response:
    return http.post(
        "/v1/slices", headers=bearer(key), json={"subject": "alice", **SLICE, **overrides}
    )


# ------------------------------------------------------------------ operations


def test_health_readiness_and_metrics_answer_without_a_key(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True
    assert ready.json()["worker"] == "running"
    text = http.get("/metrics").text
    assert 'uprof_http_requests_total{method="GET",route="/healthz",status="200"} 1' in text
    assert 'uprof_projection_lag_events{stage="projection"}' in text
    assert "uprof_http_request_duration_seconds_bucket" in text


def test_readiness_fails_while_reads_cannot_be_recorded(
    http: httpx.Client, kernel: Uprof, apps: Apps
) -> None:
    grant(http, apps.planner)
    assert http.get("/readyz").status_code == 200
    kernel.reads._failure = OSError("audit store unavailable")
    try:
        ready = http.get("/readyz")
        assert ready.status_code == 503 and "read recorder" in ready.json()["detail"]
        # Captures are still taken and projected: only reads are refused.
        ack = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction("I want to learn the cello")},
        )
        assert ack.status_code == 201
        assert kernel.wait_until_caught_up(10)
        refused = slice_for(http, apps.planner)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "read_not_recorded"
    finally:
        kernel.reads._failure = None


def test_openapi_documents_every_route_with_bearer_auth(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    assert {
        "/v1/captures",
        "/v1/captures/batch",
        "/v1/proposals",
        "/v1/slices",
        "/v1/profile/read",
        "/v1/evidence/read",
        "/v1/consents",
        "/v1/consents/list",
        "/v1/consents/withdraw",
        "/v1/sessions",
        "/v1/identifiers",
        "/v1/whoami",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(spec["paths"])
    assert spec["components"]["securitySchemes"]["ApiKey"]["scheme"] == "bearer"
    assert spec["paths"]["/v1/slices"]["post"]["operationId"] == "create_slice"
    assert http.get("/docs").status_code == 200


# ------------------------------------------------------------------------- 401


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer",
        "Bearer nonsense",
        "Basic dXNlcjpwYXNz",
        "Bearer upk_0000000000000000_" + "A" * 43,
    ],
)
def test_missing_or_invalid_key_is_401(http: httpx.Client, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    response = http.post(
        "/v1/captures", headers=headers, json={"subject": "alice", **interaction("hi")}
    )
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "unauthenticated"


def test_revoked_key_is_401_from_the_next_request(
    http: httpx.Client, keys: ApiKeyStore, apps: Apps
) -> None:
    issued = keys.create(PLANNER)
    assert http.get("/v1/whoami", headers=bearer(issued.token)).status_code == 200
    assert keys.revoke(issued.info.key_id)
    response = http.get("/v1/whoami", headers=bearer(issued.token))
    assert response.status_code == 401
    # Other keys of the same app keep working.
    assert http.get("/v1/whoami", headers=bearer(apps.planner)).json()["app_id"] == PLANNER


def test_a_revocation_by_another_process_takes_effect_within_the_cache_time(
    http: httpx.Client, keys: ApiKeyStore, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server caches live key rows briefly; ``uprof apps revoke`` runs elsewhere."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    assert http.get("/v1/whoami", headers=bearer(issued.token)).status_code == 200
    elsewhere = ApiKeyStore.open(settings)  # another process's store: no shared cache
    try:
        assert elsewhere.revoke(issued.info.key_id)
    finally:
        elsewhere.close()
    # Within the cache time the server still trusts its recent read of the row ...
    clock[0] += KEY_CACHE_TTL_S / 2
    assert http.get("/v1/whoami", headers=bearer(issued.token)).status_code == 200
    # ... and once it is older than that, the revocation made elsewhere takes effect.
    clock[0] += KEY_CACHE_TTL_S
    assert http.get("/v1/whoami", headers=bearer(issued.token)).status_code == 401


def test_tampered_secret_is_401(http: httpx.Client, apps: Apps) -> None:
    tampered = apps.planner[:-1] + ("A" if apps.planner[-1] != "A" else "B")
    assert http.get("/v1/whoami", headers=bearer(tampered)).status_code == 401


# ------------------------------------------------------------------------- 403


def test_capture_without_consent_is_403_and_writes_nothing(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    before = kernel.lag().log_position
    response = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Paris")},
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "consent_required"
    assert kernel.lag().log_position == before


def test_full_profile_needs_the_operator_role(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    refused = http.post("/v1/profile/read", headers=bearer(apps.planner), json={"subject": "alice"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "role_required"
    allowed = http.post(
        "/v1/profile/read", headers=bearer(apps.planner_operator), json={"subject": "alice"}
    )
    assert allowed.status_code == 200
    assert [c["app_id"] for c in allowed.json()["consents"]] == [PLANNER]


def test_policy_denied_purpose_serves_nothing_and_counts_it(http: httpx.Client, apps: Apps) -> None:
    # The policy lets planner record no consent for advertising: refused, nothing stored.
    refused = http.post(
        "/v1/consents",
        headers=bearer(apps.planner),
        json={
            "subject": "alice",
            "categories": ["*"],
            "purposes": ["personalization", "advertising"],
            "collected_by": "consent-ui:test",
        },
    )
    assert refused.status_code == 403, refused.text
    grant(http, apps.planner)
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to run a marathon")},
    )
    # The seed policy allows role:assistant no "advertising" reads: the kernel withholds
    # every item (a count per reason, never ids) instead of refusing the request.
    denied = slice_for(http, apps.planner, purpose="advertising")
    assert denied.status_code == 200
    assert denied.json()["items"] == []
    assert denied.json()["withheld"]["policy"] >= 2
    assert "marathon" not in denied.json()["text"]


# ----------------------------------------------------- capture, read your writes


def test_capture_then_slice_reads_the_write(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    ack = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to learn the cello", ref="D1:3")},
    )
    assert ack.status_code == 201
    capture_id = ack.json()["capture_id"]
    result = slice_for(http, apps.planner)
    assert result.status_code == 200
    body = result.json()
    assert body["fresh"] is True
    assert body["app_id"] == PLANNER
    assert "cello" in body["text"]
    memory = next(i for i in body["items"] if i["layer"] == "memory")
    assert memory["evidence"] == [capture_id]
    assert memory["source_refs"] == ["D1:3"]
    assert body["n_tokens"] <= 512
    # The kernel's share of the wait, for callers measuring what the edge adds.
    name, _, duration = result.headers["Server-Timing"].partition(";dur=")
    assert name == "slice" and 0 < float(duration) < 30_000


def test_batch_capture_is_all_or_nothing(http: httpx.Client, apps: Apps, kernel: Uprof) -> None:
    grant(http, apps.planner)  # personalization only
    before = kernel.lag().log_position
    refused = http.post(
        "/v1/captures/batch",
        headers=bearer(apps.planner),
        json={
            "subject": "alice",
            "interactions": [
                interaction("I want to swim"),
                interaction("I like jazz", purpose="advertising"),
            ],
        },
    )
    assert refused.status_code == 403
    assert kernel.lag().log_position == before
    accepted = http.post(
        "/v1/captures/batch",
        headers=bearer(apps.planner),
        json={
            "subject": "alice",
            "interactions": [interaction("I want to swim"), interaction("I like jazz")],
        },
    )
    assert accepted.status_code == 201
    assert len(accepted.json()["acks"]) == 2


def test_proposals_bind_to_the_subjects_own_evidence(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    grant(http, apps.planner, subject="bob")
    own = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    ).json()
    foreign = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "bob", **interaction("I eat meat")},
    ).json()
    proposal = {"kind": "attribute", "key": "diet", "value": "vegetarian"}
    applied = http.post(
        "/v1/proposals",
        headers=bearer(apps.planner),
        json={
            "subject": "alice",
            "agent_id": "agent:one",
            "sharing": "shared",
            "proposals": [{**proposal, "evidence": [own["capture_id"]]}],
        },
    )
    assert applied.status_code == 200
    assert applied.json()["applied"] == 1
    refused = http.post(
        "/v1/proposals",
        headers=bearer(apps.planner),
        json={
            "subject": "alice",
            "agent_id": "agent:one",
            "proposals": [{**proposal, "evidence": [foreign["capture_id"]]}],
        },
    )
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "evidence_invalid"


def test_evidence_shows_the_captures_behind_an_item(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    ack = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    ).json()
    profile = http.post(
        "/v1/profile/read", headers=bearer(apps.planner_operator), json={"subject": "alice"}
    ).json()
    item = next(a for a in profile["attributes"] if a["key"] == "home_location")
    evidence = http.post(
        "/v1/evidence/read",
        headers=bearer(apps.planner_operator),
        json={"subject": "alice", "item_id": item["item_id"]},
    )
    assert evidence.status_code == 200
    assert [c["capture_id"] for c in evidence.json()["captures"]] == [ack["capture_id"]]
    assert evidence.json()["captures"][0]["user_input"] == "I live in Lisbon"


def test_consent_withdrawal_takes_effect_for_the_next_request(
    http: httpx.Client, apps: Apps
) -> None:
    consent_id = grant(http, apps.planner)
    listed = http.post("/v1/consents/list", headers=bearer(apps.planner), json={"subject": "alice"})
    assert [c["consent_id"] for c in listed.json()["consents"]] == [consent_id]
    withdrawn = http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.planner),
        json={"subject": "alice", "consent_id": consent_id},
    )
    assert withdrawn.status_code == 200
    assert withdrawn.json()["consent"]["withdrawn_at"] is not None
    assert withdrawn.json()["erasure"] is None
    refused = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to swim")},
    )
    assert refused.status_code == 403


# ------------------------------------------------------------ cross-app isolation


def test_app_b_cannot_read_app_a_private_items(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    grant(http, apps.calendar, purposes=("scheduling",))
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to climb Kilimanjaro", sharing="private")},
    )
    own = slice_for(http, apps.planner)
    assert "Kilimanjaro" in own.json()["text"]
    other = slice_for(http, apps.calendar, purpose="scheduling", agent_id="agent:cal")
    assert other.status_code == 200
    assert "Kilimanjaro" not in other.json()["text"]
    assert other.json()["items"] == []
    assert sum(other.json()["withheld"].values()) >= 2


@pytest.mark.parametrize("path", ["/v1/captures", "/v1/slices", "/v1/consents"])
def test_a_body_naming_an_app_is_refused(http: httpx.Client, apps: Apps, path: str) -> None:
    body = {"subject": "alice", "app_id": CALENDAR, **interaction("x"), **SLICE}
    response = http.post(path, headers=bearer(apps.planner), json=body)
    assert response.status_code == 422
    assert "app_id" in {f["field"] for f in response.json()["error"]["fields"]}


def test_apps_see_and_withdraw_only_their_own_consents(http: httpx.Client, apps: Apps) -> None:
    planner_consent = grant(http, apps.planner)
    grant(http, apps.calendar, purposes=("scheduling",))
    listed = http.post(
        "/v1/consents/list", headers=bearer(apps.calendar), json={"subject": "alice"}
    )
    assert {c["app_id"] for c in listed.json()["consents"]} == {CALENDAR}
    stolen = http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.calendar),
        json={"subject": "alice", "consent_id": planner_consent},
    )
    assert stolen.status_code == 404
    still = http.post("/v1/consents/list", headers=bearer(apps.planner), json={"subject": "alice"})
    assert still.json()["consents"][0]["withdrawn_at"] is None


def test_sessions_are_scoped_to_the_app_that_registered_them(
    http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner)
    grant(http, apps.planner, subject="bob")
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to learn the cello")},
    )
    assert (
        http.post(
            "/v1/sessions",
            headers=bearer(apps.planner),
            json={"session_id": "s-1", "subject": "alice"},
        ).status_code
        == 201
    )
    # An app binds sessions only to subjects it holds a consent of: for any other, the
    # answer is the unknown subject's (it must not learn who exists).
    for someone in ("bob", "nobody-at-all"):
        refused = http.post(
            "/v1/sessions",
            headers=bearer(apps.calendar),
            json={"session_id": "s-1", "subject": someone},
        )
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "subject_not_found"
    grant(http, apps.calendar, subject="bob", categories=("schedule",), purposes=("scheduling",))
    # The calendar app binding the same session id to bob changes nothing for the planner.
    assert (
        http.post(
            "/v1/sessions",
            headers=bearer(apps.calendar),
            json={"session_id": "s-1", "subject": "bob"},
        ).status_code
        == 201
    )
    by_session = http.post(
        "/v1/slices", headers=bearer(apps.planner), json={**SLICE, "session_id": "s-1"}
    )
    assert by_session.status_code == 200
    assert "cello" in by_session.json()["text"]
    unknown = http.post(
        "/v1/slices", headers=bearer(apps.planner), json={**SLICE, "session_id": "s-2"}
    )
    assert unknown.status_code == 422
    assert unknown.json()["error"]["code"] == "identity_unresolved"


# ------------------------------------------------------------------ 422 and 413


def test_422_names_the_missing_field(http: httpx.Client, apps: Apps) -> None:
    body = {"subject": "alice", **interaction("hello")}
    del body["occurred_at"]
    response = http.post("/v1/captures", headers=bearer(apps.planner), json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert [f["field"] for f in error["fields"]] == ["occurred_at"]
    assert "occurred_at" in error["message"]


def test_422_names_a_nested_field_of_a_batch(http: httpx.Client, apps: Apps) -> None:
    bad = interaction("hello")
    bad["occurred_at"] = "2025-01-01T09:00:00"  # no timezone
    response = http.post(
        "/v1/captures/batch",
        headers=bearer(apps.planner),
        json={"subject": "alice", "interactions": [interaction("ok"), bad]},
    )
    assert response.status_code == 422
    assert response.json()["error"]["fields"][0]["field"] == "interactions.1.occurred_at"


@pytest.mark.parametrize(
    ("field", "value"),
    [("budget_tokens", 40_000), ("budget_tokens", -1), ("query", "x" * 4_001), ("agent_id", "   ")],
)
def test_422_for_out_of_range_slice_fields(
    http: httpx.Client, apps: Apps, field: str, value: object
) -> None:
    response = slice_for(http, apps.planner, **{field: value})
    assert response.status_code == 422
    assert field in {f["field"] for f in response.json()["error"]["fields"]}


def test_422_for_nul_characters(http: httpx.Client, apps: Apps) -> None:
    response = http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("bad\u0000text")},
    )
    assert response.status_code == 422
    assert response.json()["error"]["fields"][0]["field"] == "user_input"


def test_malformed_json_is_422(http: httpx.Client, apps: Apps) -> None:
    response = http.post(
        "/v1/captures",
        headers={**bearer(apps.planner), "Content-Type": "application/json"},
        content=b'{"subject": ',
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"


def test_unknown_subject_is_404(http: httpx.Client, apps: Apps) -> None:
    response = slice_for(http, apps.planner, subject="nobody")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "subject_not_found"


def test_oversized_body_is_413_and_writes_nothing(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    grant(http, apps.planner)
    before = kernel.lag().log_position
    big = [interaction("I like " + "jazz " * 2_000) for _ in range(10)]  # ~100 kB > 64 kB
    response = http.post(
        "/v1/captures/batch",
        headers=bearer(apps.planner),
        json={"subject": "alice", "interactions": big},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert kernel.lag().log_position == before


def test_oversized_chunked_body_is_413(http: httpx.Client, apps: Apps) -> None:
    def chunks():  # no Content-Length: the server must count as the body arrives
        yield b'{"subject": "alice", "interactions": ['
        for _ in range(100):
            yield b'{"agent_id": "a", "user_input": "' + b"x" * 1_000 + b'", "occurred_at": '
            yield b'"2025-01-01T09:00:00Z"},'
        yield b"]}"

    response = http.post(
        "/v1/captures/batch",
        content=chunks(),
        headers={**bearer(apps.planner), "Content-Type": "application/json"},
    )
    assert response.status_code == 413


def test_metrics_count_requests_per_route_and_status(http: httpx.Client, apps: Apps) -> None:
    slice_for(http, apps.planner, subject="nobody")
    text = http.get("/metrics").text
    assert 'uprof_http_requests_total{method="POST",route="/v1/slices",status="404"} 1' in text
    assert "nobody" not in text


# -------------------------------------------------------------------- governance


def test_policy_denies_erasure_and_export_to_an_assistant_app(
    http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner)
    for path in ("/v1/governance/erasures/subject", "/v1/governance/exports"):
        response = http.post(path, headers=bearer(apps.planner), json={"subject": "alice"})
        assert response.status_code == 403, path
        assert response.json()["error"]["code"] == "permission_denied"
    # Nothing was erased: the planner still reads its slice.
    assert slice_for(http, apps.planner).status_code == 200


def test_dpo_exports_then_erases_a_subject_with_a_signed_receipt(
    http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner)
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    )
    export = http.post(
        "/v1/governance/exports", headers=bearer(apps.privacy), json={"subject": "alice"}
    )
    assert export.status_code == 200
    assert "Lisbon" in str(export.json()["export"])
    erased = http.post(
        "/v1/governance/erasures/subject", headers=bearer(apps.privacy), json={"subject": "alice"}
    )
    assert erased.status_code == 200, erased.text
    body = erased.json()
    assert body["receipt"] and body["subject_nonce_hex"]
    assert "Lisbon" not in str(body)
    gone = slice_for(http, apps.planner)
    assert gone.status_code == 410
    assert gone.json()["error"]["code"] == "subject_erased"


def test_an_erased_subject_id_is_410_for_consent_capture_and_reads(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """Issue 13: after erasure, grant and capture under the same name both succeeded."""
    grant(http, apps.planner)
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I live in Lisbon")},
    )
    old = kernel.subjects.find("alice")
    erased = http.post(
        "/v1/governance/erasures/subject", headers=bearer(apps.privacy), json={"subject": "alice"}
    )
    assert erased.status_code == 200, erased.text
    attempts = [
        http.post(
            "/v1/consents",
            headers=bearer(apps.planner),
            json={
                "subject": "alice",
                "categories": ["*"],
                "purposes": ["personalization"],
                "collected_by": "consent-ui:test",
            },
        ),
        http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction("I am back")},
        ),
        slice_for(http, apps.planner),
        http.post(
            "/v1/governance/exports", headers=bearer(apps.privacy), json={"subject": "alice"}
        ),
    ]
    for response in attempts:
        assert response.status_code == 410, response.text
        assert response.json()["error"]["code"] == "subject_erased"
    assert old is not None
    assert kernel.recreate_subject("alice") != old.pseudonym
    assert (
        http.post(
            "/v1/consents",
            headers=bearer(apps.planner),
            json={
                "subject": "alice",
                "categories": ["*"],
                "purposes": ["personalization"],
                "collected_by": "consent-ui:test",
            },
        ).status_code
        == 201
    )


def test_withdrawal_with_erase_returns_a_receipt(http: httpx.Client, apps: Apps) -> None:
    consent_id = grant(http, apps.planner)
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to swim")},
    )
    response = http.post(
        "/v1/consents/withdraw",
        headers=bearer(apps.planner),
        json={"subject": "alice", "consent_id": consent_id, "erase": True},
    )
    assert response.status_code == 200, response.text
    assert response.json()["erasure"]["counts"]


# ----------------------------------------------------------------------- audit


def test_compliance_exports_the_trail_and_verifies_it_offline_and_online(
    http: httpx.Client, apps: Apps, tmp_path
) -> None:
    from audit.verify import verify_export

    grant(http, apps.planner, categories=("goal",))  # a short first line, quoted in full
    http.post(
        "/v1/captures",
        headers=bearer(apps.planner),
        json={"subject": "alice", **interaction("I want to learn the cello")},
    )
    assert slice_for(http, apps.planner).status_code == 200
    exported = http.post(
        "/v1/audit/export", headers=bearer(apps.planner_operator), json={"subject": "alice"}
    )
    assert exported.status_code == 200
    # The file itself, streamed: JSONL with a download name.
    assert exported.headers["content-type"].startswith("application/x-ndjson")
    assert "audit-trail.jsonl" in exported.headers["content-disposition"]
    content = exported.text
    actions = [line for line in content.splitlines() if '"slice.served"' in line]
    assert actions, "the slice served before the export is in it"
    key = http.get("/v1/audit/key", headers=bearer(apps.planner)).json()
    report = verify_export(content.splitlines(), key["public_key_pem"], key["origin"])
    trailer = json.loads(content.splitlines()[-1])
    assert report.entry_count == trailer["entry_count"] > 0
    ok = http.post(
        "/v1/audit/verify", headers=bearer(apps.planner_operator), json={"content": content}
    ).json()
    assert ok["ok"] is True
    lines = content.splitlines()
    assert '"tenant"' in lines[1]  # line 2 is the first entry (line 1 is the header)
    lines[1] = lines[1].replace('"tenant"', '"tenanT"', 1)
    bad = http.post(
        "/v1/audit/verify",
        headers=bearer(apps.planner_operator),
        json={"content": "\n".join(lines) + "\n"},
    ).json()
    assert bad["ok"] is False and bad["line_number"] == 2 and "tenanT" in bad["line_text"]
    csv_export = http.post(
        "/v1/audit/export",
        headers=bearer(apps.planner_operator),
        json={"format": "csv", "action": "slice.served"},
    )
    assert csv_export.headers["content-type"].startswith("text/csv")
    assert csv_export.text.startswith("kind,")
    audited = http.post(
        "/v1/audit/export", headers=bearer(apps.planner_operator), json={"action": "audit.exported"}
    ).text
    assert json.loads(audited.splitlines()[-1])["entry_count"] >= 2  # the exports above


def test_the_audit_export_streams_and_the_sdk_rebuilds_it(
    server: LiveServer, http: httpx.Client, apps: Apps, tmp_path
) -> None:
    """The SDK assembles the streamed file (or writes it to disk) and reads its summary."""
    from audit.verify import verify_export
    from uprof.sdk import Client

    grant(http, apps.planner)
    for i in range(30):
        http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction(f"line {i}")},
        )
    key = http.get("/v1/audit/key", headers=bearer(apps.planner)).json()
    with Client(server.url, apps.planner_operator) as client:
        whole = client.audit_export()
        assert whole.summary.entry_count >= 31
        verify_export(whole.content.splitlines(), key["public_key_pem"], key["origin"])
        for fmt in ("jsonl", "csv"):
            path = tmp_path / f"trail.{fmt}"
            summary = client.audit_export_to(path, format=fmt, subject="alice")
            assert summary.entry_count >= 31
            report = verify_export(path, key["public_key_pem"], key["origin"])
            assert report.entry_count == summary.entry_count
            assert report.format == fmt


def test_the_audit_trail_needs_the_operator_role(http: httpx.Client, apps: Apps) -> None:
    for path, payload in (("/v1/audit/export", {}), ("/v1/audit/verify", {"content": "x"})):
        refused = http.post(path, headers=bearer(apps.planner), json=payload)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "role_required"
    assert http.post("/v1/audit/export", json={}).status_code == 401
    bad = http.post(
        "/v1/audit/export", headers=bearer(apps.planner_operator), json={"format": "xml"}
    )
    assert bad.status_code == 422 and bad.json()["error"]["fields"][0]["field"] == "format"
