"""Hostile callers round 6 (bug FV): the residue scan's "unfolded" verdict rested on the
``.fold-owed`` markers alone, which are plain files, unauthenticated.

The scan reads the stores through SQL, where erased rows are gone, and searches the data
folder's bytes for the auditor's terms, where a wrapped key is no term; only the marker
(bug EU) said that a store's main file may still hold erased pages. So the scan said
clean whenever no marker was there although a fold was owed: after an erasure that a
reader of ``keys.sqlite`` kept from folding (``erasure_incomplete``: that path writes no
marker), and after a re-destruction at start whose marker was deleted (the data folder's
markers by anyone who can write that folder; the key store's by the key folder's writer),
or could not be written (a read-only folder). The scan now asks the store itself: it folds
each SQLite store's write-ahead log, and a store it cannot fold is ``unfolded`` whatever
the markers say; a marker that is there while the fold succeeds makes nothing unclean.
SQLite only: PostgreSQL's WAL is the server's (its scan folds nothing and finds none).
"""

from __future__ import annotations

import pytest

import uprof.backends.sqlite as sqlite_backend
from domain.errors import ErasureIncompleteError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.sqlite_readers import (
    files_holding,
    key_store_put_back_after_erasure,
    reader_holding,
    short_lived_start,
    wrapped_keys,
)
from tests.kernel.test_keys_apart import ALICE, BOB, assert_intact, fill
from uprof.services.recovery import FOLD_OWED_SUFFIX

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def test_the_scan_is_not_clean_beside_an_erasure_a_reader_kept_unfolded(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "FOLD_TIMEOUT_S", 2.0)
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        fill(k, "bob", BOB)
        wrapped = wrapped_keys(keys_db, str(k.stream_of("alice")))
        with reader_holding(keys_db):
            with pytest.raises(ErasureIncompleteError):
                k.erase_subject("alice")
            assert files_holding(settings.key_path, wrapped)  # the key is on disk
            assert not list(settings.key_path.glob("*" + FOLD_OWED_SUFFIX))
            report = k.residue_scan(["no such term"])
            assert not report.clean, "clean while the key store holds the erased key"
            assert any(
                f.kind == "unfolded" and "keys.sqlite" in f.location for f in report.findings
            ), report.findings
        k.erase_subject("alice")  # asked again, the reader gone: done
        assert k.residue_scan(["no such term"]).clean
        assert_intact(k, "bob", BOB)


def test_a_deleted_marker_does_not_make_the_scan_clean(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EU's scenario (a start re-destroys a restored key store beside a reader, cannot
    fold, and ends), with the marker deleted before the scan."""
    monkeypatch.setattr(sqlite_backend, "FOLD_TIMEOUT_S", 2.0)
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    _, wrapped = key_store_put_back_after_erasure(backend, settings, clock, bystander=False)
    with reader_holding(keys_db):
        short_lived_start(settings)  # re-destroys, cannot fold, and ends
        marker = keys_db.with_name("keys.sqlite" + FOLD_OWED_SUFFIX)
        assert marker.exists()
        marker.unlink()  # the attack
        with running(settings, clock) as k:
            assert "keys.sqlite" in files_holding(settings.key_path, wrapped)
            report = k.residue_scan(["no such term"])
            assert not report.clean, "clean while keys.sqlite holds the erased key"
            assert any("keys.sqlite" in f.location for f in report.findings), report.findings


def test_forged_markers_in_the_data_folder_neither_fail_a_start_nor_spoil_the_scan(
    backend: Backend, clock: FakeClock
) -> None:
    """A writer of the data folder creates markers where no fold is owed: a file beside
    one store, a folder (which cannot be removed as a marker) beside the other. The start
    folds those stores once, and the scan, which folds them itself, is clean."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        k.erase_subject("alice")
        assert k.residue_scan(["no such term"]).clean
    data = settings.data_dir
    (data / ("views.sqlite" + FOLD_OWED_SUFFIX)).touch()
    (data / ("events.sqlite" + FOLD_OWED_SUFFIX)).mkdir()
    with running(settings, clock) as k:
        report = k.residue_scan(["no such term"])
        assert report.clean, report.findings


def test_an_owed_fold_whose_marker_cannot_be_written_is_neither_receipted_nor_clean(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder where the marker cannot be written (read-only, or its name taken by a
    dangling link): the start only logs it. An erasure beside the same reader still answers
    ``erasure_incomplete``, never a receipt, since it folds every store itself and does not
    read the markers (held on main); the scan says ``unfolded`` (bug FV: clean on main)."""
    monkeypatch.setattr(sqlite_backend, "FOLD_TIMEOUT_S", 2.0)
    settings = settings_for(backend)
    keys_db = settings.key_path / "keys.sqlite"
    _, wrapped = key_store_put_back_after_erasure(backend, settings, clock)
    marker = keys_db.with_name("keys.sqlite" + FOLD_OWED_SUFFIX)
    marker.symlink_to(backend.data_dir / "no-such-folder" / "marker")  # cannot be created
    with reader_holding(keys_db):
        with running(settings, clock) as k:  # re-destroys, cannot fold nor mark it
            assert not marker.exists()
            assert "keys.sqlite" in files_holding(settings.key_path, wrapped)
            with pytest.raises(ErasureIncompleteError):
                k.erase_subject("bob")
            report = k.residue_scan(["no such term"])
            assert any(
                f.kind == "unfolded" and "keys.sqlite" in f.location for f in report.findings
            ), report.findings
