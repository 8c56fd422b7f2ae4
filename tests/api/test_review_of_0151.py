"""The review of decision 0151-verifier-attacks, through the service surfaces.

Two servers, one per tenant, on the same stores (both backends), as
``test_audit_tenants.py`` sets them up: what the upload check (``POST /v1/audit/verify``,
the console's ``/console/verify``) says of another tenant's receipt and export (bug JQ),
and whether a receipt's subject commitment is over the subject's id as the service knows
it (bug JR).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from audit.export_format import CSV_COLUMNS, csv_line
from audit.receipts import verify_subject_commitment
from tests.api.conftest import PLANNER, LiveServer, bearer, grant, interaction, tenant_servers
from tests.conftest import OTHER_TENANT
from uprof.api import ApiKeyStore
from uprof.cli.main import app as cli
from uprof.kernel import Uprof
from uprof.server import create_server


def _erase(http: httpx.Client, planner: str, operator: str, subject: str) -> dict[str, Any]:
    """Capture one interaction of ``subject`` and erase it; the erasure's JSON answer."""
    grant(http, planner, subject.strip())
    captured = http.post(
        "/v1/captures",
        headers=bearer(planner),
        json={"subject": subject.strip(), **interaction("I like tea")},
    )
    assert captured.status_code in (200, 201, 202), captured.text
    erased = http.post(
        "/v1/governance/erasures/subject", headers=bearer(operator), json={"subject": subject}
    )
    assert erased.status_code == 200, erased.text
    return dict(erased.json())


def _verify(http: httpx.Client, key: str, content: str, kind: str) -> dict[str, Any]:
    answer = http.post(
        "/v1/audit/verify", headers=bearer(key), json={"kind": kind, "content": content}
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _console_verify(url: str, key: str, content: str, kind: str) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=60) as console:
        console.post("/console/login", data={"api_key": key})
        page = console.get("/console/verify")
        assert page.status_code == 200, page.text
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        return console.post(
            "/console/verify",
            data={"csrf": csrf, "kind": kind},
            files={"upload": ("upload.json", content.encode(), "application/octet-stream")},
        )


def test_the_upload_check_refuses_another_tenants_receipt_and_export(
    kernel: Uprof, keys: ApiKeyStore, other: tuple[Uprof, ApiKeyStore]
) -> None:
    """Bug JQ. Tenants on one set of stores share the log's key and origin, and an
    auditor of tenant B reads none of A's entries (decision 0089); yet B's upload check
    (``POST /v1/audit/verify``, the console) answered ``ok: true`` for A's receipt and for
    A's tenant-filtered export: only the detail text named A (0151 added it for receipts),
    and a script or a person reading the verdict took it for B's. Each server checks
    uploads as its own tenant's; its own files still verify."""
    _, other_keys = other
    a_planner = keys.create(PLANNER).token
    a_auditor = keys.create(PLANNER, ["app", "operator"]).token
    b_auditor = other_keys.create(PLANNER, ["app", "operator"]).token
    with tenant_servers(kernel, keys, other) as (_, b_live, a, b):
        receipt = json.dumps(_erase(a, a_planner, a_auditor, "alice")["receipt"])
        exported = a.post("/v1/audit/export", headers=bearer(a_auditor), json={"format": "jsonl"})
        assert exported.status_code == 200, exported.text
        b_exported = b.post("/v1/audit/export", headers=bearer(b_auditor), json={"format": "jsonl"})
        assert b_exported.status_code == 200, b_exported.text
        a_on_a = _verify(a, a_auditor, receipt, "receipt")
        a_export_on_a = _verify(a, a_auditor, exported.text, "export")
        b_export_on_b = _verify(b, b_auditor, b_exported.text, "export")
        a_on_b = _verify(b, b_auditor, receipt, "receipt")
        a_export_on_b = _verify(b, b_auditor, exported.text, "export")
        console_a_on_b = _console_verify(b_live.url, b_auditor, receipt, "receipt")
        console_export_on_b = _console_verify(b_live.url, b_auditor, exported.text, "export")

    # Each tenant's own files verify on its own server.
    assert a_on_a["ok"] and "for tenant default" in a_on_a["detail"], a_on_a
    assert a_export_on_a["ok"], a_export_on_a
    assert b_export_on_b["ok"], b_export_on_b
    # A's receipt and A's export, on B's server: refused, naming both tenants.
    assert not a_on_b["ok"], a_on_b
    assert "'default'" in a_on_b["detail"] and repr(OTHER_TENANT) in a_on_b["detail"], a_on_b
    assert not a_export_on_b["ok"], a_export_on_b
    assert "'default'" in a_export_on_b["detail"], a_export_on_b
    for page in (console_a_on_b, console_export_on_b):
        assert page.status_code == 422, page.text
        assert "&#39;default&#39;" in page.text or "'default'" in page.text


