"""Erasure attacks, round 3: another process holds a read transaction on a SQLite store
(an operator's ``sqlite3`` shell, a backup tool, a scan) while a subject is erased.

The erasure's ``wal_checkpoint(TRUNCATE)`` cannot truncate the WAL while a reader holds
a snapshot: after its 30 s busy wait it returned "busy", which was ignored. The erasure
answered with a receipt while the key folder's ``keys.sqlite-wal`` still held the erased
subject's wrapped data key beside the KEK that unwraps it (and the event log keeps the
ciphertext forever): whoever copied or read the key folder then could read the erased
subject. An erasure must not claim to be done while a WAL holds what it deleted: it
answers ``erasure_incomplete``, and asking again once the reader is gone finishes it
with the receipt of the same request. SQLite only (PostgreSQL's WAL is the server's).
"""

from __future__ import annotations

import pytest

from audit.receipts import verify_receipt
from domain.errors import ErasureIncompleteError, SubjectErasedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.sqlite_readers import files_holding, reader_holding, wrapped_keys
from tests.kernel.test_keys_apart import ALICE, BOB, assert_intact, fill
from uprof.backends import sqlite as sqlite_backend

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


@pytest.fixture(autouse=True)
def _short_fold_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader holds its snapshot until the block ends, so the erasure's fold cannot
    finish however long it tries: it answers the same after 2 s as after the default
    30 s of tries (``FOLD_TIMEOUT_S``), which each test waited out before."""
    monkeypatch.setattr(sqlite_backend, "FOLD_TIMEOUT_S", 2.0)


def test_an_erasure_beside_a_reader_is_not_done_until_the_wal_is_folded(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
        wrapped = wrapped_keys(keys_db, str(k.stream_of("alice")))
        assert wrapped
        with reader_holding(keys_db):
            with pytest.raises(ErasureIncompleteError):
                k.erase_subject("alice")
        done = k.erase_subject("alice")  # asked again, the reader gone
        verify_receipt(done.receipt, k.audit_log.public_key, origin=k.audit_log.origin)
        # Still running (its connections open): no file of the key folder holds the key.
        holding = files_holding(settings.key_path, wrapped)
        assert holding == [], holding
        with pytest.raises(SubjectErasedError):
            k.profile("alice")
        assert_intact(k, "bob", BOB)
        assert k.audit_log.verify_integrity() == k.audit_log.size()


def test_a_receipt_is_never_issued_while_the_wal_holds_the_key(
    backend: Backend, clock: FakeClock
) -> None:
    """The weaker claim on its own: whatever the erasure answers beside a reader, if it
    issues a receipt no file of the key folder may hold the destroyed key then."""
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        wrapped = wrapped_keys(keys_db, str(k.stream_of("alice")))
        with reader_holding(keys_db):
            try:
                k.erase_subject("alice")
                receipted = True
            except ErasureIncompleteError:
                receipted = False
            holding = files_holding(settings.key_path, wrapped)
            assert not (receipted and holding), holding
