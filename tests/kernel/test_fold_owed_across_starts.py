"""Review of 0123 (bug DU): a fold CU owes must outlive the process that owed it.

A start that destroys again what a restored key folder brought back, beside a reader of
``keys.sqlite``, folds in the background only while it runs. A short-lived process (a
CLI command, a start that fails later) ends with the fold still owed; the next start
finds nothing to destroy again and so owes nothing, and a server started then keeps the
erased subject's wrapped key in the key store's main file for as long as it runs (only
the last connection's close folds). SQLite only: PostgreSQL's WAL is the server's.
"""

from __future__ import annotations

import pytest

import uprof.backends.sqlite as sqlite_backend
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.sqlite_readers import (
    files_holding,
    files_holding_once_folded,
    key_store_put_back_after_erasure,
    reader_holding,
    short_lived_start,
)
from tests.kernel.test_keys_apart import BOB, assert_intact

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def test_a_fold_owed_by_a_start_that_ended_is_done_by_the_next_start(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "FOLD_TIMEOUT_S", 2.0)
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    _, wrapped = key_store_put_back_after_erasure(backend, settings, clock)
    with reader_holding(keys_db):
        short_lived_start(settings)  # re-destroys, cannot fold, and ends
        assert files_holding(settings.key_path, wrapped) != []  # the fold is owed
    with running(settings, clock) as k:  # the next start, long-lived (a server)
        holding = files_holding_once_folded(settings.key_path, wrapped)
        # Still running: no file of the key folder holds the erased subject's key.
        assert holding == [], holding
        assert_intact(k, "bob", BOB)
