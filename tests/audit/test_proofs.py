"""Proof documents: a fresh checkpoint with the consistency proof from an old size.

Served by the log on SQLite and PostgreSQL, checked offline with the pinned key and origin and
the checkpoint the reader trusted; refused, with the field named, for every bad size, every
foreign or altered part, and for a log rewritten below the trusted checkpoint and re-signed.
"""

from __future__ import annotations

import json
import random
import time
from hashlib import sha256
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from audit._codec import b64decode_strict, b64encode
from audit.canonical import canonical_bytes
from audit.checkpoint import sign_checkpoint
from audit.errors import VerificationError
from audit.log import AuditLog
from audit.merkle import MerkleTree, leaf_hash
from audit.proofs import build_proof, parse_proof, proof_bytes, verify_proof
from audit.receipts import issue_erasure_receipt
from audit.tables import audit_checkpoints, audit_entries, audit_nodes
from domain.errors import InvalidInputError
from tests import children
from tests.audit.conftest import ORIGIN, audit_log_on
from tests.audit.test_log import fill
from tests.conftest import Backend
from uprof.backends import backend_for_url

OTHER_ORIGIN = "uprof.test/shadow"


def _refused(match: str, *args: Any, **kwargs: Any) -> VerificationError:
    with pytest.raises(VerificationError, match=match) as caught:
        verify_proof(*args, **kwargs)
    return caught.value


# --- Serving and verifying -------------------------------------------------------------------


def test_every_old_size_and_entry_verifies_against_the_fresh_checkpoint(log: AuditLog) -> None:
    notes = {}
    for size in range(1, 20):
        fill(log, 1)
        notes[size] = log.checkpoint()
    fill(log, 4)
    for old_size, note in notes.items():
        leaf = (old_size * 7) % 23
        raw = proof_bytes(build_proof(log, old_size, leaf_index=leaf))
        report = verify_proof(raw, log.public_key, ORIGIN, trusted=note)
        assert (report.old_size, report.tree_size, report.leaf_index) == (old_size, 23, leaf)
        assert report.root == log.root()
    same = build_proof(log, 23)
    assert same["consistency"]["hashes"] == [] and same["inclusion"] is None
    verify_proof(same, log.public_key, ORIGIN, trusted=same["checkpoint"])


def test_a_receipt_holder_proves_the_log_still_holds_the_receipt(log: AuditLog) -> None:
    fill(log, 5)
    receipt = issue_erasure_receipt(
        log,
        request_id="req-1",
        received_at="2025-01-01T09:00:00Z",
        basis="GDPR-Art.17(1)",
        scope="subject",
        tenant="acme",
        subject_commitment=sha256(b"subject").hexdigest(),
        actions=[{"type": "tombstone_appended", "stream": "s-1", "notification_id": 7}],
        residual={},
    )
    fill(log, 9)
    leaf = receipt["inclusion"]["leaf_index"]
    document = build_proof(log, receipt["inclusion"]["tree_size"], leaf_index=leaf)
    report = verify_proof(proof_bytes(document), log.public_key, ORIGIN, trusted=receipt)
    assert report.leaf_index == leaf == 5 and report.tree_size == 15
    verify_proof(
        build_proof(log, receipt["inclusion"]["tree_size"]), log.public_key, ORIGIN, trusted=receipt
    )  # no inclusion asked: consistency alone keeps the receipt's tree inside the new one
    other = build_proof(log, receipt["inclusion"]["tree_size"], leaf_index=leaf - 1)
    _refused("not the receipt's leaf", other, log.public_key, ORIGIN, trusted=receipt)
    forged = json.loads(json.dumps(receipt))
    forged["body"]["request"]["basis"] = "GDPR-Art.17(3)"
    _refused("body signature", document, log.public_key, ORIGIN, trusted=forged)


BAD_SIZES: list[tuple[dict[str, Any], str, str]] = [
    ({"old_size": -1}, "old_size", "at least 1"),
    ({"old_size": 0}, "old_size", "at least 1"),
    ({"old_size": 9}, "old_size", "beyond the log, which holds 8"),
    ({"old_size": "3"}, "old_size", "integer"),
    ({"old_size": 3.0}, "old_size", "integer"),
    ({"old_size": True}, "old_size", "integer"),
    ({"old_size": None}, "old_size", "integer"),
    ({"old_size": 3, "leaf_index": -1}, "leaf_index", "at least 0"),
    ({"old_size": 3, "leaf_index": 8}, "leaf_index", "beyond the log"),
    ({"old_size": 3, "leaf_index": "2"}, "leaf_index", "integer"),
]


