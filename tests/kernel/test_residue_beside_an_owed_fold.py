"""Review of 0125 (bug EU): the residue scan must not say "clean" while a fold is owed.

A start that destroyed again what a restored key folder brought back, beside a reader of
``keys.sqlite``, could not fold: the deletion sits in the WAL and the erased subject's
wrapped key stays in the main file (DU's ``.fold-owed`` marker says so). The scan reads
the key store through SQL, where the rows are gone, and the key bytes are no search term,
so nothing it looked at found them. SQLite only: PostgreSQL's WAL is the server's.
"""

from __future__ import annotations

import pytest

import uprof.backends.sqlite as sqlite_backend
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.sqlite_readers import (
    files_holding,
    key_store_put_back_after_erasure,
    reader_holding,
    short_lived_start,
)

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def test_the_residue_scan_is_not_clean_while_a_fold_is_owed(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "FOLD_TIMEOUT_S", 2.0)
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    _, wrapped = key_store_put_back_after_erasure(backend, settings, clock)
    with reader_holding(keys_db):
        short_lived_start(settings)  # re-destroys, cannot fold, and ends
        assert "keys.sqlite" in files_holding(settings.key_path, wrapped)  # fold owed
        with running(settings, clock) as k:
            report = k.residue_scan(["no such term"])
            # The erased subject's wrapped key is still in keys.sqlite's main file.
            assert "keys.sqlite" in files_holding(settings.key_path, wrapped)
            assert not report.clean
            assert any("keys.sqlite" in f.location for f in report.findings), report.findings
