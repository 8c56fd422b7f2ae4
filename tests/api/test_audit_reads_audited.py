"""Every read of the audit trail is itself on the trail (``audit.read``).

Found on 2026-12-05: exports (``audit.exported``) and proofs (``audit.proof_served``)
were recorded, but entry pages (REST ``/v1/audit/entries``, ``uprof audit entries``, the
SDK, the console's search) and receipt pages (``/v1/audit/receipts``, ``uprof audit
receipts``, the console's receipts page) were not: a compliance reader browsing a
subject's trail left no trace. Each page now appends one ``audit.read`` naming the
reader, the subject filter, the page's leaf bounds and count.

A listing is bounded by the log's size when its first page was read (the cursor carries
it), so the reads it records (appended beyond that bound) never show up in, nor shift,
its own later pages. Both backends.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from typer.testing import CliRunner

from tests.api.conftest import Apps, bearer, grant, interaction
from tests.conftest import Backend
from uprof.cli.main import app as cli
from uprof.kernel import Uprof


def _reads(kernel: Uprof) -> list[dict[str, Any]]:
    return [e.entry for e in kernel.audit_entries(action="audit.read")]


def _activity(http: httpx.Client, apps: Apps, lines: int = 3) -> None:
    grant(http, apps.planner)
    for i in range(lines):
        ack = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction(f"I want to learn the cello {i}")},
        )
        assert ack.status_code == 201, ack.text


def _pages(http: httpx.Client, token: str, path: str, **body: Any) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    while True:
        answer = http.post(path, headers=bearer(token), json={**body, "cursor": cursor})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        pages.append(page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return pages


def test_a_subjects_trail_read_page_by_page_is_recorded_and_its_pages_stay_put(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    _activity(http, apps)
    pseudonym = kernel.audit_subject_ref("alice")
    assert _reads(kernel) == []

    pages = _pages(http, apps.planner_operator, "/v1/audit/entries", subject="alice", limit=2)
    assert len(pages) >= 2
    reads = _reads(kernel)
    assert len(reads) == len(pages), "each page read is recorded once"
    bound = reads[0]["tree_size"]
    assert {r["tree_size"] for r in reads} == {bound}, "one listing, one bound"
    for read in reads:
        assert read["reason_code"] == "entries"
        assert read["subject_ref"] == pseudonym
        assert read["principal"].startswith("app:planner#")
        assert read["tenant"] == "default"
    # The pages are exactly the subject's entries below the bound, each once, in order:
    # the reads recorded while paging (the subject's entries too) are beyond it.
    seen = [item["leaf_index"] for page in pages for item in page]
    expected = [e.leaf_index for e in kernel.audit_entries(subject_ref=pseudonym, tree_size=bound)]
    assert seen == expected
    assert all(item["entry"]["action"] != "audit.read" for page in pages for item in page)
    # Each read names its page: how many entries and which leaf range it covered.
    for read, page in zip(reads, pages, strict=True):
        assert read["counts"]["entries"] == len(page)
        assert read["counts"]["from_leaf"] <= page[0]["leaf_index"]
        assert page[-1]["leaf_index"] < read["counts"]["to_leaf"] <= bound
    # No captured text is on the trail.
    assert "cello" not in json.dumps(reads)

    # A new listing sees the earlier reads (they are entries of the trail like any).
    again = _pages(http, apps.planner_operator, "/v1/audit/entries", subject="alice", limit=500)
    assert sum(1 for item in again[0] if item["entry"]["action"] == "audit.read") == len(pages)


def test_receipt_pages_and_the_console_are_recorded(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    _activity(http, apps, lines=1)
    erased = http.post(
        "/v1/governance/erasures/subject",
        headers=bearer(apps.planner_operator),
        json={"subject": "alice"},
    )
    assert erased.status_code == 200, erased.text
    receipts = _pages(http, apps.planner_operator, "/v1/audit/receipts", limit=10)
    assert len(receipts[0]) == 1
    (read,) = _reads(kernel)
    assert read["reason_code"] == "receipts" and read["counts"]["entries"] == 1
    assert "subject_ref" not in read

    with httpx.Client(base_url=str(http.base_url), timeout=30) as console:
        assert console.post("/console/login", data={"api_key": apps.planner_operator})
        assert console.get("/console", params={"action": "erasure.requested"}).status_code == 200
        assert console.get("/console/receipts").status_code == 200
    reasons = [r["reason_code"] for r in _reads(kernel)]
    assert reasons == ["receipts", "entries", "receipts"], reasons


def _cli(backend: Backend):  # type: ignore[no-untyped-def]
    base = ["--data-dir", str(backend.data_dir / "data"), "--embedder", "hashing"]
    if backend.kind == "postgres":
        base += ["--database-url", backend.url]

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, [*base, *args])
        assert result.exit_code == 0, result.output
        return str(result.stdout)  # the page's JSON (the next-page hint goes to stderr)

    return run


def test_the_cli_records_its_pages_under_the_local_operator(backend: Backend) -> None:
    run = _cli(backend)
    for n in range(3):
        run("apps", "create", f"app:a{n}")  # audited writes
    first = json.loads(run("audit", "entries", "--limit", "2"))
    assert first["next_cursor"]
    second = json.loads(run("audit", "entries", "--limit", "2", "--cursor", first["next_cursor"]))
    run("audit", "receipts")
    listed = json.loads(run("audit", "entries", "--action", "audit.read", "--limit", "500"))
    reads = [item["entry"] for item in listed["items"]]
    assert [r["reason_code"] for r in reads] == ["entries", "entries", "receipts"]
    assert {r["principal"] for r in reads} == {"operator:local#cli"}
    assert reads[0]["tree_size"] == reads[1]["tree_size"], "the cursor keeps the first bound"
    assert reads[0]["counts"]["entries"] == len(first["items"]) == 2
    assert reads[1]["counts"]["entries"] == len(second["items"])
    shown = [i["leaf_index"] for i in first["items"] + second["items"]]
    assert shown == sorted(set(shown))


def test_the_sdk_over_http_and_embedded_records_its_pages(
    server: Any, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    from uprof.sdk import Client

    _activity(http, apps, lines=2)
    with (
        Client(server.url, apps.planner_operator) as client,
        Client(server.url, apps.planner) as app_client,
    ):
        walked = list(client.iter_audit_entries(subject="alice", limit=2))
        app_key = app_client.audit_key()
        operator_key = client.audit_key()
    assert app_key.checkpoint is None and operator_key.checkpoint is not None
    over_http = _reads(kernel)
    assert len(over_http) >= 2 and {r["reason_code"] for r in over_http} == {"entries"}
    assert len({r["tree_size"] for r in over_http}) == 1
    assert [e.leaf_index for e in walked] == sorted({e.leaf_index for e in walked})
    embedded = Client.embedded(kernel, "app:planner", roles=("app", "operator"))
    try:
        embedded.audit_receipts()
    finally:
        embedded.close()
    last = _reads(kernel)[-1]
    assert last["reason_code"] == "receipts" and last["principal"].startswith("app:planner#")