@pytest.mark.parametrize(("asked", "field", "message"), BAD_SIZES)
def test_bad_sizes_are_refused_naming_the_field(
    log: AuditLog, asked: dict[str, Any], field: str, message: str
) -> None:
    fill(log, 8)
    with pytest.raises(InvalidInputError, match=message) as caught:
        build_proof(log, **asked)
    assert caught.value.field == field


# --- What the offline verifier refuses ---------------------------------------------------------


@pytest.fixture
def served(sqlite_log: AuditLog) -> tuple[AuditLog, str, dict[str, Any]]:
    fill(sqlite_log, 6)
    old = sqlite_log.checkpoint()
    fill(sqlite_log, 11)
    return sqlite_log, old, build_proof(sqlite_log, 6, leaf_index=4)


def _edited(document: dict[str, Any], *path: str | int, value: Any) -> bytes:
    copy = json.loads(json.dumps(document))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return proof_bytes(copy)


def _flip_hash(text: str) -> str:
    raw = bytearray(b64decode_strict(text, "hash"))
    raw[0] ^= 1
    return b64encode(bytes(raw))


def test_the_verifier_refuses_each_failure_with_its_reason(
    served: tuple[AuditLog, str, dict[str, Any]],
) -> None:
    log, old, document = served
    key, raw = log.public_key, proof_bytes(document)
    verify_proof(raw, key, ORIGIN, trusted=old)
    other_key = Ed25519PrivateKey.generate()
    # The wrong pinned key, or the wrong pinned origin.
    _refused(
        "trusted checkpoint: .*no signature by the pinned key",
        raw,
        other_key.public_key(),
        ORIGIN,
        trusted=old,
    )
    _refused("trusted checkpoint: checkpoint origin", raw, key, OTHER_ORIGIN, trusted=old)
    _refused("pinned public key cannot be used", raw, b"not a key", ORIGIN, trusted=old)
    # A trusted note of another log (same key), or of another key.
    size, root = 6, log.root(6)
    shadow_note = sign_checkpoint(other_key, ORIGIN, size, root)
    _refused("trusted checkpoint: ", raw, key, ORIGIN, trusted=shadow_note)
    _refused(
        "trusted checkpoint: checkpoint origin",
        raw,
        key,
        ORIGIN,
        trusted=old.replace(ORIGIN, OTHER_ORIGIN),
    )
    # The document claims another origin or key, or its checkpoint is not the pinned key's.
    _refused(
        "proof origin", _edited(document, "origin", value=OTHER_ORIGIN), key, ORIGIN, trusted=old
    )
    _refused("proof key_id", _edited(document, "key_id", value="00" * 32), key, ORIGIN, trusted=old)
    _refused(
        "note_key_id", _edited(document, "note_key_id", value="00000000"), key, ORIGIN, trusted=old
    )
    resigned = sign_checkpoint(other_key, ORIGIN, 17, log.root(17))
    _refused(
        "proof checkpoint: ",
        _edited(document, "checkpoint", value=resigned),
        key,
        ORIGIN,
        trusted=old,
    )
    body, signature_line = document["checkpoint"].split("\n\n")
    bad_signature = (
        signature_line[:-6] + ("A" if signature_line[-6] != "A" else "B") + signature_line[-5:]
    )
    _refused(
        "proof checkpoint: ",
        _edited(document, "checkpoint", value=f"{body}\n\n{bad_signature}"),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "tree_size differs", _edited(document, "tree_size", value=16), key, ORIGIN, trusted=old
    )
    _refused(
        "format",
        _edited(document, "format", value="uprof.audit-proof/v2"),
        key,
        ORIGIN,
        trusted=old,
    )
    # Sizes: another old size than the trusted note's; a trusted tree larger than the new one.
    _refused(
        "old_size 5 is not the trusted",
        _edited(document, "consistency", "old_size", value=5),
        key,
        ORIGIN,
        trusted=old,
    )
    fill(log, 2)
    _refused(
        "larger than the proof's tree of size 17: the log shrank",
        raw,
        key,
        ORIGIN,
        trusted=log.checkpoint(),
    )
    # Tampered proof hashes and entries.
    hashes = document["consistency"]["hashes"]
    for position in range(len(hashes)):
        changed = [*hashes]
        changed[position] = _flip_hash(changed[position])
        _refused(
            "proof consistency: .*does not extend",
            _edited(document, "consistency", "hashes", value=changed),
            key,
            ORIGIN,
            trusted=old,
        )
    _refused(
        "proof consistency: ",
        _edited(document, "consistency", "hashes", value=hashes[:-1]),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "proof consistency: ",
        _edited(document, "consistency", "hashes", value=[*hashes, hashes[0]]),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        r"consistency.hashes\[0\]",
        _edited(document, "consistency", "hashes", value=["not base64", *hashes[1:]]),
        key,
        ORIGIN,
        trusted=old,
    )
    entry = dict(
        document["inclusion"]["entry"],
        decision="allow" if document["inclusion"]["entry"].get("decision") != "allow" else "deny",
    )
    _refused(
        "proof inclusion: .*altered",
        _edited(document, "inclusion", "entry", value=entry),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "could have stored",
        _edited(document, "inclusion", "entry", "name", value="Ana Novak"),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "proof inclusion: .*altered",
        _edited(document, "inclusion", "leaf_index", value=5),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "below the tree size",
        _edited(document, "inclusion", "leaf_index", value=17),
        key,
        ORIGIN,
        trusted=old,
    )
    inclusion = document["inclusion"]["hashes"]
    _refused(
        "proof inclusion: ",
        _edited(document, "inclusion", "hashes", value=[_flip_hash(inclusion[0]), *inclusion[1:]]),
        key,
        ORIGIN,
        trusted=old,
    )


