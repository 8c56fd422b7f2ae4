"""The SQL-backed log on SQLite and PostgreSQL: appends, proofs, checkpoints, filters."""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from audit.checkpoint import verify_checkpoint
from audit.errors import AuditEntryError, VerificationError
from audit.log import AuditLog
from audit.merkle import EMPTY_ROOT, MerkleTree, leaf_hash, verify_consistency, verify_inclusion
from audit.tables import audit_entries, audit_nodes
from domain.errors import InvalidInputError
from tests import children
from tests.audit.conftest import ORIGIN, audit_log_on, sample_entry
from tests.conftest import Backend
from uprof.backends import backend_for
from uprof.retry import AUDIT_APPEND


@contextmanager
def statements(engine: sa.Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def fill(log: AuditLog, count: int, batch: int = 7) -> MerkleTree:
    """Append ``count`` sample entries in uneven batches; return the reference tree."""
    tree = MerkleTree()
    done = 0
    while done < count:
        n = min(batch, count - done)
        records = log.append_many(sample_entry(done + i) for i in range(n))
        for record in records:
            tree.append(record.leaf_hash)
        done += n
        if batch <= 7:
            batch = batch % 5 + 1  # uneven small batches cross many subtree boundaries
    return tree


def test_append_returns_dense_indexes_and_stores_canonical_json(log: AuditLog) -> None:
    first = log.append({"action": "consent.granted", "subject_ref": "sub_1", "app_id": "app-1"})
    second = log.append_many(
        [{"action": "a"}, {"action": "b", "recorded_at": "2030-01-01T00:00:00+01:00"}]
    )
    assert [first.leaf_index, *(r.leaf_index for r in second)] == [0, 1, 2]
    stored = list(log.entries())
    assert [e.leaf_index for e in stored] == [0, 1, 2]
    assert stored[0].entry == {
        "action": "consent.granted",
        "app_id": "app-1",
        "recorded_at": "2025-01-01T00:00:00.000000Z",
        "subject_ref": "sub_1",
    }
    assert stored[0].entry_json == json.dumps(
        stored[0].entry, separators=(",", ":"), sort_keys=True
    )
    assert stored[2].recorded_at == "2029-12-31T23:00:00.000000Z"
    for record, entry in zip([first, *second], stored, strict=True):
        assert record.leaf_hash == entry.leaf_hash == leaf_hash(entry.entry_json.encode())


def test_empty_log(log: AuditLog) -> None:
    assert log.size() == 0
    assert log.root() == EMPTY_ROOT
    assert log.latest_checkpoint() is None
    assert log.append_many([]) == []
    note = log.checkpoint()
    assert verify_checkpoint(note, log.public_key, ORIGIN) == (0, EMPTY_ROOT)


def test_roots_and_proofs_match_the_in_memory_tree(log: AuditLog) -> None:
    tree = fill(log, 45)
    assert log.size() == 45
    for size in range(46):
        assert log.root(size) == tree.root(size)
    for size in range(1, 46):
        root = tree.root(size)
        for index in range(size):
            proof = log.inclusion_proof(index, size)
            assert proof == tree.inclusion_proof(index, size)
            verify_inclusion(tree.node(0, index), index, size, proof, root)
        for old in range(size + 1):
            proof = log.consistency_proof(old, size)
            assert proof == tree.consistency_proof(old, size)
            verify_consistency(old, size, tree.root(old), root, proof)


def test_out_of_range_requests_are_refused(log: AuditLog) -> None:
    fill(log, 5)
    with pytest.raises(InvalidInputError):
        log.root(6)
    with pytest.raises(InvalidInputError):
        log.inclusion_proof(5, 5)
    with pytest.raises(InvalidInputError):
        log.inclusion_proof(0, 6)
    with pytest.raises(InvalidInputError):
        log.consistency_proof(6)


def test_proofs_cost_a_bounded_number_of_queries(
    sqlite_log: AuditLog, sqlite_engine: sa.Engine
) -> None:
    fill(sqlite_log, 3000, batch=500)
    with statements(sqlite_engine) as seen:
        sqlite_log.inclusion_proof(1234)
    assert len(seen) <= 4  # size, leaves, inner nodes
    with statements(sqlite_engine) as seen:
        sqlite_log.consistency_proof(1001)
    assert len(seen) <= 4


def test_checkpoints_are_signed_stored_and_reused(log: AuditLog) -> None:
    tree = fill(log, 10)
    note = log.checkpoint()
    assert verify_checkpoint(note, log.public_key, ORIGIN) == (10, tree.root())
    assert log.checkpoint() == note
    latest = log.latest_checkpoint()
    assert latest is not None and (latest.tree_size, latest.note) == (10, note)
    fill(log, 3)
    later = log.checkpoint_record()
    assert later.tree_size == 13
    assert [c.tree_size for c in log.checkpoints()] == [10, 13]
    assert log.latest_checkpoint() == later


def test_filters(log: AuditLog) -> None:
    fill(log, 60)
    everything = list(log.entries())
    assert len(everything) == 60

    def expect(**conditions: Any) -> list[int]:
        since, until = conditions.pop("since", None), conditions.pop("until", None)
        return [
            e.leaf_index
            for e in everything
            if all(e.entry.get(k) == v for k, v in conditions.items())
            and (since is None or e.recorded_at >= since)
            and (until is None or e.recorded_at < until)
        ]

    since = "2025-01-01T00:00:10.000000Z"
    until = datetime(2025, 1, 1, 0, 0, 40, tzinfo=UTC)
    cases = [
        {"subject_ref": "sub_0003"},
        {"app_id": "app-1"},
        {"action": "KeyCreated"},
        {"subject_ref": "sub_0002", "app_id": "app-2"},
        {"since": since},
        {"until": "2025-01-01T00:00:40Z"},
        {"since": since, "until": "2025-01-01T01:00:40+01:00", "action": "AccessDecision"},
    ]
    for case in cases:
        got = [e.leaf_index for e in log.entries(**case)]
        assert got == expect(
            **{k: v for k, v in case.items() if k not in ("until",)},
            **({"until": "2025-01-01T00:00:40.000000Z"} if "until" in case else {}),
        )
        assert got, case
    assert [e.leaf_index for e in log.entries(until=until)] == list(range(40))
    assert [e.leaf_index for e in log.entries(tree_size=5)] == list(range(5))


def test_long_scans_page_through_all_entries(sqlite_log: AuditLog) -> None:
    fill(sqlite_log, 2500, batch=1000)
    assert [e.leaf_index for e in sqlite_log.entries()] == list(range(2500))


def test_a_refused_entry_writes_nothing(log: AuditLog) -> None:
    fill(log, 3)
    with pytest.raises(AuditEntryError):
        log.append_many([{"action": "ok"}, {"action": "ok", "name": "Jane"}])
    with pytest.raises(AuditEntryError):
        log.append({"action": "x", "counts": {"n": 0.5}})
    assert log.size() == 3


def test_no_public_method_mutates_existing_rows(log: AuditLog, engine: sa.Engine) -> None:
    public = {name for name, _ in inspect.getmembers(AuditLog) if not name.startswith("_")}
    assert not {
        n
        for n in public
        if any(w in n for w in ("update", "delete", "remove", "edit", "truncate", "purge"))
    }
    with statements(engine) as seen:
        fill(log, 20)
        log.checkpoint()
        log.checkpoint()
        log.root(7)
        log.inclusion_proof(3, 9)
        log.consistency_proof(4, 17)
        list(log.entries(subject_ref="sub_0001"))
        log.latest_checkpoint()
        log.verify_integrity()
    # (``PRAGMA synchronous``: a new checkpoint is committed flushed, bug IF; no row moves.)
    reads_or_inserts = ("SELECT", "INSERT", "BEGIN", "PRAGMA SYNCHRONOUS")
    writes = [s for s in seen if not s.lstrip().upper().startswith(reads_or_inserts)]
    assert writes == []
    assert not [s for s in seen if "ON CONFLICT" in s.upper() or "REPLACE" in s.upper()]


def test_the_database_refuses_updates_and_deletes(log: AuditLog, engine: sa.Engine) -> None:
    fill(log, 4)
    log.checkpoint()
    attempts = [
        audit_entries.update().values(action="forged"),
        audit_entries.delete().where(audit_entries.c.leaf_index == 1),
        audit_nodes.delete(),
        sa.text("UPDATE audit_checkpoints SET note = 'x'"),
        sa.text("DELETE FROM audit_checkpoints"),
    ]
    for statement in attempts:
        with pytest.raises(sa.exc.DatabaseError, match="append-only"), engine.begin() as conn:
            conn.execute(statement)
    if engine.dialect.name == "postgresql":
        with pytest.raises(sa.exc.DatabaseError, match="append-only"), engine.begin() as conn:
            conn.execute(sa.text("TRUNCATE audit_entries CASCADE"))
    assert log.size() == 4
    assert log.verify_integrity() == 4


def test_verify_integrity_finds_a_rewritten_row(
    sqlite_log: AuditLog, sqlite_engine: sa.Engine
) -> None:
    fill(sqlite_log, 30)
    sqlite_log.checkpoint()
    assert sqlite_log.verify_integrity() == 30
    with sqlite_engine.begin() as conn:  # an attacker with database access drops the guard
        conn.exec_driver_sql("DROP TRIGGER trg_audit_entries_no_update")
        conn.execute(
            audit_entries.update()
            .where(audit_entries.c.leaf_index == 17)
            .values(entry_json='{"action":"forged","recorded_at":"2025-01-01T00:00:17.000000Z"}')
        )
    with pytest.raises(VerificationError) as caught:
        sqlite_log.verify_integrity()
    assert caught.value.leaf_index == 17


def test_a_stored_checkpoint_with_another_root_is_reported(
    sqlite_log: AuditLog, sqlite_engine: sa.Engine
) -> None:
    fill(sqlite_log, 8)
    with sqlite_engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO audit_checkpoints VALUES (8, ?, 'forged', '2025-01-01T00:00:00.000000Z')",
            (b"\x00" * 32,),
        )
    with pytest.raises(VerificationError, match="different root"):
        sqlite_log.checkpoint()
    with pytest.raises(VerificationError, match="different root"):
        sqlite_log.verify_integrity()


