"""Review of 0178 (log restarts): attacks that held, kept as tests.

The timeline of ``test_log_restart``: 5 entries, the first key rotated out there, 3
more; its first 3 entries put back and restarted (``_restarted``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from audit.checkpoint import sign_checkpoint, verify_checkpoint
from audit.errors import AuditKeyError, VerificationError
from audit.export import export_jsonl
from audit.keyring import LOG_RESTART, verify_key_history
from audit.keys import key_id, load_signing_key
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN, audit_log_on
from tests.audit.test_log import fill
from tests.audit.test_log_restart import Timeline, _history, _restarted, _sqlite


def test_a_restart_record_copied_from_another_deployment_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Deployment X restarted its log; its restart record, copied into deployment Y's
    history (same shape: a point at 5, a log of 8), as it is or renumbered: refused by
    the endorsement (X's key is not Y's current one)."""
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
    x, _ = _restarted(tmp_path / "x", engine)
    y = Timeline(tmp_path / "y")
    copied = _history(x.ring)["keys"][-1]
    theirs = _history(y.ring)
    for record in (copied, {**copy.deepcopy(copied), "seq": len(theirs["keys"])}):
        forged = {"format": "uprof.audit-key-history/v3", "keys": [*theirs["keys"], record]}
        with pytest.raises(VerificationError):
            verify_key_history(forged, y.first.public_key())
    # Y's own history is untouched and still verifies; its old timeline's trail too.
    keys = verify_key_history(theirs, y.first.public_key()).trusted
    assert verify_export(y.trail, keys, ORIGIN).rotation_points_checked == 1


def test_a_rotation_after_a_restart_then_a_second_restart_verify(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Restart at 3 (abandoning 5), grow to 6, a plain rotation there, then the log lost
    again and a backup of its first 2 entries restarted: every point moves down to 2.
    The log and its whole trail verify; every statement above 2 of a retired key is
    refused naming the restart; a restart again at 2 has nothing to restart."""
    t, log = _restarted(tmp_path, engine)
    fill(log, 3)  # 6 entries
    third = load_signing_key(t.ring.key_path)
    t.ring.rotate(log_head=log.held_head)
    at_6 = log.checkpoint()  # the fourth key signs its first checkpoint: not retired yet
    fill(log, 2)
    beyond = sign_checkpoint(third, ORIGIN, 6, log.root(6))  # the third key's own point
    again = audit_log_on(_sqlite(tmp_path / "again.sqlite"), t.ring)
    again.append_many([json.loads(e.entry_json) for e in log.entries()][:2])
    t.ring.rotate(log_head=again.held_head, restart=True)
    history = _history(t.ring)
    assert history["keys"][-1][LOG_RESTART]["abandoned"]["tree_size"] == 6
    verified = verify_key_history(history, t.first.public_key())
    assert {(p.tree_size, p.abandoned) for p in verified.retired_at.values()} == {(2, 6)}
    assert len(verified.retired_at) == 4  # first, second, third, fourth
    keys = verified.trusted
    for note in (beyond, at_6, t.beyond):
        with pytest.raises(VerificationError, match="restarted at tree size 2"):
            verify_checkpoint(note, keys, ORIGIN)
    fill(again, 7)
    assert again.verify_integrity() == 9
    export_jsonl(again, tmp_path / "trail.jsonl")
    assert verify_export(tmp_path / "trail.jsonl", keys, ORIGIN).rotation_points_checked == 1
    with pytest.raises(AuditKeyError, match="nothing to restart"):
        t.ring.rotate(log_head=again.held_head, restart=True)
    # The previous restarted log (8 entries, the first restart's timeline) forks now.
    with pytest.raises(VerificationError, match="restarted"):
        log.verify_integrity()
    assert key_id(third) in verified.retired_at
