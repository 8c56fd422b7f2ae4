"""The checkpoint anchor (bug HE): kept apart from the log, only ever raised, read first.

``tests/kernel/test_audit_log_rollback.py`` puts back older copies with real processes;
these pin the anchor's own rules on both backends.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.errors import VerificationError
from audit.keyring import ANCHOR_FILE, FileKeyRing
from audit.log import AuditLog
from tests.audit.conftest import ORIGIN, make_clock, sample_entry
from uprof.backends import backend_for


class _AnotherWriterFirst:
    """A key folder whose anchor read lets another process append and sign first: the
    interleaving of a checkpoint whose log read would precede the other's append."""

    def __init__(self, ring: FileKeyRing, other: AuditLog) -> None:
        self._ring, self._other = ring, other
        self.armed = False

    def anchored_checkpoint(self) -> str | None:
        if self.armed:
            self.armed = False
            self._other.append(sample_entry(99))
            self._other.checkpoint()
        return self._ring.anchored_checkpoint()

    def raise_checkpoint_anchor(self, tree_size: int, note: str) -> None:
        self._ring.raise_checkpoint_anchor(tree_size, note)

    def forget_checkpoint_anchor(self) -> None:
        self._ring.forget_checkpoint_anchor()


def _log(engine: sa.Engine, ring: FileKeyRing, anchor: object) -> AuditLog:
    return AuditLog(
        engine, ring, ORIGIN, backend=backend_for(engine), clock=make_clock(), anchor=anchor
    )  # type: ignore[arg-type]


def test_another_process_signing_meanwhile_is_not_taken_for_a_rollback(
    engine: sa.Engine, tmp_path: Path
) -> None:
    ring = FileKeyRing(tmp_path / "keys")
    other = _log(engine, ring, ring)
    racing = _AnotherWriterFirst(ring, other)
    log = _log(engine, ring, racing)
    for i in range(3):
        log.append(sample_entry(i))
    log.checkpoint()
    racing.armed = True
    record = log.checkpoint_record()  # the other's append and checkpoint land first
    assert record.tree_size == 4 == log.verify_integrity()
    assert ring.anchored_checkpoint() is not None
    assert ring.anchored_checkpoint().split("\n")[1] == "4"  # type: ignore[union-attr]


def test_the_anchor_only_grows_and_a_restore_forgets_it(engine: sa.Engine, tmp_path: Path) -> None:
    ring = FileKeyRing(tmp_path / "keys")
    log = _log(engine, ring, ring)
    for i in range(5):
        log.append(sample_entry(i))
    five = log.checkpoint()
    ring.raise_checkpoint_anchor(2, "origin\n2\nnot a note\n")  # a smaller one is ignored
    assert ring.anchored_checkpoint() == five
    assert not list(ring.folder.glob(f".{ANCHOR_FILE}.*.tmp"))

    # Another deployment's checkpoint in the key folder is not trusted: nothing is signed.
    foreign = AuditLog(
        engine, Ed25519PrivateKey.generate(), ORIGIN, backend=backend_for(engine)
    ).checkpoint()
    (ring.folder / ANCHOR_FILE).write_text(foreign)
    with pytest.raises(VerificationError):
        log.checkpoint()

    log.reanchor()  # what `uprof restore` does when it takes a backup's log
    assert ring.anchored_checkpoint() is None
    log.append(sample_entry(5))
    assert log.checkpoint_record().tree_size == 6 == log.verify_integrity()
