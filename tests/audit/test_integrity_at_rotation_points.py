"""Bug MQ (review of decision 0175, "Left"): ``AuditLog.verify_integrity`` compared the
log with its key folder's anchor, but not with the rotation points of the key history.
A log opened without an anchor (a copy checked elsewhere, a tool beside the key folder)
that grew past a point (N, R) with another root verified whole. It now compares the root
it recomputes at each point with the history's (``TrustedKeys.check_log_root``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from audit.errors import VerificationError
from audit.keyring import FileKeyRing
from audit.log import AuditLog
from audit.tables import create_tables
from tests.audit.conftest import ORIGIN, audit_log_on
from tests.audit.test_log import fill
from uprof.backends import backend_for


def test_mq_a_log_opened_without_an_anchor_must_pass_each_rotation_point(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """The old timeline: 5 entries, the key rotated out there, 3 more. Beside the same key
    folder, without an anchor: its first 3 entries, then 4 others (a backup's log grown
    past the point with another root)."""
    ring = FileKeyRing(tmp_path / "keys")
    old_engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.sqlite'}")
    create_tables(old_engine, backend_for(old_engine))
    old = audit_log_on(old_engine, ring)
    fill(old, 5)
    ring.rotate(log_head=old.held_head)
    fill(old, 3)
    old.verify_integrity()  # the honest log passes its point
    forked = AuditLog(engine, ring, ORIGIN, backend=backend_for(engine))  # no anchor
    forked.append_many([json.loads(e.entry_json) for e in old.entries()][:3])
    forked.append_many([{"action": "consent.granted", "subject_ref": f"sub_{i}"} for i in range(4)])
    with pytest.raises(VerificationError, match="rotated out at that size"):
        forked.verify_integrity()
    # Short of the point, the same log is a prefix and verifies.
    short = AuditLog(old_engine, ring, ORIGIN, backend=backend_for(old_engine))
    assert short.verify_integrity() == 8
    old_engine.dispose()
