"""Consistency proofs served over REST and the CLI, on SQLite and PostgreSQL.

An auditor (or a receipt holder, through one) who kept a checkpoint asks for a proof that
the log only grew since; an app without the audit right is refused and learns nothing of
the log; a copy of the deployment whose log was rewritten below the checkpoint and re-signed
serves proofs that fail offline.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from audit.canonical import canonical_bytes
from audit.checkpoint import sign_checkpoint
from audit.errors import VerificationError
from audit.proofs import parse_proof, verify_proof
from tests.api.conftest import Apps, bearer, grant, interaction
from tests.audit.test_proofs import _tamper
from tests.conftest import Backend
from uprof.cli.main import app as cli
from uprof.kernel import Uprof


def _key(http: httpx.Client, token: str) -> dict[str, Any]:
    answer = http.get("/v1/audit/key", headers=bearer(token))
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _activity(http: httpx.Client, apps: Apps, lines: int = 3) -> None:
    for i in range(lines):
        ack = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction(f"I want to learn the cello {i}")},
        )
        assert ack.status_code == 201, ack.text


def test_an_auditor_proves_the_log_grew_from_a_checkpoint_it_kept(
    http: httpx.Client, apps: Apps
) -> None:
    grant(http, apps.planner)
    # Any app may keep the key; a checkpoint is for the audit right (it sizes the log).
    held = _key(http, apps.planner_operator)
    old_size = int(held["checkpoint"].split("\n")[1])
    _activity(http, apps)
    answer = http.post(
        "/v1/audit/proof",
        headers=bearer(apps.planner_operator),
        json={"old_size": old_size, "leaf_index": old_size - 1},
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    document = parse_proof(answer.content)  # the body is the file, byte for byte
    report = verify_proof(
        answer.content, held["public_key_pem"], held["origin"], trusted=held["checkpoint"]
    )
    assert report.old_size == old_size < report.tree_size
    assert report.leaf_index == old_size - 1 and document["inclusion"] is not None

    served = http.post(
        "/v1/audit/entries",
        headers=bearer(apps.planner_operator),
        json={"action": "audit.proof_served"},
    ).json()["items"]
    assert len(served) == 1
    entry = served[0]["entry"]
    assert entry["counts"] == {"old_size": old_size, "leaf_index": old_size - 1}
    assert entry["tree_size"] == report.tree_size  # recorded after the checkpoint it served
    assert served[0]["leaf_index"] >= report.tree_size
    assert entry["principal"].startswith("app:planner#")


BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"old_size": -1}, "old_size"),
    ({"old_size": 0}, "old_size"),
    ({"old_size": "3"}, "old_size"),
    ({"old_size": 3.5}, "old_size"),
    ({"old_size": 3.0}, "old_size"),
    ({"old_size": True}, "old_size"),
    ({"old_size": None}, "old_size"),
    ({}, "old_size"),
    ({"old_size": 2**64}, "old_size"),
    ({"old_size": 10**9}, "old_size"),  # beyond the log
    ({"old_size": 1, "leaf_index": -1}, "leaf_index"),
    ({"old_size": 1, "leaf_index": "0"}, "leaf_index"),
    ({"old_size": 1, "leaf_index": 10**9}, "leaf_index"),  # beyond the log
    ({"old_size": 1, "from_app": "app:planner"}, "from_app"),
]


def test_bad_sizes_are_refused_naming_the_field(http: httpx.Client, apps: Apps) -> None:
    grant(http, apps.planner)
    for body, field in BAD_BODIES:
        refused = http.post("/v1/audit/proof", headers=bearer(apps.planner_operator), json=body)
        assert refused.status_code == 422, (body, refused.text)
        fields = [problem["field"] for problem in refused.json()["error"]["fields"]]
        assert any(field in f for f in fields), (body, fields)
    not_json = http.post(
        "/v1/audit/proof",
        headers={**bearer(apps.planner_operator), "Content-Type": "application/json"},
        content=b"{old_size: 1}",
    )
    assert not_json.status_code == 422


def test_an_app_without_the_audit_right_is_refused_and_learns_nothing(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    grant(http, apps.planner)
    size = int(_key(http, apps.planner_operator)["checkpoint"].split("\n")[1])

    def answers(token: str) -> list[tuple[int, str]]:
        out = []
        for body in ({"old_size": 1}, {"old_size": size}, {"old_size": 10**9, "leaf_index": 7}):
            r = http.post("/v1/audit/proof", headers=bearer(token), json=body)
            out.append((r.status_code, r.text))
        return out

    no_role = answers(apps.planner)  # an app key: no operator role
    assert {status for status, _ in no_role} == {403}
    assert len({text for _, text in no_role}) == 1  # the same answer whatever the sizes
    assert "role_required" in no_role[0][1] and "checkpoint" not in no_role[0][1]
    assert http.post("/v1/audit/proof", json={"old_size": 1}).status_code == 401

    # An operator key whose deployment took the operators' audit right away.
    kernel.policy_revoke(
        requested_by="operator:local#cli",
        role="role:operator",
        actions=["audit"],
        categories=["any"],
        purpose="compliance",
    )
    denied = answers(apps.planner_operator)
    assert {status for status, _ in denied} == {403}
    assert len({text for _, text in denied}) == 1
    assert "permission_denied" in denied[0][1] and "checkpoint" not in denied[0][1]
    refusals = [
        e.entry
        for e in kernel.audit_entries(action="access.denied")
        if e.entry.get("reason_code") == "audit"
    ]
    assert len(refusals) == 3  # each refusal audited
    assert not list(kernel.audit_entries(action="audit.proof_served"))


# --- The CLI ---------------------------------------------------------------------------------


def cli_for(backend: Backend, data: Path | None = None):  # type: ignore[no-untyped-def]
    runner = CliRunner()
    base = ["--data-dir", str(data or backend.data_dir / "data"), "--embedder", "hashing"]
    if backend.kind == "postgres":
        base += ["--database-url", backend.url]

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, [*base, *args])
        assert result.exit_code == code, result.output
        return " ".join(result.output.split())  # Rich wraps long lines

    return run


def test_the_cli_proves_and_verifies_and_a_rewritten_copy_fails(
    backend: Backend, tmp_path: Path
) -> None:
    run = cli_for(backend)
    pem, old, proof = tmp_path / "audit.pem", tmp_path / "old.note", tmp_path / "proof.json"
    for n in range(4):
        run("apps", "create", f"app:a{n}")  # audited writes
    run("audit", "public-key", "--out", str(pem))
    assert "tree size" in run("audit", "checkpoint", "--out", str(old))
    old_size = int(old.read_text().split("\n")[1])
    run("apps", "create", "app:later")
    out = run("audit", "prove", "--from", str(old), "--out", str(proof))
    assert f"extends {old_size}" in out
    verified = run(
        "audit",
        "verify-proof",
        str(proof),
        "--public-key",
        str(pem),
        "--trusted-checkpoint",
        str(old),
    )
    assert f"extends the trusted checkpoint of size {old_size}" in verified
    run("audit", "prove", "--old-size", "2", "--leaf-index", "1", "--out", str(proof))
    assert json.loads(proof.read_text())["inclusion"]["leaf_index"] == 1

    # Hostile inputs, each named.
    assert "old_size" in run("audit", "prove", "--old-size", "0", "--out", str(proof), code=2)
    assert "old_size" in run("audit", "prove", "--old-size", "-3", "--out", str(proof), code=2)
    assert "beyond the log" in run(
        "audit", "prove", "--old-size", "100000", "--out", str(proof), code=2
    )
    assert "--old-size" in run("audit", "prove", "--old-size", "two", "--out", str(proof), code=2)
    run("audit", "prove", "--old-size", "2", "--from", str(old), "--out", str(proof), code=2)
    run("audit", "prove", "--out", str(proof), code=2)
    foreign = tmp_path / "foreign.note"
    foreign.write_text(
        sign_checkpoint(Ed25519PrivateKey.generate(), "other.org/audit", 1, b"\0" * 32)
    )
    assert "not a checkpoint of this log" in run(
        "audit", "prove", "--from", str(foreign), "--out", str(proof), code=1
    )
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"body": 1, "body": 2}')
    assert "duplicate object key" in run(
        "audit", "prove", "--from", str(garbage), "--out", str(proof), code=1
    )
    run("audit", "prove", "--from", str(old), "--out", str(proof))
    other_pem = tmp_path / "other.pem"
    from audit.keys import public_key_pem

    other_pem.write_bytes(public_key_pem(Ed25519PrivateKey.generate()))
    pinned = ["--trusted-checkpoint", str(old)]
    for bad, reason in (
        (["--public-key", str(other_pem)], "no signature by the pinned key"),
        (["--public-key", str(pem), "--origin", "uprof.local/shadow"], "origin"),
    ):
        assert reason in run("audit", "verify-proof", str(proof), *bad, *pinned, code=1)
    document = json.loads(proof.read_text())
    document["consistency"]["old_size"] = old_size + 1
    tampered = tmp_path / "tampered.json"
    tampered.write_bytes(canonical_bytes(document) + b"\n")
    assert "does not verify" in run(
        "audit", "verify-proof", str(tampered), "--public-key", str(pem), *pinned, code=1
    )

    # A copy of the deployment whose log is rewritten below the checkpoint and re-signed.
    if backend.kind == "sqlite":
        copy = tmp_path / "copy"
        shutil.copytree(backend.data_dir / "data", copy / "data")
        shutil.copytree(backend.data_dir / "data.keys", copy / "data.keys")
        views_url, run_copy = (
            f"sqlite:///{copy / 'data' / 'views.sqlite'}",
            cli_for(backend, copy / "data"),
        )
        keys_of_copy = copy / "data.keys"
    else:
        views_url, run_copy, keys_of_copy = backend.url, run, backend.data_dir / "data.keys"
    engine = sa.create_engine(views_url)
    try:
        with engine.connect() as conn:
            text = conn.exec_driver_sql(
                "SELECT entry_json FROM audit_entries WHERE leaf_index = 1"
            ).scalar_one()
        entry = json.loads(text)
        entry["reason_code"] = "rewritten"
        _tamper(engine, {1: canonical_bytes(entry).decode()}, rehash_tree=True)
    finally:
        engine.dispose()
    rewritten = tmp_path / "rewritten.json"
    # The deployment itself refuses to sign the rewritten tree: its key folder keeps the
    # checkpoint it signed (bug HE)...
    refused = run_copy("audit", "prove", "--from", str(old), "--out", str(rewritten), code=1)
    assert "rewritten or replaced" in refused and not rewritten.exists(), refused
    # ...which whoever rewrote the log with the key folder in hand removes too.
    (keys_of_copy / "audit-checkpoint.note").unlink()
    failed = run_copy("audit", "prove", "--from", str(old), "--out", str(rewritten), code=1)
    assert "does not extend" in failed
    assert "does not extend the trusted checkpoint" in run(
        "audit", "verify-proof", str(rewritten), "--public-key", str(pem), *pinned, code=1
    )
    with pytest.raises(VerificationError, match="does not extend"):
        verify_proof(
            rewritten.read_bytes(), pem.read_bytes(), "uprof.local/audit", trusted=old.read_text()
        )
    if backend.kind == "sqlite":  # the honest deployment still proves
        run("audit", "prove", "--from", str(old), "--out", str(proof))


def test_a_receipt_holder_gets_a_proof_that_the_log_still_holds_the_receipt(
    backend: Backend, tmp_path: Path
) -> None:
    run = cli_for(backend)
    pem, receipt, proof = tmp_path / "audit.pem", tmp_path / "receipt.json", tmp_path / "p.json"
    grant = ("consent", "grant", "--subject", "ana", "--app", "app:planner", "--category", "*")
    run(*grant, "--purpose", "personalization")
    run("erase", "subject", "--subject", "ana", "--out", str(receipt))
    run("audit", "public-key", "--out", str(pem))
    run("apps", "create", "app:later")
    leaf = json.loads(receipt.read_text())["inclusion"]["leaf_index"]
    assert f"entry {leaf} included" in run(
        "audit", "prove", "--from", str(receipt), "--out", str(proof)
    )
    pinned = ["--public-key", str(pem), "--trusted-checkpoint", str(receipt)]
    assert f"entry {leaf} is in it" in run("audit", "verify-proof", str(proof), *pinned)
    # Another entry than the receipt's: proven against the receipt's checkpoint alone.
    run("audit", "prove", "--from", str(receipt), "--leaf-index", "0", "--out", str(proof))
    assert "not the receipt's leaf" in run("audit", "verify-proof", str(proof), *pinned, code=1)
    note = tmp_path / "receipt.note"
    note.write_text(json.loads(receipt.read_text())["checkpoint"])
    run(
        "audit",
        "verify-proof",
        str(proof),
        "--public-key",
        str(pem),
        "--trusted-checkpoint",
        str(note),
    )


APPENDER = """
import sys
from pathlib import Path
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for

