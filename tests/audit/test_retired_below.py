"""A retired audit key vouches for nothing below its rotation point on its own word
(decision 0175-retired-below; 0160-rotation-bound closed it for checkpoints above the point
and for receipts below it, 0165-review-of-0160 left the rest).

Whoever holds a leaked retired key (a backup, a leak) signs an export, a proof document
or a backup manifest of a tree of their own no larger than the key's point N. With the
key history (v2), such a statement now verifies only with the log's consistency proof
from its size m to (N, R) (``rotation_proof``), as a receipt does; the verifier refuses it
without, naming the command that hands the proof out. These are the attacks, on both
backends (the forger's fork is a SQLite file of their own)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from functools import partial
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.canonical import canonical_bytes
from audit.errors import VerificationError
from audit.export import export_jsonl
from audit.export_format import EXPORT_SIGNATURE_CONTEXT
from audit.keyring import FileKeyRing, StaticSigningKeys
from audit.keys import key_id, load_signing_key, note_key_id
from audit.log import AuditLog
from audit.proofs import build_proof, verify_proof
from audit.tables import create_tables
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN, audit_log_on
from tests.audit.test_log import fill
from uprof.backends import backend_for


def _b64(hashes: list[bytes]) -> list[str]:
    return [base64.b64encode(h).decode() for h in hashes]


def _history(ring: FileKeyRing) -> Any:
    return json.loads(ring.history_path.read_text())


def _log(engine: sa.Engine, folder: Path) -> tuple[AuditLog, FileKeyRing]:
    ring = FileKeyRing(folder)
    return audit_log_on(engine, ring), ring


def _rotate(log: AuditLog, ring: FileKeyRing) -> Ed25519PrivateKey:
    """Rotate the log's key out at its present size; return the old private key, kept as
    a leak or a backup would keep it."""
    log.checkpoint()  # the key file is written at the first signature
    leaked = load_signing_key(ring.key_path)
    ring.rotate(log_head=log.held_head)
    return leaked


def _fork(
    tmp_path: Path, leaked: Ed25519PrivateKey, copied: AuditLog | None = None, upto: int = 0
) -> tuple[sa.Engine, AuditLog]:
    """The forger's own log, signed by the leaked key: the real log's first ``upto``
    entries copied (the forger has a copy of the log), nothing else yet."""
    fork = sa.create_engine(f"sqlite:///{tmp_path / 'fork.sqlite'}")
    create_tables(fork, backend_for(fork))
    forger = audit_log_on(fork, StaticSigningKeys(leaked))
    if copied is not None and upto:
        forger.append_many(json.loads(e.entry_json) for e in copied.entries(tree_size=upto))
    return fork, forger


def _refused_below_the_point(
    verify: Callable[..., object], history: Any, log: AuditLog, size: int, point: int
) -> None:
    """A forgery of ``size`` by the key retired at ``point``: refused without a rotation
    proof, naming the one it needs, and with the real log's proof from ``size`` to
    ``point``, which does not take a fork there."""
    with pytest.raises(VerificationError, match=f"rotation proof from {size} to {point}"):
        verify(key_history=history)
    with pytest.raises(VerificationError, match="a retired key's fork"):
        verify(key_history=history, rotation_proof=_b64(log.consistency_proof(size, point)))


def _made_up(i: int) -> dict[str, object]:
    """An entry the real log never held."""
    return {"action": "consent.granted", "subject_ref": f"sub_forged{i}", "purpose": "marketing"}


def test_lk_an_export_a_retired_key_signs_over_a_tree_of_its_own_below_the_point_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Bug LK. The leaked key exports a trail of a fork of 3 entries (the point is 5):
    every check of the export passes (its own tree, dense, its root, its trailer), and
    the retired key's range (sizes up to 5) holds it. It verified with the key history."""
    log, ring = _log(engine, tmp_path / "keys")
    fill(log, 5)
    leaked = _rotate(log, ring)
    fill(log, 3)
    fork, forger = _fork(tmp_path, leaked)
    forger.append_many(_made_up(i) for i in range(3))
    export_jsonl(forger, tmp_path / "forged.jsonl")
    export_jsonl(forger, tmp_path / "forged-filtered.jsonl", action="consent.granted")
    history = _history(ring)

    for trail in ("forged.jsonl", "forged-filtered.jsonl"):
        verify = partial(verify_export, tmp_path / trail, leaked.public_key(), ORIGIN)
        _refused_below_the_point(verify, history, log, 3, 5)
    fork.dispose()