def _append_in_thread(url: str, key: Ed25519PrivateKey, worker: int, out: list[int]) -> None:
    engine = sa.create_engine(url)
    try:
        log = audit_log_on(engine, key)
        for batch in range(20):
            entries = [
                {"action": "concurrent", "agent_id": f"w{worker}-{batch}-{i}"}
                for i in range(1 + batch % 4)
            ]
            out.extend(r.leaf_index for r in log.append_many(entries))
    finally:
        engine.dispose()


def test_two_writers_append_dense_indexes(
    backend: Backend, log: AuditLog, signing_key: Ed25519PrivateKey
) -> None:
    results: list[list[int]] = [[], []]
    threads = [
        threading.Thread(target=_append_in_thread, args=(backend.url, signing_key, w, results[w]))
        for w in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(len(r) for r in results)
    assert total == 2 * sum(1 + b % 4 for b in range(20))
    assert sorted(results[0] + results[1]) == list(range(total))
    assert log.size() == total
    assert log.verify_integrity() == total


def _append_in_process(url: str, key_pem: bytes, worker: int) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(key_pem, password=None)
    assert isinstance(key, Ed25519PrivateKey)
    _append_in_thread(url, key, worker, [])


def test_two_processes_append_dense_indexes(
    backend: Backend, log: AuditLog, signing_key: Ed25519PrivateKey
) -> None:
    pem = signing_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    context = children.CONTEXT
    processes = [
        context.Process(target=_append_in_process, args=(backend.url, pem, w)) for w in range(2)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0]
    total = 2 * sum(1 + b % 4 for b in range(20))
    assert sorted(e.leaf_index for e in log.entries()) == list(range(total))
    assert log.verify_integrity() == total


def test_log_reopened_on_existing_tables_continues(
    log: AuditLog, engine: sa.Engine, signing_key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    tree = fill(log, 9)
    reopened = AuditLog(
        engine, signing_key, ORIGIN, backend=backend_for(engine), retry=AUDIT_APPEND.call
    )
    record = reopened.append({"action": "later"})
    tree.append(record.leaf_hash)
    assert record.leaf_index == 9
    assert reopened.root() == tree.root()
