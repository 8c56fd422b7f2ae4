"""A backup taken before an audit key rotation, restored into an empty data folder beside
the same key folder (the review of decision 0175 left it open, 0177 "Left"): the restore
took the backup's log, of size m below the point (N, R) where the key history says the
retired key stopped, and new entries grew it past N with another root. Every whole-trail
export then failed ``rotation_points_checked`` from that moment on, silently.

Now such a restore is refused before anything is restored (bug MO), naming the sizes and
the way out, ``uprof restore --restart-audit-log``, which restores and records the
restart in the key history, signed by the current key, so that whole trails verify again
and what the abandoned range signed is refused, naming the restart (bug MP). Both
backends; an empty PostgreSQL deployment is one whose data tables were dropped, the key
tables kept, as in ``tests/kernel/test_restore_bad_input.py``."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from audit.checkpoint import verify_checkpoint
from audit.errors import VerificationError
from audit.keyring import KEY_FILE, verify_key_history
from audit.keys import load_signing_key
from audit.verify import VerificationReport, verify_export
from domain.errors import InvalidInputError
from domain.principal import Principal
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.test_admin_audit import cli_for
from tests.kernel.test_keys_apart import ALICE, BOB, canaries, fill
from tests.kernel.test_restore_bad_input import _empty_data_stores
from uprof.facade import Facade
from uprof.kernel import Uprof
from uprof.services.backup import BackupError, _audit_head, backup, restore
from uprof.settings import Settings
from uprof.storage import RESTORE_MARKER, create_engine, layout_for


@dataclass(frozen=True)
class Before:
    """What the deployment held before the disaster: the backup's log size, checkpoint
    notes of the old timeline (the retired key's inside the backup's log and at its end,
    and in the range a restart abandons; the key current at the disaster's, beyond the
    rotation point), and the point."""

    backup_size: int
    low: str
    low_size: int
    point: int
    at_backup: str
    abandoned: str
    beyond: str


def _pre_rotation_backup(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> tuple[Settings, Before]:
    """Fill, back up, grow, rotate the audit key, grow; then the data stores are lost."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        low = k.audit_log.checkpoint()  # the retired key, inside the backup's log
        low_size = k.audit_log.size()
    backup(settings, tmp_path / "bk-early")
    with running(settings, clock) as k:
        fill(k, "frank", canaries("frank"))
        at_backup = k.audit_log.checkpoint()
        backup_size = k.audit_log.size()
    backup(settings, tmp_path / "bk")
    with running(settings, clock) as k:
        fill(k, "carol", canaries("carol"))
        abandoned = k.audit_log.checkpoint()  # the retired key, between m and N
        Facade(k, Principal.local_operator(k.subjects.tenant)).rotate_audit_key()
        point = _history(k)["keys"][-1]["previous_key_retired_at"]["tree_size"]
        fill(k, "bob", BOB)
        beyond = k.audit_log.checkpoint()  # the key current at the disaster, past N
    assert backup_size < point
    _empty_data_stores(backend, settings)
    return settings, Before(
        backup_size=backup_size,
        low=low,
        low_size=low_size,
        point=point,
        at_backup=at_backup,
        abandoned=abandoned,
        beyond=beyond,
    )


def _history(k: Uprof) -> dict[str, Any]:
    history = k.audit_key_history()
    assert history is not None
    return history


def _whole_trail(settings: Settings, clock: FakeClock) -> VerificationReport:
    """Export the whole trail and verify it offline with the key folder's history."""
    with running(settings, clock) as k:
        out = io.StringIO()
        k.export_audit(out)
        return verify_export(
            out.getvalue().encode(),
            k.audit_log.public_key,
            k.audit_log.origin,
            key_history=k.audit_key_history(),
        )


def _live_entries(settings: Settings) -> int:
    """The live audit log's size, read without starting the deployment (a start writes)."""
    views = create_engine(layout_for(settings).views_url)
    try:
        with views.connect() as conn:
            return _audit_head(conn)[0]
    finally:
        views.dispose()


