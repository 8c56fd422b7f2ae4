"""Attacks on what auditors and data subjects verify offline, by a party crafting the inputs
(decision 0151-verifier-attacks). Random mutation is covered by test_export.py,
test_receipts.py and test_verifier_attacks.py; these are chosen inputs: a receipt shown as
another subject's or another tenant's, another deployment's key or history, two signed trees
that disagree, files that read one way to a person and another to the verifier, and the CLI's
verdict (its exit code and whether it says "verified") on each.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from audit.check import check_upload
from audit.checkpoint import sign_checkpoint
from audit.errors import VerificationError
from audit.export import export_jsonl
from audit.keyring import extend_history, genesis_history, parse_key_history
from audit.keys import public_key_pem
from audit.log import AuditLog
from audit.receipts import (
    NONCE_BYTES,
    issue_erasure_receipt,
    new_commitment_nonce,
    parse_receipt,
    subject_commitment,
    verify_receipt,
    verify_subject_commitment,
)
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN
from tests.audit.test_log import fill
from tests.audit.test_verifier_attacks import ACTIONS, _shadow_log, issue
from uprof.cli.main import app as cli
from uprof.schemas.api import AuditExportSummary

TIME = "2025-01-01T00:00:00.000000Z"


def issue_for(log: AuditLog, subject: str, nonce: bytes, tenant: str = "acme") -> dict[str, Any]:
    """A subject erasure's receipt committing to ``subject`` as its nonce makes it."""
    return issue(log, commitment=subject_commitment(subject, nonce), tenant=tenant)


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["audit", *args])


def refused(result: Any) -> bool:
    """A CLI refusal: exit code 1 with a reason (no traceback), never a word of success."""
    return (
        result.exit_code == 1
        and isinstance(result.exception, SystemExit)
        and "verified" not in result.output.lower().replace("does not verify", "")
    )


# --- A receipt shown as another subject's ----------------------------------------------------


def test_a_receipt_names_one_subject_not_every_prefix_of_it(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """SHA-256(subject_id || nonce) with a nonce of any length lets the bytes move across
    the boundary: the receipt of "ana1" (nonce N) also matched "ana" with nonce "1" || N, and
    "an" with "a1" || N, so one erasure could be handed to several subjects as theirs."""
    nonce = new_commitment_nonce()
    receipt = issue_for(sqlite_log, "ana1", nonce)
    verify_subject_commitment(receipt, "ana1", nonce)  # the subject's own check passes
    for claimed, moved in (("ana", b"1"), ("an", b"a1"), ("", b"ana1")):
        with pytest.raises(VerificationError):
            verify_subject_commitment(receipt, claimed, moved + nonce)

    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    pinned = ["--public-key", str(key), "--origin", ORIGIN]
    own = run_cli("verify-receipt", str(path), *pinned, "--subject", "ana1", "--nonce", nonce.hex())
    assert own.exit_code == 0 and "subject matches" in own.output, own.output
    other = run_cli(
        "verify-receipt", str(path), *pinned, "--subject", "ana", "--nonce", (b"1" + nonce).hex()
    )
    assert refused(other), other.output
    assert "subject matches" not in other.output


def test_the_issuer_commits_with_a_nonce_of_the_one_length(sqlite_log: AuditLog) -> None:
    """What the verifier refuses, the issuer never makes (the same function decides)."""
    for size in (16, NONCE_BYTES - 1, NONCE_BYTES + 1):
        with pytest.raises(Exception, match=f"{NONCE_BYTES} random bytes"):
            subject_commitment("ana", os.urandom(size))
    assert len(new_commitment_nonce()) == NONCE_BYTES


# --- A receipt shown as another tenant's -----------------------------------------------------


def test_a_receipt_of_another_tenant_is_told_apart(sqlite_log: AuditLog, tmp_path: Path) -> None:
    """Tenants on one set of stores share the log, its key and its origin: a receipt of
    tenant globex verified for acme's auditor with "receipt verified" and no word of the
    tenant, and nothing could ask for acme's. The verdict names the tenant, and --tenant
    (``verify_receipt(..., tenant=)``) refuses another's."""
    receipt = issue_for(sqlite_log, "ana", new_commitment_nonce(), tenant="globex")
    verify_receipt(receipt, sqlite_log.public_key, origin=ORIGIN, tenant="globex")
    with pytest.raises(VerificationError, match="for tenant 'globex', not 'acme'"):
        verify_receipt(receipt, sqlite_log.public_key, origin=ORIGIN, tenant="acme")

    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    pinned = ["--public-key", str(key), "--origin", ORIGIN]
    shown = run_cli("verify-receipt", str(path), *pinned)
    assert shown.exit_code == 0 and 'tenant "globex"' in " ".join(shown.output.split())
    asked = run_cli("verify-receipt", str(path), *pinned, "--tenant", "acme")
    assert refused(asked) and "not 'acme'" in " ".join(asked.output.split()), asked.output
    assert run_cli("verify-receipt", str(path), *pinned, "--tenant", "globex").exit_code == 0
    # The upload check (POST /v1/audit/verify, the console) names it too.
    checked = check_upload(path.read_bytes(), "receipt", sqlite_log.public_key, ORIGIN)
    assert checked.ok and "for tenant globex" in checked.detail


# --- What held: a file that reads one way to a person and another to the verifier ------------


def _receipt_file(log: AuditLog, tmp_path: Path, **kw: Any) -> tuple[dict[str, Any], Path, Path]:
    receipt = issue_for(log, "ana", new_commitment_nonce(), **kw)
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt, indent=1))
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(log.public_key))
    return receipt, path, key