kind, url, folder, stop = sys.argv[1:5]
kernel = build_kernel(settings_for(Backend(kind, url, Path(folder))), FakeClock())
try:
    batches = 0
    while not Path(stop).exists():
        entry = ("access.denied", {"app_id": "app:elsewhere", "reason_code": "read"})
        kernel.audit.record_many([entry] * (1 + batches % 5))
        batches += 1
        if batches == 1:
            print("appending", flush=True)
finally:
    kernel.close()
print(batches, flush=True)
"""


def test_proofs_served_over_rest_while_another_process_appends_verify(
    backend: Backend, http: httpx.Client, apps: Apps, tmp_path: Path
) -> None:
    from tests.children import PythonChild

    held = _key(http, apps.planner_operator)
    old_size = int(held["checkpoint"].split("\n")[1])
    stop = tmp_path / "stop"
    child = PythonChild(
        APPENDER, backend.kind, backend.url, str(backend.data_dir), str(stop), stream_stdout=True
    )
    sizes: list[int] = []
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "appending"
        while len(set(sizes)) < 4:
            answer = http.post(
                "/v1/audit/proof",
                headers=bearer(apps.planner_operator),
                json={"old_size": old_size, "leaf_index": old_size - 1},
            )
            assert answer.status_code == 200, answer.text
            report = verify_proof(
                answer.content, held["public_key_pem"], held["origin"], trusted=held["checkpoint"]
            )
            sizes.append(report.tree_size)
            assert child.poll() is None
    finally:
        stop.touch()
        out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    assert int(out.split()[-1]) > 1
    assert sizes == sorted(sizes)  # each proof is against a checkpoint no older than the last


def test_the_sdk_fetches_the_proof_file_over_http_and_embedded(
    server: Any, http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    import asyncio

    from uprof.sdk import AsyncClient, Client, InvalidRequestError, PermissionDeniedError

    grant(http, apps.planner)
    held = _key(http, apps.planner_operator)
    old_size = int(held["checkpoint"].split("\n")[1])
    _activity(http, apps, lines=2)
    pinned = (held["public_key_pem"], held["origin"])

    def check(raw: bytes) -> None:
        verify_proof(raw, *pinned, trusted=held["checkpoint"])

    with Client(server.url, apps.planner_operator) as client:
        check(client.audit_proof(old_size, leaf_index=0))
        with pytest.raises(InvalidRequestError):
            client.audit_proof(0)  # refused before it is sent, naming the field
        with pytest.raises(InvalidRequestError):
            client.audit_proof(10**9)  # refused by the server: beyond the log
    with Client(server.url, apps.planner) as client, pytest.raises(PermissionDeniedError):
        client.audit_proof(old_size)

    async def remote() -> bytes:
        async with AsyncClient(server.url, apps.planner_operator) as client:
            return await client.audit_proof(old_size)

    check(asyncio.run(remote()))
    embedded = Client.embedded(kernel, "app:planner", roles=("app", "operator"))
    try:
        check(embedded.audit_proof(old_size, leaf_index=old_size - 1))
    finally:
        embedded.close()


def test_a_stored_entry_holding_a_float_is_an_integrity_error_not_the_callers(
    http: httpx.Client, apps: Apps, kernel: Uprof
) -> None:
    """An entry row rewritten behind the log's back to hold a float: the proof of that entry
    is refused as the log's own integrity failure (500, the row named), not as the caller's
    input (422), and no ``audit.proof_served`` is recorded for a proof never served."""
    grant(http, apps.planner)
    _activity(http, apps, lines=1)
    leaf = 1
    engine = kernel.audit_log._engine
    with engine.connect() as conn:
        text = conn.exec_driver_sql(
            f"SELECT entry_json FROM audit_entries WHERE leaf_index = {leaf}"
        ).scalar_one()
    entry = json.loads(text)
    entry["counts"] = {"items": 1.5}
    _tamper(engine, {leaf: json.dumps(entry, sort_keys=True)}, rehash_tree=True)
    refused = http.post(
        "/v1/audit/proof",
        headers=bearer(apps.planner_operator),
        json={"old_size": 1, "leaf_index": leaf},
    )
    assert refused.status_code == 500, refused.text
    error = refused.json()["error"]
    assert error["code"] == "internal" and error["fields"] == []
    assert f"leaf_index {leaf}" in error["message"]
    assert not list(kernel.audit_entries(action="audit.proof_served"))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_checkpoint_larger_than_the_log_shows_it_rolled_back_not_a_bad_input(
    backend: Backend, tmp_path: Path
) -> None:
    """A deployment put back from an older copy of its data folder (same key) is shown a
    checkpoint its own key signed when the log was longer: that is the log rolled back,
    which `prove --from` must say (exit 1), not refuse as a caller's bad --old-size
    (exit 2, "beyond the log", on 6e366f0). (SQLite: the copy is a copy of the folder.)"""
    run = cli_for(backend)
    run("apps", "create", "app:a0")
    older = tmp_path / "older"
    shutil.copytree(backend.data_dir / "data", older / "data")
    shutil.copytree(backend.data_dir / "data.keys", older / "data.keys")
    for n in range(1, 4):
        run("apps", "create", f"app:a{n}")
    held = tmp_path / "held.note"
    run("audit", "checkpoint", "--out", str(held))
    size = int(held.read_text().split("\n")[1])
    out = cli_for(backend, older / "data")(
        "audit", "prove", "--from", str(held), "--out", str(tmp_path / "p.json"), code=1
    )
    assert "does not extend" in out and f"{size}" in out and "rolled back" in out, out
    assert not (tmp_path / "p.json").exists()
