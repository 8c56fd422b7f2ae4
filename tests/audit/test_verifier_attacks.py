"""Attacks on the offline verifiers by whoever produced the files they are handed.

The attacker is the operator: it holds the log's signing key, so it can sign anything and
build trees of any leaves. What the verifiers must still refuse is a file that says something
the log could not have written, says two things at once, or names no verifiable erasure; and
every refusal is a ``VerificationError`` (a CLI exit 1 with the reason), never a traceback.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
import rfc8785
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from audit._codec import b64encode
from audit.canonical import canonical_bytes
from audit.check import check_upload
from audit.checkpoint import sign_checkpoint, verify_checkpoint
from audit.entry import format_timestamp, stored_entry_bytes
from audit.errors import AuditEntryError, VerificationError
from audit.export import export_csv, export_jsonl
from audit.export_format import EXPORT_SIGNATURE_CONTEXT, entry_line
from audit.keys import key_id, note_key_id, public_key_pem
from audit.log import AuditLog
from audit.merkle import MerkleTree, leaf_hash
from audit.receipts import (
    issue_erasure_receipt,
    parse_receipt,
    receipt_log_entry,
    verify_receipt,
)
from audit.tables import create_tables
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN, audit_log_on
from tests.audit.test_log import fill
from uprof.backends import backend_for
from uprof.cli.main import app as cli

TIME = "2025-01-01T00:00:00.000000Z"
GOOD_ENTRY = f'{{"action":"consent.granted","recorded_at":"{TIME}","subject_ref":"s1"}}'
ACTIONS = [
    {"type": "tombstone_appended", "stream": "s-1", "notification_id": 7},
    {"type": "dek_destroyed", "key_version": 1, "dek_commitment": sha256(b"dek").hexdigest()},
]


def issue(
    log: AuditLog,
    actions: list[dict[str, Any]] | None = None,
    *,
    commitment: str | None = None,
    tenant: str = "acme",
) -> dict[str, Any]:
    """A subject erasure's receipt on ``log`` (by default of tenant acme, committing to a
    fixed stand-in for the subject, with ACTIONS)."""
    return issue_erasure_receipt(
        log,
        request_id="req-1",
        received_at="2025-01-01T09:00:00Z",
        basis="GDPR-Art.17(1)",
        scope="subject",
        tenant=tenant,
        subject_commitment=sha256(b"subject").hexdigest() if commitment is None else commitment,
        actions=ACTIONS if actions is None else actions,
        residual={"backup_retention_days": 35},
    )


def forge_receipt(
    log: AuditLog, key: Ed25519PrivateKey, mutate: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """What an operator holding the key can make: any body, signed, logged and checkpointed."""
    body = copy.deepcopy(issue(log)["body"])
    mutate(body)
    record = log.append(receipt_log_entry(body))
    checkpoint = log.checkpoint_record()
    proof = log.inclusion_proof(record.leaf_index, checkpoint.tree_size)
    return {
        "body": body,
        "body_sig": b64encode(key.sign(rfc8785.dumps(body))),
        "inclusion": {
            "leaf_index": record.leaf_index,
            "tree_size": checkpoint.tree_size,
            "hashes": [b64encode(h) for h in proof],
        },
        "checkpoint": checkpoint.note,
    }


def forge_export(
    key: Ed25519PrivateKey, leaves: list[str], filter_: dict[str, str] | None = None
) -> list[str]:
    """A signed export of a tree of arbitrary leaf texts (what the key holder can make)."""
    tree = MerkleTree(leaf_hash(text.encode()) for text in leaves)
    chosen = filter_ or {}
    header = {
        "checkpoint": sign_checkpoint(key, ORIGIN, tree.size, tree.root()),
        "exported_at": TIME,
        "filter": chosen,
        "filtered": bool(chosen),
        "format": "uprof.audit-export/v1",
        "key_id": key_id(key),
        "kind": "header",
        "note_key_id": note_key_id(ORIGIN, key).hex(),
        "origin": ORIGIN,
        "tree_size": tree.size,
    }
    lines = [canonical_bytes(header).decode()]
    for index, text in enumerate(leaves):
        proof = [b64encode(h) for h in tree.inclusion_proof(index)]
        lines.append(entry_line(text, proof, index))
    digest = sha256("".join(line + "\n" for line in lines).encode()).digest()
    trailer = {
        "entry_count": len(leaves),
        "export_sha256": digest.hex(),
        "kind": "trailer",
        "signature": b64encode(key.sign(EXPORT_SIGNATURE_CONTEXT + digest)),
    }
    return [*lines, canonical_bytes(trailer).decode()]


# --- Receipts --------------------------------------------------------------------------------


def _set(*path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        target = body
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


RECEIPT_FORGERIES = [
    (_set("actions", value=[]), "non-empty list"),
    (_set("actions", value="everything was erased"), "non-empty list"),
    (_set("actions", value=[{"type": "all_data_shredded"}]), "needs a 'type'"),
    (_set("actions", value=[{"type": "cache_invalidated"}]), "no tombstone_appended"),
    (_set("actions", value=[*ACTIONS, "and the backups"]), r"actions\[2\]"),
    (_set("actions", value=[ACTIONS[0], {"type": "dek_destroyed"}]), "dek_commitment"),
    (_set("request", value="GDPR"), "request needs exactly"),
    (_set("request", "received_at", value="yesterday"), "received_at"),
    (_set("request", "received_at", value="2025-01-01T10:00:00+01:00"), "received_at"),
    (_set("subject", value={"tenant": "acme"}), "subject needs exactly"),
    (_set("subject", "subject_commitment", value="ana@example.org"), "subject_commitment"),
    (_set("residual", value="nothing survives"), "residual"),
    # A step done by another request names that one (decision
    # 0131-simultaneous-erasure-receipts): never this receipt's own request, never blank.
    (_set("actions", value=[{**ACTIONS[0], "by_request": "req-1"}, ACTIONS[1]]), "by_request"),
    (_set("actions", value=[ACTIONS[0], {**ACTIONS[1], "by_request": ""}]), "by_request"),
    (_set("actions", value=[ACTIONS[0], {**ACTIONS[1], "by_request": 7}]), "by_request"),
]


def test_a_receipt_the_key_signed_but_that_proves_no_erasure_is_refused(
    log: AuditLog, signing_key: Ed25519PrivateKey
) -> None:
    fill(log, 3)
    verify_receipt(issue(log), log.public_key, origin=ORIGIN)  # the honest one verifies
    for mutate, reason in RECEIPT_FORGERIES:
        forged = forge_receipt(log, signing_key, mutate)
        with pytest.raises(VerificationError, match=reason):
            verify_receipt(forged, log.public_key, origin=ORIGIN)
        result = check_upload(json.dumps(forged).encode(), "receipt", log.public_key, ORIGIN)
        assert not result.ok and reason.replace("\\", "") in result.detail


def test_a_receipt_citing_another_requests_destruction_verifies(log: AuditLog) -> None:
    fill(log, 3)
    cited = [{**action, "by_request": "req-0"} for action in ACTIONS]
    verify_receipt(issue(log, cited), log.public_key, origin=ORIGIN)


def test_the_issuer_refuses_what_the_verifier_refuses(sqlite_log: AuditLog) -> None:
    for actions in ([], [{"type": "cache_invalidated"}], [{"type": "dek_destroyed"}]):
        with pytest.raises(AuditEntryError):
            issue(sqlite_log, actions)
    assert sqlite_log.size() == 0


def test_a_receipt_file_that_says_two_things_is_refused(sqlite_log: AuditLog) -> None:
    """json.loads keeps the last of two equal keys: a reader of the first would be misled."""
    receipt = issue(sqlite_log)
    text = json.dumps(receipt)
    fake_first = json.dumps([{"type": "dek_destroyed", "dek_commitment": "ab" * 32}] * 9)
    doubled = text.replace('"actions": [', f'"actions": {fake_first}, "actions": [', 1)
    assert json.loads(doubled) == receipt  # what a lenient reader verifies
    with pytest.raises(VerificationError, match="duplicate object key 'actions'"):
        parse_receipt(doubled.encode())
    result = check_upload(doubled.encode(), "receipt", sqlite_log.public_key, ORIGIN)
    assert not result.ok and "duplicate object key" in result.detail


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "Expecting value"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "nested deeper"),
        (b'{"body": {}, "body_sig": NaN}', "non-integer number NaN"),
        (b'{"inclusion": {"leaf_index": 1.0}}', "non-integer number 1.0"),
        (b'{"inclusion": {"leaf_index": 1e2}}', "non-integer number 1e2"),
        (b'{"body": {"type": "gov.erasure-receipt/v1"', "Expecting"),
        (b"x" * 1_000_000, "Expecting value"),
    ],
)
def test_unreadable_receipt_files_are_refused_with_the_reason(raw: bytes, reason: str) -> None:
    public_key = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(VerificationError, match=reason):
        parse_receipt(raw)
    result = check_upload(raw, "receipt", public_key, ORIGIN)
    assert not result.ok and reason in result.detail


def _shadow_log(path: Path, key: Ed25519PrivateKey, origin: str) -> tuple[AuditLog, sa.Engine]:
    engine = sa.create_engine(f"sqlite:///{path}")
    create_tables(engine, backend_for(engine))
    log = audit_log_on(engine, key, origin)
    return log, engine


def test_the_cli_pins_the_origin_and_refuses_unreadable_files(
    tmp_path: Path, signing_key: Ed25519PrivateKey
) -> None:
    """An operator keeping a second log under the same key cannot pass off its receipt."""
    runner = CliRunner()
    key_file = tmp_path / "audit.pem"
    key_file.write_bytes(public_key_pem(signing_key))
    receipts = {}
    for name, origin in (("real", "uprof.local/audit"), ("shadow", "uprof.local/shadow")):
        log, engine = _shadow_log(tmp_path / f"{name}.sqlite", signing_key, origin)
        try:
            receipts[name] = tmp_path / f"{name}.json"
            receipts[name].write_text(json.dumps(issue(log), indent=2))
        finally:
            engine.dispose()

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["audit", "verify-receipt", *args, "--public-key", str(key_file)])

    assert run(str(receipts["real"])).exit_code == 0
    shadow = run(str(receipts["shadow"]))
    assert shadow.exit_code == 1 and "issued by log 'uprof.local/shadow'" in shadow.output
    assert run(str(receipts["shadow"]), "--origin", "uprof.local/shadow").exit_code == 0

    short_nonce = run(str(receipts["real"]), "--subject", "ana", "--nonce", "abcd")
    assert short_nonce.exit_code == 1 and isinstance(short_nonce.exception, SystemExit)
    assert "exactly 32 random bytes" in short_nonce.output

    bad_key = tmp_path / "bad.pem"
    bad_key.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    for name, content in (("deep", b"[" * 50_000), ("garbage", b"\x00\xff" * 100)):
        path = tmp_path / name
        path.write_bytes(content)
        result = run(str(path))
        assert result.exit_code == 1, result.output
        assert isinstance(result.exception, SystemExit)  # an exit with the reason, no traceback
        assert "receipt does not verify" in result.output
    for command, target in (("verify-receipt", receipts["real"]), ("verify", receipts["real"])):
        result = runner.invoke(cli, ["audit", command, str(target), "--public-key", str(bad_key)])
        assert result.exit_code == 1, result.output
        assert isinstance(result.exception, SystemExit)
        assert "pinned public key cannot be used" in result.output


# --- Exports ---------------------------------------------------------------------------------

R = f'"recorded_at":"{TIME}"'
EXPORT_FORGERIES = [
    # not canonical: the log stores RFC 8785 bytes only
    (f'{{"action": "consent.granted", {R.replace(":", ": ", 1)}}}', "canonical"),
    (f'{{{R},"action":"consent.granted"}}', "canonical"),
    (f'{{"action":"consent.granted",{R},"subject_ref":"\\u00731"}}', "canonical"),
    (f'{{"action":"x",{R},"tree_size":-0}}', "canonical"),
    # outside the allowlist: personal text the log refuses to hold (I10)
    (f'{{"action":"x","email":"ana@example.org","name":"Ana Novak",{R}}}', "allowlist"),
    (f'{{"action":"x",{R},"subject_ref":"Ana Novak"}}', "subject_ref must be a token"),
    (f'{{"action":"x",{R},"subject_ref":null}}', "subject_ref must be a token"),
    (f'{{"action":"x",{R},"subject_ref":"s1\\n"}}', "subject_ref must be a token"),
    (f'{{"action":"x","reason_code":"e\u0301",{R}}}', "reason_code must be a token"),
    (f'{{"action":"x","counts":{{"n":9007199254740993}},{R}}}', "counts.n"),
    # a time the log never writes (it would sort wrongly against a time filter)
    ('{"action":"x","recorded_at":"2025-03-02T01:00:00+05:00"}', "recorded_at"),
    ('{"action":"x"}', "recorded_at"),
]


@pytest.mark.parametrize(("leaf", "reason"), EXPORT_FORGERIES)
def test_an_export_the_log_could_not_have_written_is_refused(leaf: str, reason: str) -> None:
    key = Ed25519PrivateKey.generate()
    verify_export(forge_export(key, [GOOD_ENTRY]), key.public_key(), ORIGIN)  # the forger works
    lines = forge_export(key, [GOOD_ENTRY, leaf])
    with pytest.raises(VerificationError, match=reason) as failure:
        verify_export(lines, key.public_key(), ORIGIN)
    assert failure.value.line_number == 3 and failure.value.leaf_index == 1


@pytest.mark.parametrize(
    ("filter_", "reason"),
    [
        ({"since": "2025-03-01T21:00:00Z"}, "filter since"),
        ({"until": "tomorrow"}, "filter until"),
        ({"subject_ref": "Ana Novak"}, "filter subject_ref"),
    ],
)
def test_an_export_filter_the_exporter_could_not_have_written_is_refused(
    filter_: dict[str, str], reason: str
) -> None:
    key = Ed25519PrivateKey.generate()
    with pytest.raises(VerificationError, match=reason) as failure:
        verify_export(forge_export(key, [], filter_), key.public_key(), ORIGIN)
    assert failure.value.line_number == 1


def test_a_hex_field_with_a_trailing_newline_is_refused_not_a_crash() -> None:
    """``$`` in a Python regex also matches before a final newline."""
    key = Ed25519PrivateKey.generate()
    lines = forge_export(key, [GOOD_ENTRY])
    trailer = json.loads(lines[-1])
    trailer["export_sha256"] = "a" * 63 + "\n"
    lines[-1] = canonical_bytes(trailer).decode()
    with pytest.raises(VerificationError, match="export_sha256 is not lowercase hex"):
        verify_export(lines, key.public_key(), ORIGIN)


def test_an_upload_is_read_byte_for_byte_like_the_file(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    fill(sqlite_log, 4)
    path = tmp_path / "trail.jsonl"
    export_jsonl(sqlite_log, path)
    crlf = path.read_bytes().replace(b"\n", b"\r\n")
    (tmp_path / "crlf.jsonl").write_bytes(crlf)
    with pytest.raises(VerificationError, match="line 1"):
        verify_export(tmp_path / "crlf.jsonl", sqlite_log.public_key, ORIGIN)
    result = check_upload(crlf, "export", sqlite_log.public_key, ORIGIN)
    assert not result.ok and result.line_number == 1


def test_a_signature_line_that_claims_the_pinned_key_id_is_checked_not_trusted() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    root = sha256(b"root").digest()
    note = sign_checkpoint(key, ORIGIN, 3, root)
    body = note.split("\n\n")[0] + "\n"
    claimed = note_key_id(ORIGIN, key) + other.sign(body.encode())
    impostor = f"\u2014 {ORIGIN} {b64encode(claimed)}\n"
    with pytest.raises(VerificationError, match="does not verify"):
        verify_checkpoint(body + "\n" + impostor, key.public_key(), ORIGIN)
    with pytest.raises(VerificationError, match="does not verify"):
        verify_checkpoint(note + impostor, key.public_key(), ORIGIN)


# --- Property: any change of a handed-in file is refused, with a reason ------------------------


def _mutations() -> st.SearchStrategy[Callable[[bytes], bytes]]:
    def flip(position: int, value: int) -> Callable[[bytes], bytes]:
        def apply(raw: bytes) -> bytes:
            at = position % len(raw)
            return raw[:at] + bytes([(raw[at] + 1 + value % 255) % 256]) + raw[at + 1 :]

        return apply

    def cut(start: int, length: int) -> Callable[[bytes], bytes]:
        return lambda raw: raw[: start % len(raw)] + raw[start % len(raw) + length :]

    def insert(position: int, junk: bytes) -> Callable[[bytes], bytes]:
        return lambda raw: raw[: position % len(raw)] + junk + raw[position % len(raw) :]

    def lines(a: int, b: int, op: str) -> Callable[[bytes], bytes]:
        def apply(raw: bytes) -> bytes:
            parts = raw.split(b"\n")
            i, j = a % len(parts), b % len(parts)
            if op == "dup":
                parts.insert(j, parts[i])
            elif op == "drop":
                del parts[i]
            else:
                parts[i], parts[j] = parts[j], parts[i]
            return b"\n".join(parts)

        return apply

    index = st.integers(min_value=0, max_value=10**6)
    return st.one_of(
        st.builds(flip, index, st.integers(0, 254)),
        st.builds(cut, index, st.integers(1, 400)),
        st.builds(insert, index, st.binary(min_size=1, max_size=40)),
        st.builds(lines, index, index, st.sampled_from(["dup", "drop", "swap"])),
        st.builds(lambda n: lambda raw: raw[: n % len(raw)], index),
    )


@pytest.fixture(scope="module")
def handed_in(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("handed-in")
    key = Ed25519PrivateKey.generate()
    log, engine = _shadow_log(folder / "log.sqlite", key, ORIGIN)
    try:
        fill(log, 9)
        receipt = issue(log)
        fill(log, 3)
        trail, table = folder / "trail.jsonl", folder / "trail.csv"
        export_jsonl(log, trail)
        export_csv(log, table, app_id="app-1")
        return {
            "key": key.public_key(),
            "export": trail.read_bytes(),
            "csv": table.read_bytes(),
            "receipt": json.dumps(receipt, indent=2).encode(),
        }
    finally:
        engine.dispose()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kind=st.sampled_from(["export", "csv", "receipt"]), mutate=_mutations())
def test_a_changed_file_is_refused_with_a_reason_never_a_crash(
    handed_in: dict[str, Any], kind: str, mutate: Callable[[bytes], bytes]
) -> None:
    original = handed_in[kind]
    changed = mutate(original)
    upload = "receipt" if kind == "receipt" else "export"
    result = check_upload(changed, upload, handed_in["key"], ORIGIN)  # never raises
    if result.ok:  # only a change that is no change passes
        if kind != "receipt":
            assert changed == original
        else:  # whitespace between JSON tokens carries nothing
            assert parse_receipt(changed) == parse_receipt(original)
    else:
        assert result.detail


_TOKENS = st.from_regex(r"[A-Za-z0-9_.:/*#=\-]{1,20}", fullmatch=True)
_ENTRIES = st.fixed_dictionaries(
    {
        "action": st.from_regex(r"[A-Za-z][A-Za-z0-9_.:\-]{0,20}", fullmatch=True),
        "recorded_at": st.datetimes(timezones=st.just(UTC)).map(format_timestamp),
    },
    optional={
        "subject_ref": _TOKENS,
        "rule": st.one_of(_TOKENS, st.lists(_TOKENS, max_size=4)),
        "categories": st.lists(_TOKENS, max_size=4),
        "counts": st.dictionaries(_TOKENS, st.integers(0, 2**53 - 1), max_size=4),
        "explicit": st.booleans(),
        "dek_commitment": st.binary(min_size=32, max_size=32).map(bytes.hex),
        "dek_commitments": st.lists(
            st.binary(min_size=32, max_size=32).map(bytes.hex), min_size=1, max_size=4
        ),
        "tree_size": st.integers(0, 2**53 - 1),
    },
)


@given(entry=_ENTRIES)
def test_the_verifiers_fast_canonical_form_of_an_entry_is_rfc_8785(entry: dict[str, Any]) -> None:
    assert stored_entry_bytes(entry) == rfc8785.dumps(entry)


# --- A log rewritten and re-signed after a checkpoint was published ---------------------------


def _rewritten_copy(
    honest: AuditLog, key: Ed25519PrivateKey, folder: Path, drop: int
) -> tuple[AuditLog, sa.Engine]:
    """The operator's rewrite: the same entries but one, under the same key and origin."""
    rewritten, engine = _shadow_log(folder / "rewritten.sqlite", key, ORIGIN)
    kept = [stored.entry for stored in honest.entries() if stored.leaf_index != drop]
    rewritten.append_many(kept)
    return rewritten, engine