def test_duplicate_keys_are_refused_by_every_reader(sqlite_log: AuditLog, tmp_path: Path) -> None:
    """Python keeps the last of two equal keys, a person (or another reader) the first: the
    receipt, the key history, the proof document and every export line refuse them."""
    receipt, _, key = _receipt_file(sqlite_log, tmp_path)
    text = json.dumps(receipt)
    shown = text.replace('"tenant": "acme"', '"tenant": "globex", "tenant": "acme"')
    assert shown != text
    with pytest.raises(VerificationError, match="duplicate object key 'tenant'"):
        parse_receipt(shown)
    history = json.dumps(genesis_history(Ed25519PrivateKey.generate(), TIME))
    with pytest.raises(VerificationError, match="duplicate object key 'format'"):
        parse_key_history(history.replace('{"format"', '{"format": "x", "format"', 1))
    trail = tmp_path / "trail.jsonl"
    export_jsonl(sqlite_log, trail)
    lines = trail.read_text().splitlines()
    lines[1] = lines[1].replace('"kind":"entry"', '"kind":"trailer","kind":"entry"')
    with pytest.raises(VerificationError, match="duplicate object key 'kind'") as bad:
        verify_export(lines, sqlite_log.public_key, ORIGIN)
    assert bad.value.line_number == 2
    doubled = tmp_path / "doubled.json"
    doubled.write_text(shown)
    assert refused(run_cli("verify-receipt", str(doubled), "--public-key", str(key)))


def test_unicode_is_compared_as_signed_not_as_shown(sqlite_log: AuditLog, tmp_path: Path) -> None:
    """The signature covers the value (RFC 8785 of the parsed body): an escaped spelling of
    the same text verifies, the same-looking text in another normal form (NFD) does not.
    (A tenant outside the log's token shape, such as "caf\u00e9", is refused by the issuer.)"""
    receipt = issue_erasure_receipt(
        sqlite_log,
        request_id="req-1",
        received_at="2025-01-01T09:00:00Z",
        basis="Art. 17 RGPD, d\u00e9cision du 1er mars",
        scope="subject",
        tenant="acme",
        subject_commitment=subject_commitment("ana", new_commitment_nonce()),
        actions=ACTIONS,
        residual={"note": "caf\u00e9"},
    )
    escaped = json.dumps(receipt, ensure_ascii=True)
    raw = json.dumps(receipt, ensure_ascii=False)
    assert "\\u00e9" in escaped and "\u00e9" in raw
    for text in (escaped, raw):
        verify_receipt(parse_receipt(text.encode()), sqlite_log.public_key, origin=ORIGIN)
    decomposed = raw.replace("caf\u00e9", "cafe\u0301")
    assert decomposed != raw
    with pytest.raises(VerificationError, match="signature does not verify"):
        verify_receipt(parse_receipt(decomposed.encode()), sqlite_log.public_key, origin=ORIGIN)
    with pytest.raises(Exception, match="tenant must be a token"):
        issue_for(sqlite_log, "ana", new_commitment_nonce(), tenant="caf\u00e9")


# --- What held: another deployment's receipt, key or history ---------------------------------


