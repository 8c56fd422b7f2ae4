"""Paged lists over REST and the SDK (sync, async, embedded), on SQLite and PostgreSQL.

Pages carry ``next_cursor``; a bad cursor is a 422 naming ``cursor``, a limit out of range
a 422 naming ``limit``; a cursor issued to another app is refused; lists that show every
app's data need the operator role. OpenAPI declares the fields.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.api.conftest import Apps, LiveServer, bearer, grant, interaction
from uprof.sdk import AsyncClient, Client, InvalidRequestError, PermissionDeniedError


def _walk(http: httpx.Client, path: str, key: str, body: dict[str, Any], field: str) -> list[Any]:
    items: list[Any] = []
    cursor = None
    for _ in range(100):
        sent = {**body, **({"cursor": cursor} if cursor else {})}
        response = http.post(path, headers=bearer(key), json=sent)
        assert response.status_code == 200, response.text
        page = response.json()
        items.extend(page[field])
        cursor = page["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("pages never ended")


def _problem_field(response: httpx.Response) -> str:
    assert response.status_code == 422, response.text
    return str(response.json()["error"]["fields"][0]["field"])


def test_consent_pages_over_rest(http: httpx.Client, apps: Apps) -> None:
    granted = {grant(http, apps.planner) for _ in range(5)}
    grant(http, apps.calendar, purposes=("scheduling",))
    seen = _walk(
        http, "/v1/consents/list", apps.planner, {"subject": "alice", "limit": 2}, "consents"
    )
    assert [c["consent_id"] for c in seen if c["consent_id"] in granted] == [
        c["consent_id"] for c in seen
    ]
    assert {c["consent_id"] for c in seen} == granted


def test_bad_cursors_and_limits_are_422s_naming_the_field(http: httpx.Client, apps: Apps) -> None:
    for _ in range(3):
        grant(http, apps.planner)
    first = http.post(
        "/v1/consents/list", headers=bearer(apps.planner), json={"subject": "alice", "limit": 1}
    ).json()
    cursor = first["next_cursor"]
    assert cursor
    bad = http.post(
        "/v1/consents/list",
        headers=bearer(apps.planner),
        json={"subject": "alice", "cursor": cursor[:-2] + "xx"},
    )
    assert _problem_field(bad) == "cursor"
    grant(http, apps.calendar, purposes=("scheduling",))
    other_app = http.post(
        "/v1/consents/list",
        headers=bearer(apps.calendar),
        json={"subject": "alice", "cursor": cursor},
    )
    assert _problem_field(other_app) == "cursor"
    too_long = http.post(
        "/v1/consents/list",
        headers=bearer(apps.planner),
        json={"subject": "alice", "cursor": "c" * 513},
    )
    assert _problem_field(too_long) == "cursor"
    for limit in (0, 501, "lots"):
        response = http.post(
            "/v1/consents/list",
            headers=bearer(apps.planner),
            json={"subject": "alice", "limit": limit},
        )
        assert _problem_field(response) == "limit"


def test_a_cursor_tells_an_app_nothing_of_a_subject_it_holds_no_consent_of(
    http: httpx.Client, apps: Apps
) -> None:
    """An app with no consent of a subject gets, with any cursor, the answer for a subject
    that does not exist (docs/security.md): the cursor's check must not answer first for
    a subject that exists (422) while one that does not gets 404."""
    for _ in range(3):
        grant(http, apps.planner)
    stolen = http.post(
        "/v1/consents/list", headers=bearer(apps.planner), json={"subject": "alice", "limit": 1}
    ).json()["next_cursor"]
    assert stolen
    for cursor in (stolen, "c1.junk.junk", "x"):
        answers = [
            http.post(
                "/v1/consents/list",
                headers=bearer(apps.calendar),
                json={"subject": subject, "cursor": cursor},
            )
            for subject in ("alice", "nobody")
        ]
        known, unknown = ((a.status_code, a.json()["error"]) for a in answers)
        assert unknown[0] == 404 and known == unknown, cursor
    # An app that holds a consent of the subject is told what is wrong with its cursor.
    grant(http, apps.calendar, purposes=("scheduling",))
    mine = http.post(
        "/v1/consents/list",
        headers=bearer(apps.calendar),
        json={"subject": "alice", "cursor": stolen},
    )
    assert _problem_field(mine) == "cursor"


def test_audit_entry_and_receipt_pages(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    for i in range(4):
        r = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction(f"line {i}")},
        )
        assert r.status_code == 201, r.text
    entries = _walk(http, "/v1/audit/entries", apps.planner_operator, {"limit": 3}, "items")
    leaves = [e["leaf_index"] for e in entries]
    assert leaves == sorted(set(leaves)) and len(leaves) >= 5
    captures = _walk(
        http,
        "/v1/audit/entries",
        apps.planner_operator,
        {"action": "capture.accepted", "subject": "alice", "limit": 1},
        "items",
    )
    assert len(captures) == 4
    assert {e["entry"]["action"] for e in captures} == {"capture.accepted"}
    erased = http.post(
        "/v1/governance/erasures/subject", headers=bearer(apps.privacy), json={"subject": "alice"}
    )
    assert erased.status_code == 200, erased.text
    receipts = _walk(http, "/v1/audit/receipts", apps.planner_operator, {}, "items")
    assert [r["receipt_id"] for r in receipts] == [erased.json()["receipt"]["body"]["receipt_id"]]


def test_operator_lists_refuse_an_app_key(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    for path, body in (
        ("/v1/audit/entries", {}),
        ("/v1/audit/receipts", {}),
        ("/v1/subjects/list", {}),
        ("/v1/memories/list", {"subject": "alice"}),
    ):
        response = http.post(path, headers=bearer(apps.planner), json=body)
        assert response.status_code == 403, (path, response.text)


def test_policy_history_pages(http: httpx.Client, apps: Apps) -> None:
    op = bearer(apps.planner_operator)
    for category in ("diet", "goal"):
        r = http.post(
            "/v1/policy/grant",
            headers=op,
            json={
                "app_id": "app:planner",
                "actions": ["read"],
                "categories": [category],
                "purpose": "scheduling",
            },
        )
        assert r.status_code == 200, r.text
    versions, cursor = [], None
    while True:
        params = {"limit": 1, **({"cursor": cursor} if cursor else {})}
        page = http.get("/v1/policy/history", headers=op, params=params).json()
        versions += [c["version"] for c in page["changes"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert versions == sorted(versions) and len(versions) >= 3
    bad = http.get("/v1/policy/history", headers=op, params={"cursor": "c1.x.y"})
    assert _problem_field(bad) == "cursor"


def test_sdk_iterators_follow_every_page(
    server: LiveServer, apps: Apps, http: httpx.Client
) -> None:
    granted = {grant(http, apps.planner) for _ in range(5)}
    with Client(server.url, apps.planner) as client:
        page = client.list_consents("alice", limit=2)
        assert len(page.consents) == 2 and page.next_cursor
        assert {c.consent_id for c in client.iter_consents("alice", limit=2)} == granted
        assert {c.consent_id for c in client.consents("alice")} == granted
        with pytest.raises(InvalidRequestError) as refused:
            client.list_consents("alice", cursor="c1.AAAA.BBBB")
        assert [f.field for f in refused.value.fields] == ["cursor"]
        with pytest.raises(PermissionDeniedError):
            client.list_subjects()
    with Client(server.url, apps.planner_operator) as op:
        pseudonyms = [s.pseudonym for s in op.iter_subjects(limit=1)]
        assert len(pseudonyms) == 1 and pseudonyms[0].startswith("subj_")
        actions = [e.entry["action"] for e in op.iter_audit_entries(limit=2)]
        assert actions.count("consent.granted") == 5

    async def run() -> set[str]:
        async with AsyncClient(server.url, apps.planner) as client:
            return {c.consent_id async for c in client.iter_consents("alice", limit=2)}

    assert asyncio.run(run()) == granted


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_embedded_client_pages_memories(kernel: Any) -> None:
    with Client.embedded(kernel, "app:planner", roles=("app", "operator")) as client:
        client.grant_consent(
            "alice", categories=["*"], purposes=["personalization"], collected_by="ui:1"
        )
        for i in range(5):
            client.capture("alice", agent_id="agent:one", user_input=f"I like tea number {i}")
        memories = list(client.iter_memories("alice", limit=2))
        assert len(memories) == 5
        assert len({m.item_id for m in memories}) == 5
        with pytest.raises(InvalidRequestError) as refused:
            client.list_memories("alice", limit=1000)
        assert [f.field for f in refused.value.fields] == ["limit"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_openapi_declares_cursor_limit_and_next_cursor(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for request in (
        "ConsentListIn",
        "MemoryListIn",
        "SubjectListIn",
        "AuditEntriesIn",
        "ReceiptListIn",
    ):
        props = schemas[request]["properties"]
        assert props["limit"]["maximum"] == 500 and props["limit"]["minimum"] == 1
        assert "cursor" in props
    for page in ("ConsentList", "MemoryPage", "SubjectPage", "AuditEntryPage", "ReceiptPage"):
        assert "next_cursor" in schemas[page]["properties"]
    history = spec["paths"]["/v1/policy/history"]["get"]
    assert {p["name"] for p in history["parameters"]} == {"cursor", "limit"}
