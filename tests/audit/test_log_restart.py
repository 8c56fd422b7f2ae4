"""A log restart in the audit key history (``uprof restore --restart-audit-log``, bug MP).

The old timeline: a log of 5 entries, its first key rotated out there (the point (5, R)),
3 entries more. A backup of its first 3 entries is put back and restarted: the current key
signs, with a new key, a ``log_restart`` record naming where the log restarts (3, its
root) and the point it abandons. These are the attacks on it."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import sign_checkpoint, verify_checkpoint
from audit.errors import AuditKeyError, VerificationError
from audit.export import export_jsonl
from audit.keyring import (
    HISTORY_FORMAT_V2,
    HISTORY_FORMAT_V3,
    LOG_RESTART,
    NEXT_KEY_FILE,
    RETIRED_AT,
    FileKeyRing,
    _new_record,
    extend_history,
    verify_key_history,
)
from audit.keys import RetiredAt, key_id, load_signing_key
from audit.log import AuditLog
from audit.tables import create_tables
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN, audit_log_on
from tests.audit.test_log import fill
from uprof.backends import backend_for


def _sqlite(path: Path) -> sa.Engine:
    eng = sa.create_engine(f"sqlite:///{path}")
    create_tables(eng, backend_for(eng))
    return eng


def _history(ring: FileKeyRing) -> Any:
    return json.loads(ring.history_path.read_text())


class Timeline:
    def __init__(self, tmp_path: Path) -> None:
        self.ring = FileKeyRing(tmp_path / "keys")
        self.old = audit_log_on(_sqlite(tmp_path / "old.sqlite"), self.ring)
        fill(self.old, 5)
        self.first = self.ring.current()  # leaked, as a backup may hold it
        self.ring.rotate(log_head=self.old.held_head)
        fill(self.old, 3)
        self.second = load_signing_key(self.ring.key_path)
        self.beyond = self.old.checkpoint()  # the second key, size 8, old timeline
        self.trail = tmp_path / "old.jsonl"  # its whole trail, exported then
        export_jsonl(self.old, self.trail)


def _restarted(tmp_path: Path, engine: sa.Engine) -> tuple[Timeline, AuditLog]:
    """The old timeline, and its first 3 entries put back on ``engine`` and restarted."""
    t = Timeline(tmp_path)
    log = audit_log_on(engine, t.ring)
    log.append_many([json.loads(e.entry_json) for e in t.old.entries()][:3])
    assert log.root(3) == t.old.root(3)
    t.ring.rotate(log_head=log.held_head, restart=True)
    return t, log


def test_a_restart_is_recorded_signed_and_moves_the_points_down(
    engine: sa.Engine, tmp_path: Path
) -> None:
    t, log = _restarted(tmp_path, engine)
    history = _history(t.ring)
    assert history["format"] == HISTORY_FORMAT_V3
    record = history["keys"][-1]
    assert record[RETIRED_AT]["tree_size"] == 3
    assert record[LOG_RESTART]["abandoned"]["tree_size"] == 5
    verified = verify_key_history(history, t.first.public_key())
    for key in (t.first, t.second):
        point = verified.retired_at[key_id(key)]
        assert (point.tree_size, point.root, point.abandoned) == (3, log.root(3), 5)
    # The restarted log grows past the abandoned point and verifies, whole.
    fill(log, 6)
    log.verify_integrity()
    export_jsonl(log, tmp_path / "trail.jsonl")
    report = verify_export(
        tmp_path / "trail.jsonl", t.first.public_key(), ORIGIN, key_history=history
    )
    assert report.rotation_points_checked == 1


def test_the_abandoned_range_is_refused_naming_the_restart(
    engine: sa.Engine, tmp_path: Path
) -> None:
    t, log = _restarted(tmp_path, engine)
    keys = verify_key_history(_history(t.ring), t.first.public_key()).trusted
    # The old timeline's checkpoint (the second key, 8) and its trail: refused.
    with pytest.raises(VerificationError, match="restarted at tree size 3"):
        verify_checkpoint(t.beyond, keys, ORIGIN)
    with pytest.raises(VerificationError, match="restarted at tree size 3"):
        verify_export(t.trail, keys, ORIGIN)
    # The leaked first key at its old point (5, R), and either retired key at the
    # restart's size with another root: refused.
    for key in (t.first, t.second):
        with pytest.raises(VerificationError, match="restarted"):
            verify_checkpoint(sign_checkpoint(key, ORIGIN, 5, t.old.root(5)), keys, ORIGIN)
        with pytest.raises(VerificationError, match="forks the log"):
            verify_checkpoint(sign_checkpoint(key, ORIGIN, 3, b"\x02" * 32), keys, ORIGIN)
    # Below the restart: the real log's proof to (3, root) verifies, a fork's is refused.
    note = sign_checkpoint(t.first, ORIGIN, 2, log.root(2))
    proof = [base64.b64encode(h).decode() for h in log.consistency_proof(2, 3)]
    assert verify_checkpoint(note, keys, ORIGIN, rotation_proof=proof).tree_size == 2
    forged = sign_checkpoint(t.first, ORIGIN, 2, b"\x03" * 32)
    with pytest.raises(VerificationError, match="a retired key's fork"):
        verify_checkpoint(forged, keys, ORIGIN, rotation_proof=proof)


def test_an_edited_restart_record_is_refused(engine: sa.Engine, tmp_path: Path) -> None:
    t, _ = _restarted(tmp_path, engine)
    history = _history(t.ring)
    edits: dict[str, Callable[[dict[str, Any]], object]] = {
        "the abandoned point moved": lambda r: r[LOG_RESTART]["abandoned"].update(tree_size=8),
        "the restart point moved": lambda r: r[RETIRED_AT].update(tree_size=4),
        "the restart removed": lambda r: r.pop(LOG_RESTART),
    }
    for what, edit in edits.items():
        edited = copy.deepcopy(history)
        edit(edited["keys"][-1])
        with pytest.raises(VerificationError):
            verify_key_history(edited, t.first.public_key())
            pytest.fail(f"{what}: accepted")
    # Relabelled as a v2 history (what a verifier before restarts reads): refused whole.
    relabelled = {**copy.deepcopy(history), "format": HISTORY_FORMAT_V2}
    with pytest.raises(VerificationError, match="v3"):
        verify_key_history(relabelled, t.first.public_key())


def test_a_leaked_retired_key_cannot_write_a_restart(engine: sa.Engine, tmp_path: Path) -> None:
    """The first key (retired at 5, leaked) writes a restart record of its own after the
    second key's record: its endorsement is not the key before's, so the history is
    refused by every verifier pinning any of its keys."""
    t = Timeline(tmp_path)
    history = _history(t.ring)
    forged_key = Ed25519PrivateKey.generate()
    record = _new_record(
        forged_key,
        history["keys"][-1]["created_at"],
        history["keys"][-1],
        t.first,
        RetiredAt(1, t.old.root(1)),
        RetiredAt(5, t.old.root(5)),
    )
    forged = {"format": HISTORY_FORMAT_V3, "keys": [*history["keys"], record]}
    for pinned in (t.first, t.second, forged_key):
        with pytest.raises(VerificationError, match="endorsement"):
            verify_key_history(forged, pinned.public_key())
    # Nor can a restart abandon a point other than the highest, or nothing.
    for restart_at, abandons in (
        (RetiredAt(1, t.old.root(1)), RetiredAt(4, t.old.root(4))),
        (RetiredAt(6, t.old.root(6)), RetiredAt(5, t.old.root(5))),
    ):
        wrong = extend_history(
            history,
            t.second,
            Ed25519PrivateKey.generate(),
            record["created_at"],
            restart_at,
            abandons,
        )
        with pytest.raises(VerificationError, match="abandon"):
            verify_key_history(wrong, t.first.public_key())


def test_a_restart_with_no_point_above_the_log_changes_nothing(
    engine: sa.Engine, tmp_path: Path
) -> None:
    t = Timeline(tmp_path)
    before = t.ring.history_path.read_bytes()
    with pytest.raises(AuditKeyError, match="nothing to restart"):
        t.ring.rotate(log_head=t.old.held_head, restart=True)  # 8 entries, point at 5
    with pytest.raises(AuditKeyError, match="log_head"):
        t.ring.rotate(restart=True)
    assert t.ring.history_path.read_bytes() == before
    assert not (t.ring.folder / NEXT_KEY_FILE).exists()
    assert load_signing_key(t.ring.key_path).public_key().public_bytes_raw() == (
        t.second.public_key().public_bytes_raw()
    )
