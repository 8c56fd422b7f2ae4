"""Administrative writes leave an audit entry: API keys issued and revoked, KEK rotations,
backups and restores, rebuilds and maintenance runs, and every subject key at its creation.

Until 2026-12-05 ``uprof apps create`` and ``uprof apps revoke`` wrote the key store
directly and ``uprof keys rotate``, ``uprof backup`` and ``uprof restore`` recorded
nothing: the log that promises every write held no trace of who was given access, when
it was taken back, or when the stores were copied out or replaced; and a subject's data
key was logged only at its destruction (``key.destroyed``), so nothing in the log tied a
receipt's ``dek_commitment`` to a key's creation. Each is now recorded (ids, roles,
counts, commitments; never a key's secret), and the trail with them still verifies.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from domain.principal import Principal, PrincipalKind
from domain.values import IntentProposal, ProposalBatch
from tests.api.conftest import api_settings, build_kernel
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent
from uprof.cli.main import app as cli
from uprof.facade import Facade
from uprof.kernel import Uprof

CLI_LABEL = "operator:local#cli"


def cli_for(backend: Backend):  # type: ignore[no-untyped-def]
    runner = CliRunner()
    base = ["--data-dir", str(backend.data_dir / "data"), "--embedder", "hashing"]
    if backend.kind == "postgres":
        base += ["--database-url", backend.url]

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, [*base, *args])
        assert result.exit_code == code, result.output
        return result.output

    return run


def trail(backend: Backend) -> list[tuple[dict[str, Any], str]]:
    kernel = build_kernel(api_settings(backend, background=False))
    try:
        return [(e.entry, e.entry_json) for e in kernel.audit_log.entries()]
    finally:
        kernel.close()


def verifies(run: Any, tmp: Path) -> None:
    out, pem = tmp / "trail.jsonl", tmp / "audit.pem"
    run("audit", "export", "--out", str(out))
    run("audit", "public-key", "--out", str(pem))
    run("audit", "verify", str(out), "--public-key", str(pem))


def test_api_keys_issued_and_revoked_are_audited_without_their_secret(
    backend: Backend, tmp_path: Path
) -> None:
    run = cli_for(backend)
    out = run("apps", "create", "app:x", "--role", "app", "--role", "operator")
    token = out.strip().splitlines()[-1]
    key_id = token.split("_")[1]
    run("apps", "revoke", key_id)
    run("apps", "revoke", key_id, code=5)  # no live key: nothing changed, nothing recorded
    entries = trail(backend)
    issued = [e for e, _ in entries if e["action"] == "apikey.issued"]
    revoked = [e for e, _ in entries if e["action"] == "apikey.revoked"]
    assert len(issued) == 1 and len(revoked) == 1
    assert issued[0]["api_key_id"] == revoked[0]["api_key_id"] == key_id
    assert issued[0]["app_id"] == revoked[0]["app_id"] == "app:x"
    assert issued[0]["roles"] == ["app", "operator"]
    assert issued[0]["principal"] == revoked[0]["principal"] == CLI_LABEL
    secret = token.split("_", 2)[2]
    assert not any(secret in text or token in text for _, text in entries)
    verifies(run, tmp_path)


def test_kek_rotation_backup_and_restore_are_audited(backend: Backend, tmp_path: Path) -> None:
    run = cli_for(backend)
    for subject in ("ana", "bo"):
        run(
            "consent",
            "grant",
            "--subject",
            subject,
            "--app",
            "app:planner",
            "--category",
            "*",
            "--purpose",
            "personalization",
            "--collected-by",
            "form:1",
        )
    run("keys", "rotate")
    run("backup", "--to", str(tmp_path / "bk"))
    run("restore", "--from", str(tmp_path / "bk"))
    entries = [e for e, _ in trail(backend)]
    by_action = {e["action"]: e for e in entries}
    rotated = by_action["kek.rotated"]
    assert rotated["principal"] == CLI_LABEL and rotated["counts"]["deks_rewrapped"] >= 1
    written = by_action["backup.written"]
    assert written["principal"] == CLI_LABEL
    assert written["tree_size"] >= 1 and written["counts"]["files"] >= 1
    restored = by_action["backup.restored"]
    assert restored["principal"] == CLI_LABEL and restored["tree_size"] == written["tree_size"]
    # The restore keeps the live log, which extends the backup's: both entries are in it,
    # the backup's first.
    actions = [e["action"] for e in entries]
    assert actions.index("backup.written") < actions.index("backup.restored")
    verifies(run, tmp_path)
    assert json.dumps(entries).count("kek.rotated") == 1


def test_a_subject_key_is_audited_at_creation_with_the_commitment_its_destruction_cites(
    kernel: Uprof,
) -> None:
    consent(kernel, "alice")
    consent(kernel, "alice")  # the subject exists: no second key
    result = kernel.erase_subject("alice")
    kernel.recreate_subject("alice")
    entries = [e.entry for e in kernel.audit_log.entries()]
    created = [e for e in entries if e["action"] == "key.created"]
    destroyed = [e for e in entries if e["action"] == "key.destroyed"]
    assert len(created) == 2 and len(destroyed) == 1
    assert created[0]["key_version"] == destroyed[0]["key_version"] == 1
    assert created[0]["dek_commitment"] == destroyed[0]["dek_commitment"]
    assert created[0]["subject_ref"] == destroyed[0]["subject_ref"]
    cited = [
        a["dek_commitment"]
        for a in result.receipt["body"]["actions"]
        if a["type"] == "dek_destroyed"
    ]
    assert cited == [created[0]["dek_commitment"]]
    # The re-created subject's key is another key, under its new pseudonym.
    assert created[1]["dek_commitment"] != created[0]["dek_commitment"]
    assert created[1]["subject_ref"] != created[0]["subject_ref"]


def test_a_rebuild_and_a_maintenance_run_that_changed_something_are_audited(
    kernel: Uprof, clock: FakeClock
) -> None:
    door = Facade(kernel, Principal.local_operator(kernel.subjects.tenant))
    consent(kernel, "alice")
    batch = ProposalBatch(
        (IntentProposal("renew the passport", (), expires_at=clock.now() + timedelta(days=1)),),
        author="agent",
        owner_agent="agent:one",
        app_id=APP,
    )
    kernel.submit_proposals("alice", batch)
    assert door.run_maintenance()["intents_expired"] == 0  # nothing to do: no write, no entry
    clock.advance(days=2)
    assert door.run_maintenance()["intents_expired"] == 1
    door.rebuild()
    entries = [e.entry for e in kernel.audit_log.entries()]
    maintained = [e for e in entries if e["action"] == "maintenance.ran"]
    assert len(maintained) == 1
    assert maintained[0]["counts"]["intents_expired"] == 1
    assert maintained[0]["principal"] == CLI_LABEL
    [rebuilt] = [e for e in entries if e["action"] == "projections.rebuilt"]
    assert rebuilt["principal"] == CLI_LABEL and rebuilt["counts"]["events"] >= 1


def test_session_and_identifier_bindings_are_audited_without_the_binding(kernel: Uprof) -> None:
    # A binding changes how the app's later requests find the subject: a write, on the log,
    # with the subject's pseudonym and the app, never the session id or the identifier.
    consent(kernel, "alice")
    door = Facade(
        kernel, Principal(kernel.subjects.tenant, APP, "k1", PrincipalKind.APP, frozenset({"app"}))
    )
    door.register_session("sess-4471", "alice")
    door.register_identifier("alice.w@example.org", "alice")
    entries = list(kernel.audit_log.entries())
    bound = [e.entry for e in entries if e.entry["action"] == "alias.bound"]
    assert [b["reason_code"] for b in bound] == ["session", "identifier"]
    assert {b["app_id"] for b in bound} == {APP}
    assert {b["subject_ref"] for b in bound} == {kernel.subjects.pseudonym("alice")}
    assert not any("4471" in e.entry_json or "example.org" in e.entry_json for e in entries)