def test_another_deployments_receipt_key_or_history_vouches_for_nothing(
    sqlite_log: AuditLog, signing_key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    """Deployment B uses the same origin (the default one is shared by every install) and
    the same tenant name; the verifier pins A's key, or A's key with a history."""
    other_key = Ed25519PrivateKey.generate()
    other, engine = _shadow_log(tmp_path / "b.sqlite", other_key, ORIGIN)
    try:
        theirs = issue_for(other, "ana", new_commitment_nonce())
    finally:
        engine.dispose()
    ours = genesis_history(signing_key, TIME)
    rotated = Ed25519PrivateKey.generate()
    ours = extend_history(ours, signing_key, rotated, "2025-02-01T00:00:00.000000Z")
    history_b = genesis_history(other_key, TIME)
    for public, history in ((sqlite_log.public_key, None), (sqlite_log.public_key, ours)):
        with pytest.raises(VerificationError, match=r"issuer\.key_id is not the id"):
            verify_receipt(theirs, public, origin=ORIGIN, key_history=history)
    with pytest.raises(VerificationError, match="not in this key history"):
        verify_receipt(theirs, sqlite_log.public_key, origin=ORIGIN, key_history=history_b)
    # B's key claimed under A's id: the id picks A's key, whose check fails.
    forged = json.loads(json.dumps(theirs))
    forged["body"]["issuer"]["key_id"] = ours["keys"][0]["key_id"]
    with pytest.raises(VerificationError, match="signature does not verify"):
        verify_receipt(forged, sqlite_log.public_key, origin=ORIGIN, key_history=ours)
    # The 4-byte note key id, or an id of another length, as the issuer's key id.
    for wrong in (theirs["checkpoint"].split(" ")[-1][:8], "", "00" * 33):
        forged["body"]["issuer"]["key_id"] = wrong
        with pytest.raises(VerificationError):
            verify_receipt(forged, sqlite_log.public_key, origin=ORIGIN, key_history=ours)
    # B's key spliced in front of A's history: A's acceptance covers the record before it.
    spliced = genesis_history(other_key, TIME)
    spliced["keys"].append({**ours["keys"][0], "seq": 1})
    with pytest.raises(VerificationError):
        verify_receipt(theirs, sqlite_log.public_key, origin=ORIGIN, key_history=spliced)

    # Through the CLI: B's receipt, B's history and B's checkpoint as trusted are refused.
    paths = {}
    for name, content in (
        ("theirs.json", json.dumps(theirs)),
        ("history-b.json", json.dumps(history_b)),
        ("note-b.txt", theirs["checkpoint"]),
        ("a.pem", public_key_pem(sqlite_log.public_key).decode()),
    ):
        paths[name] = tmp_path / name
        paths[name].write_text(content)
    pinned = ["--public-key", str(paths["a.pem"]), "--origin", ORIGIN]
    assert refused(run_cli("verify-receipt", str(paths["theirs.json"]), *pinned))
    with_history = ("--key-history", str(paths["history-b.json"]))
    assert refused(run_cli("verify-receipt", str(paths["theirs.json"]), *pinned, *with_history))
    trail = tmp_path / "ours.jsonl"
    export_jsonl(sqlite_log, trail)
    assert run_cli("verify", str(trail), *pinned).exit_code == 0
    trusted = ("--trusted-checkpoint", str(paths["note-b.txt"]))
    assert refused(run_cli("verify", str(trail), *pinned, *trusted))


def test_a_file_never_vouches_for_itself(sqlite_log: AuditLog, tmp_path: Path) -> None:
    """The key is pinned from outside: a receipt, a trail, a history or another algorithm's
    key given as the public key is refused, whatever public key the file carries inside."""
    from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    receipt, path, _ = _receipt_file(sqlite_log, tmp_path)
    # The attacker puts a PEM inside the receipt (residual is free-form): still not a key file.
    trail = tmp_path / "trail.jsonl"
    export_jsonl(sqlite_log, trail)
    history = tmp_path / "history.json"
    history.write_text(json.dumps(genesis_history(Ed25519PrivateKey.generate(), TIME)))
    ed448 = tmp_path / "ed448.pem"
    ed448.write_bytes(
        Ed448PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    for command, target in (("verify-receipt", path), ("verify", trail)):
        for key in (target, trail, history, ed448):
            result = run_cli(command, str(target), "--public-key", str(key), "--origin", ORIGIN)
            assert refused(result), (command, key.name, result.output)
    with pytest.raises(VerificationError, match="pinned public key cannot be used"):
        verify_receipt(receipt, json.dumps(receipt), origin=ORIGIN)


# --- What held: trails cut, trees forked, inputs huge ----------------------------------------


def test_a_trail_cut_at_a_checkpoint_boundary_is_refused(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """The cut leaves a trail whose entries match a checkpoint the log really signed
    (size 5): without the trailer, or with the whole trail's, it is refused."""
    fill(sqlite_log, 5)
    at_five = sqlite_log.checkpoint_record().note
    fill(sqlite_log, 5)
    trail = tmp_path / "trail.jsonl"
    export_jsonl(sqlite_log, trail)
    lines = trail.read_text().splitlines()
    assert len(lines) == 12
    for cut in (lines[:6], [*lines[:6], lines[-1]], lines[:-1]):
        with pytest.raises(VerificationError):
            verify_export(cut, sqlite_log.public_key, ORIGIN, trusted_checkpoints=[at_five])
    cut_file = tmp_path / "cut.jsonl"
    cut_file.write_text("".join(line + "\n" for line in lines[:6]))
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    assert refused(run_cli("verify", str(cut_file), "--public-key", str(key), "--origin", ORIGIN))


def test_two_signed_trees_that_disagree_are_reported(
    sqlite_log: AuditLog, signing_key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    """A fork: the key signed two roots for one size. Holding either, the reader is told
    that the trail does not extend it; holding both, the trail is refused whichever it is."""
    fill(sqlite_log, 4)
    honest = sqlite_log.checkpoint_record().note
    fork = sign_checkpoint(signing_key, ORIGIN, 4, sha256(b"another tree").digest())
    fill(sqlite_log, 2)
    trail = tmp_path / "trail.jsonl"
    export_jsonl(sqlite_log, trail)
    verify_export(trail, sqlite_log.public_key, ORIGIN, trusted_checkpoints=[honest])
    for held in ([fork], [honest, fork], [fork, honest]):
        with pytest.raises(VerificationError, match="trusted checkpoint of size 4"):
            verify_export(trail, sqlite_log.public_key, ORIGIN, trusted_checkpoints=held)
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    notes = []
    for name, note in (("honest.note", honest), ("fork.note", fork)):
        notes += ["--trusted-checkpoint", str(tmp_path / name)]
        (tmp_path / name).write_text(note)
    result = run_cli("verify", str(trail), "--public-key", str(key), "--origin", ORIGIN, *notes)
    assert refused(result), result.output


HUGE_OR_DEEP = [
    pytest.param(b"[" * 2_000_000, id="two-million-brackets"),
    pytest.param(b'{"a":' * 200_000 + b"1" + b"}" * 200_000, id="deep-objects"),
    pytest.param(b'{"leaf_index":' + b"9" * 100_000 + b"}", id="huge-integer"),
    pytest.param(b'"' + b"\\" * 1_000_001 + b'"', id="odd-escapes"),
    pytest.param(b"\xef\xbb\xbf{}", id="byte-order-mark"),
]


@pytest.mark.parametrize("content", HUGE_OR_DEEP)
def test_huge_or_deep_inputs_are_refused_with_a_reason(
    content: bytes, sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """Every verifier and every file it reads: a VerificationError, a CLI exit 1 with
    the reason, never a RecursionError, a ValueError or a traceback."""
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    bad = tmp_path / "bad"
    bad.write_bytes(content)
    trail = tmp_path / "trail.jsonl"
    export_jsonl(sqlite_log, trail)
    receipt_path = _receipt_file(sqlite_log, tmp_path)[1]
    pinned = ("--public-key", str(key), "--origin", ORIGIN)
    for args in (
        ("verify-receipt", str(bad), *pinned),
        ("verify", str(bad), *pinned),
        ("verify", str(trail), *pinned, "--trusted-checkpoint", str(bad)),
        ("verify", str(trail), *pinned, "--key-history", str(bad)),
        ("verify-receipt", str(receipt_path), *pinned, "--key-history", str(bad)),
        ("verify-proof", str(bad), *pinned, "--trusted-checkpoint", str(receipt_path)),
    ):
        result = run_cli(*args)
        assert refused(result), (args[0], args[-1], result.output[-300:])


# --- What held: names of files, and the documented procedure from a clean shell --------------


def test_file_names_cannot_dress_a_refusal_as_success(sqlite_log: AuditLog, tmp_path: Path) -> None:
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    for name in ("[bold green]verified.json", "verified \x1b[32mOK\x1b[0m.json", "-x\nverified"):
        path = tmp_path / name
        path.write_text('{"body": {}}')
        for command in ("verify-receipt", "verify"):
            result = run_cli(command, "--public-key", str(key), "--", str(path))
            assert refused(result) and "\x1b" not in result.output, (name, result.output)


def test_the_documented_offline_procedure_works_from_a_clean_shell(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """docs/governance.md and docs/audit-format.md §6: only the public key, the origin and
    the files; no deployment, no UPROF_ setting, an empty home, nothing written."""
    receipt_path = _receipt_file(sqlite_log, tmp_path)[1]
    fill(sqlite_log, 3)
    trail = tmp_path / "trail.jsonl"
    export_jsonl(sqlite_log, trail)
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "LANG": "C.UTF-8"}
    uprof = str(Path(sys.executable).parent / "uprof")
    before = sorted(p.name for p in tmp_path.rglob("*"))

    def shell(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [uprof, "audit", *args, "--public-key", "audit.pem", "--origin", ORIGIN],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    done = shell("verify-receipt", "receipt.json")
    assert done.returncode == 0 and "receipt verified" in done.stdout, done.stderr
    assert shell("verify", "trail.jsonl").returncode == 0
    tampered = json.loads(receipt_path.read_text())
    tampered["body"]["residual"]["backup_retention_days"] = 1
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    refused_run = shell("verify-receipt", "tampered.json")
    assert refused_run.returncode == 1 and "verified" not in refused_run.stdout
    assert "Traceback" not in refused_run.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted([*before, "tampered.json"])


# --- A trail the log wrote, refused for its size ----------------------------------------------


def test_a_csv_trail_of_the_largest_entries_the_log_stores_verifies(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """The allowlist takes up to 1,000 tokens of 200 characters in a list field; such an
    entry's CSV cell is over 128 KiB, Python's csv field limit, so the verifier refused the
    CSV export of a log it had no reason to doubt ("row is not valid CSV"), when the JSONL
    export of the same log verified, and the summary the SDK and the REST export build of
    a CSV export failed the same way."""
    from audit.export import export_csv

    sqlite_log.append(
        {"action": "subject.read", "item_refs": [f"{i:04d}" + "a" * 196 for i in range(1000)]}
    )
    fill(sqlite_log, 2)
    default_limit = csv.field_size_limit()
    reports = []
    # The cell is over Python's default limit (128 KiB): KY sets the limit once, at import.
    assert default_limit > 200 * 1000
    try:
        for name, write in (("trail.jsonl", export_jsonl), ("trail.csv", export_csv)):
            path = tmp_path / name
            write(sqlite_log, path)
            reports.append(verify_export(path, sqlite_log.public_key, ORIGIN))
        assert [r.format for r in reports] == ["jsonl", "csv"]
        assert reports[0].root == reports[1].root and reports[1].entry_count == 3
        # What the SDK and POST /v1/audit/export read of a CSV export they received.
        lines = (tmp_path / "trail.csv").read_text().splitlines(keepends=True)
        assert AuditExportSummary.of_export(lines, "csv").entry_count == 3
    finally:
        csv.field_size_limit(default_limit)


def test_a_subject_that_is_not_utf8_is_refused_with_a_reason(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """A shell hands Python the bytes of `--subject $'\\xff'` as a lone surrogate, which
    cannot be encoded: verify-receipt ended in a UnicodeEncodeError traceback."""
    nonce = new_commitment_nonce()
    receipt = issue_for(sqlite_log, "ana", nonce)
    with pytest.raises(VerificationError, match="not UTF-8 text"):
        verify_subject_commitment(receipt, "\udcff", nonce)
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    key = tmp_path / "audit.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    pinned = ["--public-key", str(key), "--origin", ORIGIN]
    result = run_cli(
        "verify-receipt", str(path), *pinned, "--subject", "an\udcff", "--nonce", nonce.hex()
    )
    # Since bug OJ the command line itself refuses it, naming the option (exit 2), before
    # the verifier is asked; the verifier's own refusal is the one above.
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "--subject" in said and "Unicode" in said, said
    assert "verified" not in said.lower()
