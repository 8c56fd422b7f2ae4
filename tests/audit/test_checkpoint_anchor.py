"""The checkpoint anchor (bug HE): kept apart from the log, only ever raised, read first.

``tests/kernel/test_audit_log_rollback.py`` puts back older copies with real processes;
these pin the anchor's own rules on both backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.errors import VerificationError
from audit.keyring import ANCHOR_FILE, FileKeyRing
from audit.log import AuditLog
from audit.tables import create_tables
from tests.audit.conftest import ORIGIN, make_clock, sample_entry
from tests.conftest import Backend
from uprof.backends import backend_for
from uprof.storage import create_engine


class _AnotherWriterFirst:
    """A key folder whose anchor read lets another process append and sign first: the
    interleaving of a checkpoint whose log read would precede the other's append."""

    def __init__(self, ring: FileKeyRing, other: AuditLog) -> None:
        self._ring, self._other = ring, other
        self.armed = False

    def anchored_checkpoint(self) -> str | None:
        if self.armed:
            self.armed = False
            self._other.append(sample_entry(99))
            self._other.checkpoint()
        return self._ring.anchored_checkpoint()

    def raise_checkpoint_anchor(self, tree_size: int, note: str) -> None:
        self._ring.raise_checkpoint_anchor(tree_size, note)

    def forget_checkpoint_anchor(self) -> None:
        self._ring.forget_checkpoint_anchor()


def _log(engine: sa.Engine, ring: FileKeyRing, anchor: object) -> AuditLog:
    return AuditLog(
        engine, ring, ORIGIN, backend=backend_for(engine), clock=make_clock(), anchor=anchor
    )  # type: ignore[arg-type]


def test_another_process_signing_meanwhile_is_not_taken_for_a_rollback(
    engine: sa.Engine, tmp_path: Path
) -> None:
    ring = FileKeyRing(tmp_path / "keys")
    other = _log(engine, ring, ring)
    racing = _AnotherWriterFirst(ring, other)
    log = _log(engine, ring, racing)
    for i in range(3):
        log.append(sample_entry(i))
    log.checkpoint()
    racing.armed = True
    record = log.checkpoint_record()  # the other's append and checkpoint land first
    assert record.tree_size == 4 == log.verify_integrity()
    assert ring.anchored_checkpoint() is not None
    assert ring.anchored_checkpoint().split("\n")[1] == "4"  # type: ignore[union-attr]


def test_the_anchor_only_grows_and_a_restore_forgets_it(engine: sa.Engine, tmp_path: Path) -> None:
    ring = FileKeyRing(tmp_path / "keys")
    log = _log(engine, ring, ring)
    for i in range(5):
        log.append(sample_entry(i))
    five = log.checkpoint()
    ring.raise_checkpoint_anchor(2, "origin\n2\nnot a note\n")  # a smaller one is ignored
    assert ring.anchored_checkpoint() == five
    assert not list(ring.folder.glob(f".{ANCHOR_FILE}.*.tmp"))

    # Another deployment's checkpoint in the key folder is not trusted: nothing is signed.
    foreign = AuditLog(
        engine, Ed25519PrivateKey.generate(), ORIGIN, backend=backend_for(engine)
    ).checkpoint()
    (ring.folder / ANCHOR_FILE).write_text(foreign)
    with pytest.raises(VerificationError):
        log.checkpoint()

    log.reanchor()  # what `uprof restore` does when it takes a backup's log
    assert ring.anchored_checkpoint() is None
    log.append(sample_entry(5))
    assert log.checkpoint_record().tree_size == 6 == log.verify_integrity()


def test_a_new_checkpoint_is_stored_flushed_before_the_anchor_names_it(
    backend: Backend, tmp_path: Path
) -> None:
    """The key folder's anchor is flushed; the views store's commits are not (SQLite
    ``synchronous=NORMAL``). The checkpoint row is committed flushed, which flushes every
    entry before it, so a power cut cannot leave the anchor naming entries the log lost
    (review of 0139). Seen from the driver: the durability setting in force when each
    statement runs."""
    engine = create_engine(backend.url)
    create_tables(engine, backend_for(engine))
    seen: list[tuple[str, object]] = []

    def durability(conn: object, cursor: Any, statement: str, *_: object) -> None:
        ask = "PRAGMA synchronous" if backend.kind == "sqlite" else "SHOW synchronous_commit"
        for table in ("audit_entries", "audit_checkpoints"):
            if statement.lstrip().upper().startswith(f"INSERT INTO {table.upper()}"):
                seen.append((table, cursor.connection.execute(ask).fetchone()[0]))

    sa.event.listen(engine, "before_cursor_execute", durability)
    try:
        ring = FileKeyRing(tmp_path / "keys")
        log = _log(engine, ring, ring)
        for i in range(3):
            log.append(sample_entry(i))
        log.checkpoint()
    finally:
        engine.dispose()
    flushed = 2 if backend.kind == "sqlite" else "on"  # FULL / on
    entries = {value for table, value in seen if table == "audit_entries"}
    checkpoints = [value for table, value in seen if table == "audit_checkpoints"]
    if backend.kind == "sqlite":
        assert entries == {1}, seen  # NORMAL: the entries alone are not flushed
    assert checkpoints == [flushed], seen
    assert ring.anchored_checkpoint() is not None