MALFORMED: list[tuple[bytes, str]] = [
    (b"", "end with one newline"),
    (b"{}", "end with one newline"),
    (b"not json\n", "not valid JSON"),
    (b"[]\n", "not a JSON object"),
    (b'{"a":1,"a":2}\n', "duplicate object key"),
    (b'{"old_size":1.5}\n', "non-integer number"),
    (b"\xef\xbb\xbf{}\n", "byte order mark"),
    (b"\xff\n", "not UTF-8"),
    (b"[" * 100 + b"]" * 100 + b"\n", "nested deeper"),
    (b'{"format": "uprof.audit-proof/v1"}\n', "canonical form"),
    (b'{"format":"uprof.audit-proof/v1"}\n', "exactly the fields"),
]


@pytest.mark.parametrize(("raw", "reason"), MALFORMED)
def test_a_malformed_proof_file_is_refused_with_the_reason(
    served: tuple[AuditLog, str, dict[str, Any]], raw: bytes, reason: str
) -> None:
    log, old, _ = served
    _refused(reason, raw, log.public_key, ORIGIN, trusted=old)


def test_a_document_missing_or_adding_a_field_or_with_wrong_types_is_refused(
    served: tuple[AuditLog, str, dict[str, Any]],
) -> None:
    log, old, document = served
    key = log.public_key
    for name in document:
        shorter = {k: v for k, v in document.items() if k != name}
        _refused("exactly the fields", proof_bytes(shorter), key, ORIGIN, trusted=old)
    _refused("exactly the fields", proof_bytes({**document, "note": "x"}), key, ORIGIN, trusted=old)
    _refused(
        "consistency must be an object",
        _edited(document, "consistency", value=[]),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "consistency must be an object",
        _edited(document, "consistency", "extra", value=1),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "consistency.old_size",
        _edited(document, "consistency", "old_size", value="6"),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "list of base64",
        _edited(document, "consistency", "hashes", value="AAAA"),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "inclusion must be null or",
        _edited(document, "inclusion", value="entry 4"),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "checkpoint is not a signed note",
        _edited(document, "checkpoint", value=17),
        key,
        ORIGIN,
        trusted=old,
    )
    _refused(
        "tree_size differs", _edited(document, "tree_size", value="17"), key, ORIGIN, trusted=old
    )


def test_every_changed_byte_is_refused_or_changed_nothing(
    served: tuple[AuditLog, str, dict[str, Any]],
) -> None:
    """Seeded random byte edits, insertions, deletions and truncations of a proof file."""
    log, old, document = served
    raw = proof_bytes(document)
    rng = random.Random(9162)
    for _ in range(600):
        data = bytearray(raw)
        kind = rng.randrange(4)
        at = rng.randrange(len(data))
        if kind == 0:
            data[at] = rng.randrange(256)
        elif kind == 1:
            data.insert(at, rng.choice(b' ,"0A=\\{}[]\n'))
        elif kind == 2:
            del data[at]
        else:
            del data[at:]
        if bytes(data) == raw:
            continue
        with pytest.raises(VerificationError):
            verify_proof(bytes(data), log.public_key, ORIGIN, trusted=old)
    assert parse_proof(raw) == document


# --- Attacks: a log rewritten below the trusted checkpoint and re-signed ----------------------