def test_a_receipt_commits_to_the_subject_as_the_service_knows_it(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """Bug JR. The service finds a subject by its id with the surrounding blanks taken
    away (``check_subject_ref``): " alice " is alice. The receipt's commitment was over
    the id as the request spelt it, so alice's receipt, erased as " alice ", did not match
    ``--subject alice`` with the nonce given at erasure, and a resumed erasure (asked again
    as "alice") committed to another spelling than the request that began it. The
    commitment is over the id the subject is known by."""
    planner = keys.create(PLANNER).token
    operator = keys.create(PLANNER, ["app", "operator"]).token
    with (
        LiveServer(create_server(kernel, keys)) as live,
        httpx.Client(base_url=live.url, timeout=60) as http,
    ):
        answer = _erase(http, planner, operator, " alice ")
    nonce = bytes.fromhex(answer["subject_nonce_hex"])
    verify_subject_commitment(answer["receipt"], "alice", nonce)


def test_a_giant_single_field_upload_is_capped_before_the_csv_limit_moves(
    kernel: Uprof, keys: ApiKeyStore
) -> None:
    """``csv.field_size_limit`` is process-wide: a body over the server's cap is answered
    413 before any reader runs; one under it is refused with a reason (ok false, no 500),
    and the limit does not move (IY raised it to each line read; KY fixed it at import).
    (The server runs in this process: the limit is observable.)"""
    operator = keys.create(PLANNER, ["app", "operator"]).token
    before = csv.field_size_limit()
    with (
        LiveServer(create_server(kernel, keys)) as live,
        httpx.Client(base_url=live.url, timeout=120) as http,
    ):
        giant = "header," + "x" * (2 * 1024 * 1024)
        too_large = http.post(
            "/v1/audit/verify", headers=bearer(operator), json={"kind": "export", "content": giant}
        )
        after_refusal = csv.field_size_limit()
        # Past the column row, so the CSV reader reads the giant line (and refuses the row).
        line = "entry," + "x" * (700 * 1024)
        under = csv_line(CSV_COLUMNS) + line + "\n"
        answered = http.post(
            "/v1/audit/verify", headers=bearer(operator), json={"kind": "export", "content": under}
        )
    assert too_large.status_code == 413, too_large.text
    assert after_refusal == before
    assert answered.status_code == 200, answered.text
    assert answered.json()["ok"] is False and answered.json()["detail"]
    # KY: the limit is fixed at import to the line cap; no upload moves it.
    assert csv.field_size_limit() == before


def test_the_trail_verifier_names_the_tenant_an_export_is_filtered_on(
    kernel: Uprof, keys: ApiKeyStore, other: tuple[Uprof, ApiKeyStore], tmp_path: Path
) -> None:
    """Bug JS. On shared stores a tenant's export is filtered on its tenant (decision
    0089), and the log's key and origin are every tenant's; ``uprof audit verify`` said
    "verified: N entries, tree size …" of tenant A's trail with no word of the tenant, and
    nothing could ask for B's, so B's auditor handed A's trail took it for B's (IX for
    receipts, not for trails). The verdict names the filter's tenant, and ``--tenant``
    (``verify_export(..., tenant=)``) refuses a trail filtered on another tenant."""
    a_auditor = keys.create(PLANNER, ["app", "operator"]).token
    _, other_keys = other
    b_auditor = other_keys.create(PLANNER, ["app", "operator"]).token
    with tenant_servers(kernel, keys, other) as (_, _, a, b):
        b.post("/v1/audit/entries", headers=bearer(b_auditor), json={"limit": 1})
        exported = a.post("/v1/audit/export", headers=bearer(a_auditor), json={"format": "jsonl"})
        assert exported.status_code == 200, exported.text
        key = a.get("/v1/audit/key", headers=bearer(a_auditor)).json()
    trail = tmp_path / "trail.jsonl"
    trail.write_text(exported.text)
    pem = tmp_path / "audit.pem"
    pem.write_text(key["public_key_pem"])
    assert json.loads(exported.text.splitlines()[0])["filter"] == {"tenant": "default"}
    pinned = [str(trail), "--public-key", str(pem), "--origin", key["origin"]]
    runner = CliRunner()
    shown = runner.invoke(cli, ["audit", "verify", *pinned])
    theirs = runner.invoke(cli, ["audit", "verify", *pinned, "--tenant", OTHER_TENANT])
    own = runner.invoke(cli, ["audit", "verify", *pinned, "--tenant", "default"])
    assert shown.exit_code == 0 and 'tenant "default"' in " ".join(shown.output.split())
    assert theirs.exit_code == 1, theirs.output
    assert "verified" not in theirs.output.lower().replace("does not verify", "")
    assert "'default'" in " ".join(theirs.output.split()), theirs.output
    assert own.exit_code == 0, own.output


def test_receipts_of_every_scope_verify_with_the_subjects_nonce_and_tenant(
    kernel: Uprof, keys: ApiKeyStore, tmp_path: Path
) -> None:
    """IW held for what the service issues: a capture's erasure and a subject's (one
    method issues every scope's receipt, with a nonce of the one length) verify with the
    pinned key, the server's tenant and the subject's nonce, through the CLI as an auditor
    runs it; the nonce shortened or lengthened by a byte is refused with a reason."""
    planner = keys.create(PLANNER).token
    operator = keys.create(PLANNER, ["app", "operator"]).token
    with (
        LiveServer(create_server(kernel, keys)) as live,
        httpx.Client(base_url=live.url, timeout=60) as http,
    ):
        grant(http, planner, "bob")
        captured = http.post(
            "/v1/captures", headers=bearer(planner), json={"subject": "bob", **interaction("hi")}
        )
        assert captured.status_code in (200, 201, 202), captured.text
        capture_id = captured.json()["capture_id"]
        one = http.post(
            "/v1/governance/erasures/capture",
            headers=bearer(operator),
            json={"subject": "bob", "capture_id": capture_id},
        )
        assert one.status_code == 200, one.text
        whole = http.post(
            "/v1/governance/erasures/subject", headers=bearer(operator), json={"subject": "bob"}
        )
        assert whole.status_code == 200, whole.text
        key = http.get("/v1/audit/key", headers=bearer(operator)).json()
    runner = CliRunner()
    for answer in (one.json(), whole.json()):
        nonce = answer["subject_nonce_hex"]
        assert len(bytes.fromhex(nonce)) == 32
        path = tmp_path / f"receipt-{answer['receipt']['body']['request']['scope']}.json"
        path.write_text(json.dumps(answer["receipt"]))
        pem = path.with_suffix(".pem")
        pem.write_text(key["public_key_pem"])
        pinned = [str(path), "--public-key", str(pem), "--origin", key["origin"]]
        asked = ["--tenant", "default", "--subject", "bob", "--nonce", nonce]
        checked = runner.invoke(cli, ["audit", "verify-receipt", *pinned, *asked])
        assert checked.exit_code == 0 and "subject matches" in checked.output, checked.output
        for wrong in (nonce[:-2], nonce + "00"):
            refused = runner.invoke(
                cli, ["audit", "verify-receipt", *pinned, "--subject", "bob", "--nonce", wrong]
            )
            assert refused.exit_code == 1 and "32 random bytes" in refused.output, refused.output