def test_mo_a_pre_rotation_backup_into_an_empty_folder_is_refused_before_any_change(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings, before = _pre_rotation_backup(backend, clock, tmp_path)
    # Its manifest is the retired key's (0175's LM): that refusal names both flags.
    with pytest.raises(BackupError, match=r"--allow-unsigned .*also --restart-audit-log"):
        restore(settings, tmp_path / "bk")
    with pytest.raises(BackupError) as refused:
        restore(settings, tmp_path / "bk", allow_unsigned=True)
    said = str(refused.value)
    assert f"holds {before.backup_size} entries" in said, said
    assert f"tree size {before.point}" in said, said
    assert "--restart-audit-log" in said and "nothing was changed" in said, said
    # The command says the same, exit 1.
    run = cli_for(backend)
    refused_cli = " ".join(
        run("restore", "--from", str(tmp_path / "bk"), "--allow-unsigned", code=1).split()
    )
    assert "--restart-audit-log" in refused_cli, refused_cli
    # Nothing restored: no marker left, and the live audit log is still empty.
    assert not (settings.data_dir / RESTORE_MARKER).exists()
    assert _live_entries(settings) == 0


def test_mp_restarting_the_audit_log_leaves_a_trail_that_verifies(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings, before = _pre_rotation_backup(backend, clock, tmp_path)
    run = cli_for(backend)
    said = " ".join(
        run(
            "restore", "--from", str(tmp_path / "bk"), "--allow-unsigned", "--restart-audit-log"
        ).split()
    )  # fmt: skip
    assert "audit log restarted" in said, said
    # New entries grow the log past the abandoned point, and the whole trail verifies with
    # the key history as it is now.
    with running(settings, clock) as k:
        fill(k, "dave", canaries("dave"))
        assert k.audit_log.size() > before.point
        k.audit_log.verify_integrity()
        history = _history(k)
        restart = history["keys"][-1]
        entries = [e.entry for e in k.audit_log.entries()]
    report = _whole_trail(settings, clock)
    assert report.rotation_points_checked >= 1
    # The history names the restart: where the log restarts and the point it abandons.
    assert restart["log_restart"]["abandoned"]["tree_size"] == before.point
    assert restart["previous_key_retired_at"]["tree_size"] == before.backup_size
    # The trail says the operator vouched for it.
    restored = next(e for e in entries if e["action"] == "backup.restored")
    assert restored["decision"] == "operator-vouched"
    assert "audit-log-restarted" in restored["rule"]
    restarted = [e for e in entries if e.get("reason_code") == "log-restarted"]
    assert [e["action"] for e in restarted] == ["audit.key_rotated"]
    assert restarted[0]["tree_size"] == restart["previous_key_retired_at"]["tree_size"]

    trusted = verify_key_history(history, load_pem_current(settings)).trusted
    origin = settings.audit_origin
    # What the abandoned range signed is refused, naming the restart, never verified.
    for note in (before.abandoned, before.beyond):
        with pytest.raises(VerificationError, match="restarted"):
            verify_checkpoint(note, trusted, origin)
    # The deployment hands no rotation proof for them either (REST 422, CLI exit 2), and
    # names why.
    with running(settings, clock) as k:
        door = Facade(k, Principal.local_operator(k.subjects.tenant))
        for note in (before.abandoned, before.beyond):
            with pytest.raises(InvalidInputError, match="restarted"):
                door.checkpoint_rotation_proof(note)
    # What the backup's log holds still verifies: at the restart's point as it is, below
    # it with the proof to that point, which the restarted log gives.
    assert verify_checkpoint(before.at_backup, trusted, origin)[0] == before.backup_size
    with pytest.raises(VerificationError, match="rotation proof"):
        verify_checkpoint(before.low, trusted, origin)
    with running(settings, clock) as k:
        proof = k.audit_log.consistency_proof(before.low_size, before.backup_size)
    hashes = [base64.b64encode(h).decode() for h in proof]
    assert verify_checkpoint(before.low, trusted, origin, rotation_proof=hashes)[0] == (
        before.low_size
    )


def load_pem_current(settings: Settings) -> Any:
    return load_signing_key(settings.key_path / KEY_FILE).public_key()


def test_mp_the_flag_with_no_rotation_point_crossed_is_refused(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A backup whose log reaches every rotation point (taken after the rotation) restores
    without a restart: the flag is refused, naming why, and nothing is changed."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        Facade(k, Principal.local_operator(k.subjects.tenant)).rotate_audit_key()
        fill(k, "bob", BOB)
    backup(settings, tmp_path / "bk")
    # Into the live deployment (its log kept): nothing to restart.
    with pytest.raises(BackupError, match="nothing to restart"):
        restore(settings, tmp_path / "bk", restart_audit_log=True)
    _empty_data_stores(backend, settings)
    with pytest.raises(BackupError, match="nothing to restart"):
        restore(settings, tmp_path / "bk", restart_audit_log=True)
    assert _live_entries(settings) == 0
    history_before = (settings.key_path / "audit-keys.json").read_bytes()
    restore(settings, tmp_path / "bk")  # the plain restore takes it
    assert (settings.key_path / "audit-keys.json").read_bytes() == history_before
    assert _whole_trail(settings, clock).entry_count > 0


def test_mp_a_restarted_log_restored_again_from_the_same_or_an_earlier_backup(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The restarted deployment is lost again. The same backup reaches the restart's point
    (the log restarted at its head): a plain restore. An earlier backup does not: a second
    restart, which abandons the first one's point."""
    settings, before = _pre_rotation_backup(backend, clock, tmp_path)
    restore(settings, tmp_path / "bk", allow_unsigned=True, restart_audit_log=True)
    with running(settings, clock) as k:
        fill(k, "dave", canaries("dave"))
    _empty_data_stores(backend, settings)
    with pytest.raises(BackupError, match="nothing to restart"):
        restore(settings, tmp_path / "bk", allow_unsigned=True, restart_audit_log=True)
    restore(settings, tmp_path / "bk", allow_unsigned=True)
    with running(settings, clock) as k:
        fill(k, "erin", canaries("erin"))
    assert _whole_trail(settings, clock).rotation_points_checked >= 1

    _empty_data_stores(backend, settings)
    with pytest.raises(BackupError, match=f"holds {before.low_size} entries"):
        restore(settings, tmp_path / "bk-early", allow_unsigned=True)
    restore(settings, tmp_path / "bk-early", allow_unsigned=True, restart_audit_log=True)
    with running(settings, clock) as k:
        fill(k, "gina", canaries("gina"))
        history = _history(k)
    restarts = [
        r["log_restart"]["abandoned"]["tree_size"] for r in history["keys"] if "log_restart" in r
    ]
    assert restarts == [before.point, before.backup_size]
    assert _whole_trail(settings, clock).rotation_points_checked >= 1
    # The first restart's range is abandoned too: the note at its point is refused now.
    trusted = verify_key_history(history, load_pem_current(settings)).trusted
    with pytest.raises(VerificationError, match="restarted"):
        verify_checkpoint(before.at_backup, trusted, settings.audit_origin)