def _tamper(engine: sa.Engine, change: dict[int, str], *, rehash_tree: bool) -> None:
    """What an operator with database access does: rewrite stored entries past the
    append-only triggers and, for a full rewrite, every Merkle node and checkpoint too,
    so that the log is self-consistent again and can be re-signed."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")  # no triggers
        else:
            for table, op in (
                ("audit_entries", "update"),
                ("audit_nodes", "delete"),
                ("audit_checkpoints", "delete"),
            ):
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS trg_{table}_no_{op}")
        for index, text in change.items():
            conn.execute(
                audit_entries.update()
                .where(audit_entries.c.leaf_index == index)
                .values(entry_json=text, leaf_hash=leaf_hash(text.encode()))
            )
        if not rehash_tree:
            return
        leaves = conn.execute(
            sa.select(audit_entries.c.leaf_hash).order_by(audit_entries.c.leaf_index)
        ).scalars()
        tree = MerkleTree(bytes(h) for h in leaves)
        conn.execute(audit_nodes.delete())
        conn.execute(audit_checkpoints.delete())
        rows = [
            {"level": level, "node_index": index, "hash": tree.node(level, index)}
            for level in range(1, tree.size.bit_length())
            for index in range(tree.size >> level)
        ]
        if rows:
            conn.execute(audit_nodes.insert(), rows)


def test_a_log_rewritten_below_the_trusted_checkpoint_and_resigned_fails_to_verify(
    log: AuditLog, engine: sa.Engine, signing_key: Ed25519PrivateKey
) -> None:
    fill(log, 12)
    trusted = log.checkpoint()  # published at size 12 (a receipt, a witness)
    fill(log, 5)
    honest = proof_bytes(build_proof(log, 12, leaf_index=3))
    verify_proof(honest, log.public_key, ORIGIN, trusted=trusted)

    # A rewrite above the trusted checkpoint does not touch what was trusted: it shows
    # against a later checkpoint only.
    later = json.loads(next(iter(log.entries(after_leaf=14, page_size=1))).entry_json)
    later["counts"] = {"items": 999}
    _tamper(engine, {15: canonical_bytes(later).decode()}, rehash_tree=True)
    verify_proof(
        build_proof(audit_log_on(engine, signing_key), 12),
        log.public_key,
        ORIGIN,
        trusted=trusted,
    )

    # The operator rewrites entry 3 (an access it wants forgotten), rebuilds every node,
    # drops the old checkpoints and serves proofs from the rewritten log under its key.
    forged = json.loads(next(iter(log.entries(after_leaf=2, page_size=1))).entry_json)
    forged["decision"] = "allow" if forged.get("decision") != "allow" else "deny"
    _tamper(engine, {3: canonical_bytes(forged).decode()}, rehash_tree=True)
    rewritten = audit_log_on(engine, signing_key)
    assert rewritten.verify_integrity() == 17  # self-consistent: only old notes betray it
    document = build_proof(rewritten, 12, leaf_index=3)
    failure = _refused(
        "proof consistency: .*does not extend the trusted checkpoint of size 12",
        proof_bytes(document),
        rewritten.public_key,
        ORIGIN,
        trusted=trusted,
    )
    assert "rewritten" in failure.reason
    # Its own fresh checkpoints verify (the key signed them): only the old note tells.
    fresh = build_proof(rewritten, 17)
    verify_proof(fresh, rewritten.public_key, ORIGIN, trusted=document["checkpoint"])


def test_entries_rewritten_without_their_tree_fail_their_inclusion_proof(
    log: AuditLog, engine: sa.Engine, signing_key: Ed25519PrivateKey
) -> None:
    """A rewrite that leaves the stored nodes alone keeps the tree (and so the consistency
    proof): the altered entry itself no longer hashes into it."""
    fill(log, 12)
    trusted = log.checkpoint()
    forged = json.loads(next(iter(log.entries(after_leaf=4, page_size=1))).entry_json)
    forged["counts"] = {"items": 999}
    _tamper(engine, {5: canonical_bytes(forged).decode()}, rehash_tree=False)
    reopened = audit_log_on(engine, signing_key)
    verify_proof(build_proof(reopened, 12), log.public_key, ORIGIN, trusted=trusted)
    _refused(
        "proof inclusion: .*altered",
        build_proof(reopened, 12, leaf_index=5),
        log.public_key,
        ORIGIN,
        trusted=trusted,
    )


# --- Concurrency: proofs served while other processes append ---------------------------------


def _append_until_stopped(url: str, key_pem: bytes, worker: int, stop: Any) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(key_pem, password=None)
    assert isinstance(key, Ed25519PrivateKey)
    engine = backend_for_url(url).create_engine(url, fsync_each_commit=False)
    try:
        log = audit_log_on(engine, key)
        batch = 0
        while not stop.is_set():
            log.append_many(
                {"action": "concurrent", "agent_id": f"w{worker}-{batch}-{i}"}
                for i in range(1 + batch % 4)
            )
            batch += 1
    finally:
        engine.dispose()


def test_proofs_served_while_other_processes_append_verify(
    backend: Backend, engine: sa.Engine, signing_key: Ed25519PrivateKey
) -> None:
    # Engines as a deployment builds them (SQLite: WAL, 30 s busy timeout), in every process.
    served = backend_for_url(backend.url).create_engine(backend.url, fsync_each_commit=False)
    log = audit_log_on(served, signing_key)
    fill(log, 5)
    trusted = log.checkpoint()
    pem = signing_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    stop = children.CONTEXT.Event()
    writers = [
        children.CONTEXT.Process(target=_append_until_stopped, args=(backend.url, pem, w, stop))
        for w in range(2)
    ]
    for writer in writers:
        writer.start()
    sizes: list[int] = []
    deadline = time.monotonic() + 120
    try:
        # Serve until proofs of at least four sizes, each made while the writers ran.
        while len(set(sizes) - {5}) < 4 and time.monotonic() < deadline:
            assert all(w.is_alive() for w in writers)
            leaf = sizes[-1] - 1 if sizes else 4
            document = build_proof(log, 5, leaf_index=leaf)
            report = verify_proof(proof_bytes(document), log.public_key, ORIGIN, trusted=trusted)
            sizes.append(report.tree_size)
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=120)
    assert [w.exitcode for w in writers] == [0, 0]
    assert len(set(sizes) - {5}) >= 4, sizes
    total = log.size()
    final = build_proof(log, 5, leaf_index=total - 1)
    assert verify_proof(final, log.public_key, ORIGIN, trusted=trusted).tree_size >= total
    assert log.verify_integrity() >= total
    served.dispose()


def test_a_missing_entry_row_is_reported_not_replaced_by_its_neighbour(
    log: AuditLog, engine: sa.Engine, signing_key: Ed25519PrivateKey
) -> None:
    """An entry row deleted behind the log's back: the server must not serve the next
    entry under the asked index (the verifier would refuse it, blaming the proof)."""
    fill(log, 12)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        else:
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS trg_audit_entries_no_delete")
        conn.execute(audit_entries.delete().where(audit_entries.c.leaf_index == 6))
    reopened = audit_log_on(engine, signing_key)
    with pytest.raises(VerificationError, match="no entry at leaf_index 6"):
        build_proof(reopened, 3, leaf_index=6)
    build_proof(reopened, 3, leaf_index=10)  # entries whose proofs do not need it still are


def _stored_text(log: AuditLog, leaf: int) -> dict[str, Any]:
    return dict(json.loads(next(iter(log.entries(after_leaf=leaf - 1, page_size=1))).entry_json))


@pytest.mark.parametrize(
    "rewrite",
    [
        pytest.param(
            lambda e: json.dumps({**e, "counts": {"items": 1.5}}, sort_keys=True), id="float"
        ),
        pytest.param(lambda e: json.dumps(e, sort_keys=True), id="not-canonical"),
        pytest.param(
            lambda e: canonical_bytes(e).decode()[:-1] + ',"action":"forged"}', id="duplicate-key"
        ),
        pytest.param(
            lambda e: canonical_bytes({**e, "subject_name": "Alice"}).decode(), id="not-an-entry"
        ),
    ],
)
def test_a_stored_entry_the_log_could_not_have_written_is_an_integrity_error(
    log: AuditLog, engine: sa.Engine, signing_key: Ed25519PrivateKey, rewrite: Any
) -> None:
    """An entry row rewritten behind the log's back into a text the log never stores (a
    float, another spelling, a duplicate key, a field outside the allowlist): the server
    reports its own tables as altered (VerificationError), not the caller's input as wrong
    (a float used to surface as an InvalidInputError, REST 422, from canonicalising the
    document after it was built), and serves nothing a verifier would blame on the proof."""
    fill(log, 12)
    _tamper(engine, {5: rewrite(_stored_text(log, 5))}, rehash_tree=True)
    reopened = audit_log_on(engine, signing_key)
    with pytest.raises(VerificationError, match="leaf_index 5") as caught:
        proof_bytes(build_proof(reopened, 3, leaf_index=5))
    assert not isinstance(caught.value, InvalidInputError)
    other = build_proof(reopened, 12, leaf_index=6)  # the other rows are still served
    verify_proof(other, log.public_key, ORIGIN, trusted=other["checkpoint"])
