"""``uprof restore`` given bad input: a clear error, before anything changes."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from domain.errors import InvalidInputError
from tests.conftest import Backend, _create_pg_database, _drop_pg_database, _pg_url
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from tests.kernel.test_keys_apart import assert_bob_intact, filled_deployment
from uprof.backends import backend_for_settings
from uprof.services.backup import KEY_TABLES, BackupError, backup, restore
from uprof.storage import RESTORE_MARKER


def _deployment_with_a_backup(backend: Backend, clock: FakeClock, tmp_path: Path) -> Any:
    settings = filled_deployment(backend, clock, "bob")
    backup(settings, tmp_path / "bk")
    return settings


def _still_intact(settings: Any, clock: FakeClock) -> None:
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert_bob_intact(settings, clock, audit_verifies=False)


def test_a_restore_beside_a_key_folder_without_keys_changes_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A mistyped UPROF_KEY_DIR (or another deployment's backup restored into a new one):
    the restore used to copy the data, then refuse at the start, leaving its marker, so
    that every start refused until the key folder was put right."""
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    wrong = settings.model_copy(update={"key_dir": tmp_path / "mistyped.keys"})
    with pytest.raises(BackupError, match="key folder"):
        restore(wrong, tmp_path / "bk")
    _still_intact(settings, clock)


MUTATIONS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "no-files": lambda m: m.pop("files"),
    "files-a-list": lambda m: m.__setitem__("files", []),
    "no-audit": lambda m: m.pop("audit"),
    "audit-entries-text": lambda m: m["audit"].__setitem__("entries", "many"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_manifest_without_a_field_is_refused_naming_it(
    backend: Backend, clock: FakeClock, tmp_path: Path, mutation: str
) -> None:
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    path = tmp_path / "bk" / "manifest.json"
    manifest = json.loads(path.read_text())
    MUTATIONS[mutation](manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(InvalidInputError, match=r"manifest\.json"):
        restore(settings, tmp_path / "bk")
    _still_intact(settings, clock)


def test_a_file_left_out_of_the_manifest_is_not_restored_unchecked(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The checksums covered only the files the manifest listed; the restore reads its
    files by name. A data file whose entry was removed was restored unchecked."""
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    name = backend_for_settings(settings).backup_files[-1]
    path = tmp_path / "bk" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["files"][name]
    path.write_text(json.dumps(manifest))
    victim = tmp_path / "bk" / name
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # damaged, and no checksum says so any more
    victim.write_bytes(bytes(data))
    with pytest.raises(InvalidInputError, match=name):
        restore(settings, tmp_path / "bk")
    _still_intact(settings, clock)
    shutil.rmtree(tmp_path / "bk")


def test_a_backup_of_another_deployment_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Another deployment's backup, restored into a deployment with its own key folder and
    empty data stores, was taken silently: every subject read as unknown ("no such
    subject") while new captures went on beside the unreadable copy, and the other
    deployment's audit log became this one's."""
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    other_db = _create_pg_database(prefix="uprof_other") if backend.kind == "postgres" else None
    try:
        other = Backend(backend.kind, other_db and _pg_url(other_db), tmp_path / "other")
        build_kernel(settings_for(other), clock).close()  # its own keys, started once
        _empty_data_stores(other, settings_for(other))  # a disaster took its data
        with pytest.raises(BackupError, match="another deployment"):
            restore(settings_for(other), tmp_path / "bk")
        assert not (settings_for(other).data_dir / RESTORE_MARKER).exists()
    finally:
        if other_db:
            _drop_pg_database(other_db)
    _still_intact(settings, clock)


def _empty_data_stores(backend: Backend, settings: Any) -> None:
    """The data stores gone, the key store kept (as a disaster would leave them)."""
    if backend.kind == "sqlite":
        shutil.rmtree(settings.data_dir)
        return
    engine = sa.create_engine(backend.url)
    try:
        with engine.begin() as conn:
            for table in sa.inspect(conn).get_table_names():
                if table not in (*KEY_TABLES, "alembic_version"):
                    conn.execute(sa.text(f'DROP TABLE "{table}" CASCADE'))
    finally:
        engine.dispose()


# ------------------------------------------------------------------ signed manifests


def _rewrite(backup_dir: Path, name: str, edit: Callable[[bytes], bytes]) -> dict[str, Any]:
    """Edit a backed-up file and its checksum, as whoever can write the backup folder
    can; return the manifest as now written."""
    path = backup_dir / name
    path.write_bytes(edit(path.read_bytes()))
    manifest_path = backup_dir / "manifest.json"
    manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    manifest["files"][name]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest["files"][name]["bytes"] = path.stat().st_size
    manifest_path.write_text(json.dumps(manifest))
    return manifest


def test_a_file_edited_with_its_checksum_is_refused_by_the_signature(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The checksums found damage, not edits: whoever could write the backup folder could
    change a file and its checksum, and the restore took it. The manifest is now signed
    with the deployment's audit key, which no backup holds."""
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    name = backend_for_settings(settings).backup_files[0]
    _rewrite(tmp_path / "bk", name, lambda data: data + b"\0")
    with pytest.raises(BackupError, match="edited"):
        restore(settings, tmp_path / "bk")
    _still_intact(settings, clock)


def test_an_unsigned_manifest_is_restored_only_when_allowed(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    path = tmp_path / "bk" / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["signature"]["algorithm"] == "ed25519"
    del manifest["signature"]  # as written before 2026-12-04, or stripped
    path.write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="not signed"):
        restore(settings, tmp_path / "bk")
    _still_intact(settings, clock)
    restore(settings, tmp_path / "bk", allow_unsigned=True)
    _still_intact(settings, clock)


def test_a_manifest_signed_by_another_key_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = _deployment_with_a_backup(backend, clock, tmp_path)
    path = tmp_path / "bk" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["deployment"] = None  # the deployment check skipped: the signature still holds
    forger = Ed25519PrivateKey.generate()
    manifest["signature"] = {
        "algorithm": "ed25519",
        "key_id": manifest["signature"]["key_id"],  # claims the deployment's key
        "value": base64.b64encode(forger.sign(b"anything")).decode(),
    }
    path.write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="edited"):
        restore(settings, tmp_path / "bk")
    manifest["signature"]["key_id"] = "ab" * 32
    path.write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="another key"):
        restore(settings, tmp_path / "bk")
    _still_intact(settings, clock)
