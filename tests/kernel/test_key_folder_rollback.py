"""A key folder put back from a copy older than an erasure does not undo it.

The erasure ledger lives in the key folder, so a copy or restore of the *data* cannot
bring erased data back. Until 2026-12-04 the other direction could: a key folder put
back from a pre-erasure copy (its ledger and key database older than the erasure) held
the subject's data keys again, and the events still in the log decrypted again: the
crypto-shredding undone ("the one thing that can undo an erasure", docs/governance.md).
The data stores now keep their own record of the keys erasures destroyed
(``uprof.services.erased_keys``) and every start joins both records before it re-applies
them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, say, settings_for
from tests.kernel.test_keys_apart import ALICE, BOB, assert_erased_everywhere, assert_intact, fill
from uprof.crypto.keydir import LEDGER_FILE
from uprof.crypto.tables import (
    capture_keys,
    shredded_streams,
    subject_aliases,
    subject_index,
    subject_keys,
)
from uprof.settings import Settings

KEY_TABLES = (subject_keys, capture_keys, subject_index, subject_aliases)


def _save_key_folder(backend: Backend, settings: Settings, to: Path) -> dict[str, Any]:
    """A copy of the whole key folder (ledger, KEK ring, master key) and, on PostgreSQL,
    of the key tables' rows (they live in the database there)."""
    shutil.copytree(settings.key_path, to)
    if backend.kind != "postgres":
        return {}
    engine = sa.create_engine(backend.url)
    try:
        with engine.connect() as conn:
            return {
                t.name: [dict(r) for r in conn.execute(t.select()).mappings()] for t in KEY_TABLES
            }
    finally:
        engine.dispose()


def _put_key_folder_back(backend: Backend, settings: Settings, saved: Path, rows: dict) -> None:
    shutil.rmtree(settings.key_path)
    shutil.copytree(saved, settings.key_path)
    if backend.kind != "postgres":
        return
    engine = sa.create_engine(backend.url)
    try:
        with engine.begin() as conn:
            conn.execute(shredded_streams.delete())
            for table in KEY_TABLES:
                conn.execute(table.delete())
                if rows[table.name]:
                    conn.execute(table.insert(), rows[table.name])
    finally:
        engine.dispose()


def test_a_key_folder_older_than_a_subject_erasure_does_not_bring_it_back(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    k = build_kernel(settings, clock)
    fill(k, "alice", ALICE)
    fill(k, "bob", BOB)
    stream = str(k.stream_of("alice"))
    k.close()
    rows = _save_key_folder(backend, settings, tmp_path / "keys-before")
    k = build_kernel(settings, clock)
    k.erase_subject("alice")
    k.close()
    _put_key_folder_back(backend, settings, tmp_path / "keys-before", rows)
    older = tmp_path / "keys-before" / LEDGER_FILE
    assert not older.exists() or stream not in older.read_text()  # truly older

    k = build_kernel(settings, clock)
    try:
        assert k.keystore.key(stream, 1) is None
        assert k.keystore.is_shredded(stream)
        assert_erased_everywhere(k, "alice", list(ALICE.values()), tmp_path)
        assert_intact(k, "bob", BOB)  # nobody else lost anything
    finally:
        k.close()
    # The ledger has the erasure again: a later data restore cannot undo it either.
    assert stream in (settings.key_path / LEDGER_FILE).read_text()


def test_a_key_folder_older_than_a_capture_erasure_does_not_bring_the_capture_back(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    k = build_kernel(settings, clock)
    fill(k, "alice", ALICE)
    note = k.capture("alice", say("a note to forget Qzxrollbacknote"))
    k.process()
    stream = str(k.stream_of("alice"))
    assert "Qzxrollbacknote" in str(k.export_subject("alice"))
    k.close()
    rows = _save_key_folder(backend, settings, tmp_path / "keys-before")
    k = build_kernel(settings, clock)
    k.erase_capture("alice", note.capture_id)
    k.close()
    _put_key_folder_back(backend, settings, tmp_path / "keys-before", rows)

    k = build_kernel(settings, clock)
    try:
        assert k.keystore.capture_key(stream, note.capture_id) is None
        export = str(k.export_subject("alice"))
        assert "Qzxrollbacknote" not in export
        assert ALICE["attribute"] in export  # the rest of alice stays
    finally:
        k.close()