def test_an_honest_export_taken_before_the_rotation_verifies_with_its_rotation_proof(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """What LK's rule asks of an honest holder: an export taken before the rotation (its
    checkpoint of size 3, by the key retired at 5) verifies with the history only beside
    the log's proof from 3 to 5; the refusal names the command that gives it. Without the
    history nothing changed (such a verifier does not know of the rotation)."""
    log, ring = _log(engine, tmp_path / "keys")
    fill(log, 3)
    trails = [tmp_path / "whole.jsonl", tmp_path / "filtered.jsonl"]
    export_jsonl(log, trails[0])
    export_jsonl(log, trails[1], action="consent.granted")
    fill(log, 2)
    leaked = _rotate(log, ring)
    fill(log, 4)
    history = _history(ring)
    proof = _b64(log.consistency_proof(3, 5))
    for trail in trails:
        assert verify_export(trail, leaked.public_key(), ORIGIN).tree_size == 3
        with pytest.raises(VerificationError, match="uprof audit rotation-proof"):
            verify_export(trail, leaked.public_key(), ORIGIN, key_history=history)
        report = verify_export(
            trail, leaked.public_key(), ORIGIN, key_history=history, rotation_proof=proof
        )
        assert report.tree_size == 3
        # A proof for another size, or cut short, is refused, never skipped.
        for wrong in (_b64(log.consistency_proof(2, 5)), proof[:-1], []):
            with pytest.raises(VerificationError, match="rotation"):
                verify_export(
                    trail, leaked.public_key(), ORIGIN, key_history=history, rotation_proof=wrong
                )


def test_ln_a_retired_key_signs_a_filtered_export_over_the_current_keys_checkpoint(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Bug LN. A filtered export's trailer signature is what binds its set of entries
    (docs/audit-format.md §5). The header names the key that signs it, but the header's
    checkpoint was verified with any key of the history: a leaked retired key took an
    honest filtered export made after the rotation (its checkpoint by the new key, size 8,
    past the old key's point 5), named itself in the header, dropped an entry and signed
    the trailer. No checkpoint of the retired key was ever checked: it verified."""
    log, ring = _log(engine, tmp_path / "keys")
    fill(log, 5)
    leaked = _rotate(log, ring)
    fill(log, 3)
    honest = tmp_path / "honest.jsonl"
    export_jsonl(log, honest, action="consent.granted")
    lines = honest.read_text().splitlines()
    header, entries = json.loads(lines[0]), lines[1:-1]
    assert len(entries) >= 2
    header["key_id"] = key_id(leaked)
    header["note_key_id"] = note_key_id(ORIGIN, leaked).hex()
    kept = [canonical_bytes(header).decode(), *entries[1:]]  # the first entry hidden
    digest = sha256("".join(f"{line}\n" for line in kept).encode()).digest()
    trailer = {
        "entry_count": len(kept) - 1,
        "export_sha256": digest.hex(),
        "kind": "trailer",
        "signature": base64.b64encode(leaked.sign(EXPORT_SIGNATURE_CONTEXT + digest)).decode(),
    }
    forged = [*kept, canonical_bytes(trailer).decode()]

    with pytest.raises(VerificationError, match="not signed by the key the header names"):
        verify_export(forged, leaked.public_key(), ORIGIN, key_history=_history(ring))
    assert verify_export(honest, leaked.public_key(), ORIGIN, key_history=_history(ring))


def test_ll_a_proof_document_a_retired_key_signs_inside_a_fork_below_the_point_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Bug LL. An auditor holds a real checkpoint of size 2 by the key later retired at 6.
    The forger copies those 2 entries, adds made-up ones up to size 4 and serves a proof
    document from 2 to 4 that includes a made-up entry: consistent with the auditor's
    checkpoint and signed by the retired key inside its range. It verified."""
    log, ring = _log(engine, tmp_path / "keys")
    fill(log, 2)
    held = log.checkpoint()
    fill(log, 4)
    leaked = _rotate(log, ring)
    fill(log, 3)
    fork, forger = _fork(tmp_path, leaked, log, upto=2)
    forger.append_many(_made_up(i) for i in range(2))
    forged = build_proof(forger, 2, leaf_index=3)
    history = _history(ring)

    verify = partial(verify_proof, forged, leaked.public_key(), ORIGIN, trusted=held)
    _refused_below_the_point(verify, history, log, 4, 6)
    fork.dispose()


def test_an_honest_proof_document_taken_before_the_rotation_verifies_with_its_rotation_proof(
    engine: sa.Engine, tmp_path: Path
) -> None:
    log, ring = _log(engine, tmp_path / "keys")
    fill(log, 2)
    held = log.checkpoint()
    fill(log, 2)
    document = build_proof(log, 2, leaf_index=3)  # at size 4
    fill(log, 2)
    leaked = _rotate(log, ring)  # at 6
    fill(log, 3)
    history = _history(ring)
    verify_proof(document, leaked.public_key(), ORIGIN, trusted=held)  # no history: as before
    with pytest.raises(VerificationError, match="uprof audit rotation-proof"):
        verify_proof(document, leaked.public_key(), ORIGIN, trusted=held, key_history=history)
    report = verify_proof(
        document,
        leaked.public_key(),
        ORIGIN,
        trusted=held,
        key_history=history,
        rotation_proof=_b64(log.consistency_proof(4, 6)),
    )
    assert (report.old_size, report.tree_size, report.leaf_index) == (2, 4, 3)
    # A document the new key signs later needs nothing beside it.
    verify_proof(
        build_proof(log, 2), leaked.public_key(), ORIGIN, trusted=held, key_history=history
    )


def test_a_v1_history_still_bounds_nothing_below_and_the_verdict_says_so(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Old trails do not break: a key a v1 record retired (no point) is unbounded, so its
    export taken before that rotation verifies with the history and no proof, and the
    verdict counts the key it could not bound, as before this decision."""
    log, ring = _log(engine, tmp_path / "keys")
    fill(log, 3)
    export_jsonl(log, tmp_path / "old.jsonl")
    log.checkpoint()
    leaked = load_signing_key(ring.key_path)
    ring.rotate()  # without the log: a v1 record
    fill(log, 2)
    report = verify_export(
        tmp_path / "old.jsonl", leaked.public_key(), ORIGIN, key_history=_history(ring)
    )
    assert (report.tree_size, report.keys_unbounded) == (3, 1)
