"""Review of decision 0160-rotation-bound (decision 0165-review-of-0160): a hostile key
history and a hostile rotation proof, each an attack kept as a test. None found a defect:
the v2 statement both keys sign covers the point, so a history cannot drop, move or reorder
it, and a proof binds the receipt's tree to the recorded root. What is left (a history cut
back before the rotation, to a verifier that pins only the first key) is in the decision."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import sqlalchemy as sa

from audit.errors import VerificationError
from audit.keyring import HISTORY_FORMAT, RETIRED_AT, verify_key_history
from audit.receipts import verify_receipt
from tests.audit.conftest import ORIGIN
from tests.audit.test_rotation_bound import (
    _b64,
    _history,
    _receipt_before_a_rotation,
    _rotated,
)


def test_a_point_dropped_and_the_history_relabelled_v1_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """To escape the bound, drop the point and call the document v1: the record's
    signatures were made over the v2 statement (which holds the point), so they fail."""
    _, ring, leaked = _rotated(engine, tmp_path, 5, 3)
    trimmed = copy.deepcopy(_history(ring))
    trimmed["format"] = HISTORY_FORMAT
    del trimmed["keys"][1][RETIRED_AT]
    with pytest.raises(VerificationError, match="does not verify"):
        verify_key_history(trimmed, leaked.public_key())


def test_reordered_records_and_a_moved_root_are_refused(engine: sa.Engine, tmp_path: Path) -> None:
    log, ring, leaked = _rotated(engine, tmp_path, 5, 3)
    history = _history(ring)
    swapped = copy.deepcopy(history)
    swapped["keys"].reverse()
    with pytest.raises(VerificationError):
        verify_key_history(swapped, leaked.public_key())
    other_root = copy.deepcopy(history)
    other_root["keys"][1][RETIRED_AT]["root"] = _b64([log.root(4)])[0]
    with pytest.raises(VerificationError, match="does not verify"):
        verify_key_history(other_root, leaked.public_key())


def test_a_history_cut_before_the_rotation_is_refused_by_a_verifier_pinning_the_new_key(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """The last record cut off, the leaked key is the history's last: a verifier pinning
    only the first key cannot tell (left, as without a history); one pinning any key
    it saw later refuses the cut history."""
    _, ring, leaked = _rotated(engine, tmp_path, 5, 3)
    history = _history(ring)
    cut = {"format": history["format"], "keys": history["keys"][:1]}
    assert verify_key_history(cut, leaked.public_key()).retired_at == {}  # unbounded
    with pytest.raises(VerificationError, match="not in this key history"):
        verify_key_history(cut, ring.current().public_key())


def test_a_rotation_proof_for_another_tree_is_refused(engine: sa.Engine, tmp_path: Path) -> None:
    log, ring, receipt, signer = _receipt_before_a_rotation(engine, tmp_path)
    history = _history(ring)
    for wrong in (log.consistency_proof(2, 7), log.consistency_proof(3, 6), []):
        with pytest.raises(VerificationError, match="rotation_proof"):
            verify_receipt(
                receipt,
                signer.public_key(),
                origin=ORIGIN,
                key_history=history,
                rotation_proof=_b64(wrong),
            )
