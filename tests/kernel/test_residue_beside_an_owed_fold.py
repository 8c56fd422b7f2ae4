"""Review of 0125 (bug EU): the residue scan must not say "clean" while a fold is owed.

A start that destroyed again what a restored key folder brought back, beside a reader of
``keys.sqlite``, could not fold: the deletion sits in the WAL and the erased subject's
wrapped key stays in the main file (DU's ``.fold-owed`` marker says so). The scan reads
the key store through SQL, where the rows are gone, and the key bytes are no search term,
so nothing it looked at found them. SQLite only: PostgreSQL's WAL is the server's.
"""

from __future__ import annotations

import shutil

import pytest

import uprof.backends.sqlite as sqlite_backend
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.test_erasure_beside_a_reader import _files_holding, _reader, _wrapped_keys
from tests.kernel.test_fold_owed_across_starts import _short_lived_start
from tests.kernel.test_keys_apart import ALICE, BOB, fill

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def test_the_residue_scan_is_not_clean_while_a_fold_is_owed(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "FOLD_TIMEOUT_S", 2.0)
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    old = backend.data_dir / "old-keys.sqlite"
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
        wrapped = _wrapped_keys(keys_db, str(k.stream_of("alice")))
        assert wrapped
    shutil.copy2(keys_db, old)
    with running(settings, clock) as k:
        k.erase_subject("alice")
    for suffix in ("-wal", "-shm"):
        keys_db.with_name("keys.sqlite" + suffix).unlink(missing_ok=True)
    shutil.copy2(old, keys_db)  # the key store put back from before the erasure
    old.unlink()
    reader = _reader(keys_db)
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "HOLD"
        _short_lived_start(settings)  # re-destroys, cannot fold, and ends
        assert "keys.sqlite" in _files_holding(settings.key_path, wrapped)  # fold owed
        with running(settings, clock) as k:
            report = k.residue_scan(["no such term"])
            # The erased subject's wrapped key is still in keys.sqlite's main file.
            assert "keys.sqlite" in _files_holding(settings.key_path, wrapped)
            assert not report.clean
            assert any("keys.sqlite" in f.location for f in report.findings), report.findings
    finally:
        reader.kill()
        reader.wait()
        if reader.stdout is not None:
            reader.stdout.close()
