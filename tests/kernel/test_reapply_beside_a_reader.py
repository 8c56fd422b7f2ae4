"""Review of 0119 (bug CU): a start that destroys again what a restored key folder brought
back of an erased subject, while another process holds a read transaction on
``keys.sqlite`` (a backup tool, a shell).

The re-destruction's deletion goes to the WAL; while the reader holds it, the fold
cannot truncate and the main file keeps the old pages: the erased subject's wrapped data
key, beside the KEK that unwraps it, and the log keeps the ciphertext forever. The start
ignored the fold's answer, and nothing folded the file afterwards (the next start finds
nothing to destroy again; only an erasure or the last close would fold). The running
service must fold it once the reader is gone. SQLite only: PostgreSQL's WAL is the
server's.
"""

from __future__ import annotations

import pytest

import uprof.backends.sqlite as sqlite_backend
from domain.errors import SubjectErasedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.sqlite_readers import (
    files_holding_once_folded,
    key_store_put_back_after_erasure,
    reader_holding,
)
from tests.kernel.test_keys_apart import BOB, assert_intact

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def test_a_start_beside_a_reader_folds_the_re_destroyed_keys_once_the_reader_goes(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "FOLD_TIMEOUT_S", 2.0)
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    _, wrapped = key_store_put_back_after_erasure(backend, settings, clock)
    with reader_holding(keys_db) as reader:
        with running(settings, clock) as k:
            with pytest.raises(SubjectErasedError):
                k.profile("alice")
            reader.kill()
            reader.wait()
            holding = files_holding_once_folded(settings.key_path, wrapped)
            # Still running, the reader gone: no file of the key folder holds the key.
            assert holding == [], holding
            assert_intact(k, "bob", BOB)