def test_a_trail_must_extend_the_checkpoints_the_reader_trusted(
    log: AuditLog, signing_key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    fill(log, 6)
    receipt = issue(log)  # the subject and the auditor keep its checkpoint (size 7)
    fill(log, 5)
    earlier = log.checkpoint_record().note  # size 12, published to a witness
    fill(log, 3)
    honest = tmp_path / "honest.jsonl"
    export_jsonl(log, honest)
    trusted = [receipt["checkpoint"], earlier]
    report = verify_export(honest, log.public_key, ORIGIN, trusted_checkpoints=trusted)
    assert report.entry_count == 15

    # The operator drops entry 3 (an access it wants forgotten), re-signs, exports again.
    rewritten, engine = _rewritten_copy(log, signing_key, tmp_path, drop=3)
    try:
        rewritten.append({"action": "consent.granted", "subject_ref": "s-late"})
        forged = tmp_path / "rewritten.jsonl"
        export_jsonl(rewritten, forged)
        shorter = tmp_path / "shorter.jsonl"
        rewritten_size = rewritten.size()
        export_jsonl(rewritten, shorter, subject_ref="s-late")
    finally:
        engine.dispose()
    assert (
        verify_export(forged, log.public_key, ORIGIN).tree_size == rewritten_size
    )  # signed: passes
    for note, size in ((receipt["checkpoint"], 7), (earlier, 12)):
        with pytest.raises(VerificationError, match=f"trusted checkpoint of size {size}") as bad:
            verify_export(forged, log.public_key, ORIGIN, trusted_checkpoints=[note])
        assert bad.value.line_number == size + 1 and bad.value.leaf_index == size - 1
    with pytest.raises(VerificationError, match="filtered export cannot show"):
        verify_export(shorter, log.public_key, ORIGIN, trusted_checkpoints=[earlier])

    newer = log.checkpoint_record().note  # size 15
    rewritten_small, engine = _shadow_log(tmp_path / "small.sqlite", signing_key, ORIGIN)
    try:
        fill(rewritten_small, 4)
        small = tmp_path / "small.jsonl"
        export_jsonl(rewritten_small, small)
    finally:
        engine.dispose()
    with pytest.raises(VerificationError, match="shrank or forked"):
        verify_export(small, log.public_key, ORIGIN, trusted_checkpoints=[newer])
    foreign = sign_checkpoint(Ed25519PrivateKey.generate(), ORIGIN, 1, sha256(b"x").digest())
    with pytest.raises(VerificationError, match="trusted checkpoint 1: "):
        verify_export(honest, log.public_key, ORIGIN, trusted_checkpoints=[foreign])

    # The CLI takes the note or the receipt itself.
    runner = CliRunner()
    key_file, receipt_file, note_file = (tmp_path / n for n in ("k.pem", "r.json", "n.txt"))
    key_file.write_bytes(public_key_pem(log.public_key))
    receipt_file.write_text(json.dumps(receipt))
    note_file.write_text(earlier)
    for trail, code in ((honest, 0), (forged, 1)):
        for kept in (receipt_file, note_file):
            pinned = ["--public-key", str(key_file), "--origin", ORIGIN]
            result = runner.invoke(
                cli, ["audit", "verify", str(trail), *pinned, "--trusted-checkpoint", str(kept)]
            )
            assert result.exit_code == code, result.output
            assert ("was rewritten" in result.output) == (code == 1)


def test_the_cli_prints_what_a_file_says_without_obeying_it(
    tmp_path: Path, signing_key: Ed25519PrivateKey
) -> None:
    """Rich markup in a handed-in file neither crashes the CLI nor styles its verdict."""
    runner = CliRunner()
    key_file = tmp_path / "audit.pem"
    key_file.write_bytes(public_key_pem(signing_key))
    header = json.loads(forge_export(signing_key, [])[0])
    for text in ("[/x]", "[green]verified[/green]: 10 entries", "\x1b[2J\u202e"):
        header["format"] = text
        trail = tmp_path / "trail.jsonl"
        trail.write_bytes(canonical_bytes(header) + b"\n")
        result = runner.invoke(cli, ["audit", "verify", str(trail), "--public-key", str(key_file)])
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
        assert "unknown format" in result.output and "\x1b" not in result.output

    log, engine = _shadow_log(tmp_path / "log.sqlite", signing_key, "uprof.local/audit")
    try:
        receipt = issue_erasure_receipt(
            log,
            request_id="req-1",
            received_at="2025-01-01T09:00:00Z",
            basis="GDPR-Art.17(1)",
            scope="[/x] \x1b]0;pwned\x07",
            tenant="acme",
            subject_commitment=sha256(b"subject").hexdigest(),
            actions=ACTIONS,
            residual={},
        )
    finally:
        engine.dispose()
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    result = runner.invoke(
        cli, ["audit", "verify-receipt", str(path), "--public-key", str(key_file)]
    )
    assert result.exit_code == 0, result.output
    assert "[/x]" in result.output and "\x1b" not in result.output and "\x07" not in result.output
    receipt["body"]["type"] = "[/x]"
    path.write_text(json.dumps(receipt))
    result = runner.invoke(
        cli, ["audit", "verify-receipt", str(path), "--public-key", str(key_file)]
    )
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
