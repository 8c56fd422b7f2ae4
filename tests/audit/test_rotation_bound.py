"""Decision 0160-rotation-bound: a rotated-out audit key vouches only up to where it stopped.

At rotation the key history records the log's size N and root R under the log's append
lock, in a record both keys sign (v2). Every verifier takes the history as ranges
(``audit.keys.TrustedKeys``, applied in ``verify_checkpoint``): the old key's checkpoint of
size above N is refused (bug KF), at N its root must be R, and a whole trail must pass
through every (N, R) inside it. Whoever holds a retired private key (a backup, a leak) and
a copy of the log signs checkpoints, exports and receipts of their own; these are the
attacks."""

from __future__ import annotations

import base64
import copy
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from audit.checkpoint import sign_checkpoint, verify_checkpoint
from audit.errors import AuditKeyError, VerificationError
from audit.export import export_jsonl
from audit.keyring import (
    HISTORY_FORMAT,
    HISTORY_FORMAT_V2,
    RETIRED_AT,
    FileKeyRing,
    StaticSigningKeys,
    trusted_keys,
    verify_key_history,
)
from audit.keys import key_id, load_signing_key, public_key_pem
from audit.log import AuditLog
from audit.proofs import build_proof, verify_proof
from audit.receipts import new_commitment_nonce, verify_receipt
from audit.tables import create_tables
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN, audit_log_on, sample_entry
from tests.audit.test_log import fill
from tests.audit.test_receipts import issue
from tests.conftest import Backend
from uprof.backends import backend_for
from uprof.cli.main import app as cli


def _rotated(
    engine: sa.Engine, folder: Path, before: int, after: int
) -> tuple[AuditLog, FileKeyRing, Ed25519PrivateKey]:
    """A log of ``before`` entries, its key rotated (the old private key kept, as a leak
    would), then ``after`` entries more; return the log, its ring and the old key."""
    ring = FileKeyRing(folder)
    log = audit_log_on(engine, ring)
    fill(log, before)
    log.checkpoint()
    leaked = load_signing_key(ring.key_path)
    ring.rotate(log_head=log.held_head)
    fill(log, after)
    log.checkpoint()
    return log, ring, leaked


def _receipt_before_a_rotation(
    engine: sa.Engine, folder: Path
) -> tuple[AuditLog, FileKeyRing, dict[str, Any], Ed25519PrivateKey]:
    """A receipt at tree size 3 by the first key, which is then rotated out at 7; return
    the log, its ring, the receipt and the key that signed it."""
    ring = FileKeyRing(folder)
    log = audit_log_on(engine, ring)
    fill(log, 2)
    receipt = issue(log, new_commitment_nonce())
    signer = ring.current()
    fill(log, 4)
    ring.rotate(log_head=log.held_head)
    return log, ring, receipt, signer


def _history(ring: FileKeyRing) -> Any:
    return json.loads(ring.history_path.read_text())


def test_the_rotation_records_the_logs_head_signed_by_both_keys(
    engine: sa.Engine, tmp_path: Path
) -> None:
    log, ring, leaked = _rotated(engine, tmp_path, 5, 3)
    history = _history(ring)
    assert history["format"] == HISTORY_FORMAT_V2
    verified = verify_key_history(history, leaked.public_key())
    point = verified.retired_at[key_id(leaked)]
    assert (point.tree_size, point.root) == (5, log.root(5))
    # Moving the point is an edit both signatures refuse.
    moved = copy.deepcopy(history)
    moved["keys"][1][RETIRED_AT]["tree_size"] = 1000
    with pytest.raises(VerificationError, match="does not verify"):
        verify_key_history(moved, leaked.public_key())


def test_kf_a_retired_keys_checkpoint_beyond_its_rotation_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """KF: the leaked old key signs the log's real head after the rotation, and a made-up
    larger one; with the history, both verified before this decision."""
    log, ring, leaked = _rotated(engine, tmp_path, 5, 3)
    keys = trusted_keys(leaked.public_key(), _history(ring))
    for size, root in ((8, log.root(8)), (10**6, b"\x07" * 32)):
        forged = sign_checkpoint(leaked, ORIGIN, size, root)
        with pytest.raises(VerificationError, match="rotated out at tree size 5"):
            verify_checkpoint(forged, keys, ORIGIN)
    # Its honest range still verifies, and the new key signs any size.
    assert verify_checkpoint(sign_checkpoint(leaked, ORIGIN, 5, log.root(5)), keys, ORIGIN)
    assert verify_checkpoint(log.checkpoint(), keys, ORIGIN).tree_size == 8


def test_a_retired_keys_checkpoint_at_its_rotation_size_must_name_the_recorded_root(
    engine: sa.Engine, tmp_path: Path
) -> None:
    _, ring, leaked = _rotated(engine, tmp_path, 5, 3)
    forged = sign_checkpoint(leaked, ORIGIN, 5, b"\x01" * 32)
    with pytest.raises(VerificationError, match="forks the log"):
        verify_checkpoint(forged, trusted_keys(leaked.public_key(), _history(ring)), ORIGIN)


def test_kf_an_export_signed_by_a_retired_key_beyond_its_rotation_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """KF end to end: a copy of the log and the leaked key make a whole signed trail."""
    _, ring, leaked = _rotated(engine, tmp_path / "keys", 5, 3)
    forger = audit_log_on(engine, StaticSigningKeys(leaked))
    export_jsonl(forger, tmp_path / "trail.jsonl")
    with pytest.raises(VerificationError, match="rotated out at tree size 5"):
        verify_export(
            tmp_path / "trail.jsonl", leaked.public_key(), ORIGIN, key_history=_history(ring)
        )


def test_kf_a_receipt_signed_by_a_retired_key_beyond_its_rotation_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    _, ring, leaked = _rotated(engine, tmp_path, 5, 3)
    receipt = issue(audit_log_on(engine, StaticSigningKeys(leaked)), new_commitment_nonce())
    with pytest.raises(VerificationError, match="rotated out at tree size 5"):
        verify_receipt(receipt, leaked.public_key(), origin=ORIGIN, key_history=_history(ring))


def test_a_whole_trail_must_pass_through_each_rotation_point(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Trail consistency: an honest export passes through (N, R); a log rewritten below N
    and re-signed by the current key (the old key's checkpoints then vouch for entries
    the trail no longer holds) is refused."""
    log, ring, leaked = _rotated(engine, tmp_path / "keys", 5, 3)
    history = _history(ring)
    export_jsonl(log, tmp_path / "trail.jsonl")
    report = verify_export(
        tmp_path / "trail.jsonl", leaked.public_key(), ORIGIN, key_history=history
    )
    assert (report.rotation_points_checked, report.keys_unbounded) == (1, 0)

    rewritten = sa.create_engine(f"sqlite:///{tmp_path / 'rewritten.sqlite'}")
    create_tables(rewritten, backend_for(rewritten))
    current = audit_log_on(rewritten, StaticSigningKeys(load_signing_key(ring.key_path)))
    current.append_many(sample_entry(100 + i) for i in range(8))
    export_jsonl(current, tmp_path / "rewritten.jsonl")
    with pytest.raises(VerificationError, match="first 5 entries"):
        verify_export(
            tmp_path / "rewritten.jsonl", leaked.public_key(), ORIGIN, key_history=history
        )
    rewritten.dispose()


def test_a_v1_rotation_stays_unbounded_and_the_verdict_says_so(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """Old histories keep verifying as before: a rotation without a recorded point (v1,
    or a key ring rotated without its log) bounds nothing, and the export verdict counts
    the retired keys it could not bound."""
    ring = FileKeyRing(tmp_path / "keys")
    log = audit_log_on(engine, ring)
    fill(log, 5)
    leaked = ring.current()
    ring.rotate()
    fill(log, 3)
    history = _history(ring)
    assert history["format"] == HISTORY_FORMAT
    keys = trusted_keys(leaked.public_key(), history)
    assert verify_checkpoint(sign_checkpoint(leaked, ORIGIN, 8, log.root(8)), keys, ORIGIN)
    export_jsonl(log, tmp_path / "trail.jsonl")
    report = verify_export(
        tmp_path / "trail.jsonl", leaked.public_key(), ORIGIN, key_history=history
    )
    assert (report.rotation_points_checked, report.keys_unbounded) == (0, 1)


def test_a_v2_record_in_a_v1_history_is_refused(engine: sa.Engine, tmp_path: Path) -> None:
    """An old verifier refuses a v2 history whole (its format); a v2 record passed off as
    v1 is refused too, so a point cannot be dropped by relabelling the document."""
    _, ring, leaked = _rotated(engine, tmp_path, 5, 3)
    relabelled = {**_history(ring), "format": HISTORY_FORMAT}
    with pytest.raises(VerificationError, match=RETIRED_AT):
        verify_key_history(relabelled, leaked.public_key())


def test_a_document_whose_key_was_rotated_out_under_it_is_not_signed_beyond_the_point(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """A receipt or export takes its key once; if a rotation lands and the log grows before
    it signs its checkpoint, it is refused (ask again), never handed out unverifiable."""
    ring = FileKeyRing(tmp_path)
    log = audit_log_on(engine, ring)
    fill(log, 5)
    captured = log.signing_key()
    ring.rotate(log_head=log.held_head)
    assert log.checkpoint_record(key=captured).tree_size == 5  # within its range: signed
    fill(log, 1)
    with pytest.raises(AuditKeyError, match="rotated while this document was being built"):
        log.checkpoint_record(key=captured)


# --- two real processes: one rotates while the other appends and signs ----------------------


def _appender(url: str, folder: str, out: str, stop: str) -> None:
    """Append and sign a checkpoint per entry until ``stop`` appears, then one more (the
    rotator makes ``stop`` after its last rotation, so at least one entry and note come
    after every rotation point: a loop that ended on ``stop`` alone could end exactly at
    the last point, and the test read that as the appender stopping short); keep every
    note."""
    engine = sa.create_engine(url)
    log = audit_log_on(engine, FileKeyRing(Path(folder)))
    notes, i, last = [], 0, False
    while not last:
        last = Path(stop).exists() and i >= 5
        log.append(sample_entry(i))
        notes.append(log.checkpoint())
        i += 1
        if i == 5:
            Path(out + ".started").touch()
    Path(out).write_text(json.dumps(notes))
    engine.dispose()


def _rotator(url: str, folder: str, started: str, stop: str, rotations: int) -> None:
    engine = sa.create_engine(url)
    ring = FileKeyRing(Path(folder))
    log = audit_log_on(engine, ring)
    while not Path(started).exists():
        time.sleep(0.01)
    for _ in range(rotations):
        ring.rotate(log_head=log.held_head)
        time.sleep(0.05)
    Path(stop).touch()
    engine.dispose()


def test_a_process_appending_through_rotations_never_signs_beyond_a_retired_keys_point(
    backend: Backend, engine: sa.Engine, tmp_path: Path
) -> None:
    """Two real processes on one log and key folder: every checkpoint the appender signed
    verifies against the final history's ranges (none by an old key past its point), and
    the appender's signatures after each rotation point are the new key's."""
    folder, out, stop = tmp_path / "keys", str(tmp_path / "notes.json"), str(tmp_path / "stop")
    FileKeyRing(folder).current()  # one key folder, made before both start
    context = multiprocessing.get_context("spawn")
    appender = context.Process(target=_appender, args=(backend.url, str(folder), out, stop))
    rotator = context.Process(
        target=_rotator, args=(backend.url, str(folder), out + ".started", stop, 3)
    )
    appender.start()
    rotator.start()
    rotator.join(120)
    appender.join(120)
    assert (rotator.exitcode, appender.exitcode) == (0, 0)

    history = _history(FileKeyRing(folder))
    keys = trusted_keys(FileKeyRing(folder).current().public_key(), history)
    points = sorted(point.tree_size for point in keys.retired_at.values())
    assert len(points) == 3
    notes = json.loads(Path(out).read_text())
    # A note below its key's point verifies with the log's proof to that point
    # (decision 0175-retired-below): asked of the log, as a verifier holding it does.
    log = audit_log_on(engine, FileKeyRing(folder))
    sizes = [
        verify_checkpoint(
            note, keys, ORIGIN, rotation_proof=lambda m, n: _b64(log.consistency_proof(m, n))
        ).tree_size
        for note in notes
    ]
    assert sizes[-1] > points[-1]  # the appender went on past the last rotation


# --- KG: a retired key's forgery at or below its rotation point -----------------------------


def _b64(hashes: list[bytes]) -> list[str]:
    return [base64.b64encode(h).decode() for h in hashes]


def test_kg_a_receipt_a_retired_key_signs_over_a_tree_of_its_own_below_the_point_is_refused(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """KG (review of 0151): the leaked key signs a receipt over a tree of its own of size
    m < N, holding an entry the log never held. The size bound alone lets it through; the
    receipt must now reach (N, R) by a consistency proof, which no fork has."""
    log, ring, leaked = _rotated(engine, tmp_path / "keys", 5, 3)
    history = _history(ring)
    fork = sa.create_engine(f"sqlite:///{tmp_path / 'fork.sqlite'}")
    create_tables(fork, backend_for(fork))
    forged = issue(audit_log_on(fork, StaticSigningKeys(leaked)), new_commitment_nonce())
    assert forged["inclusion"]["tree_size"] < 5
    with pytest.raises(VerificationError, match="rotated out at tree size 5, after its"):
        verify_receipt(forged, leaked.public_key(), origin=ORIGIN, key_history=history)
    m = forged["inclusion"]["tree_size"]
    honest_proof = _b64(log.consistency_proof(m, 5))  # the real log's proof from m to N
    with pytest.raises(VerificationError, match="a retired key's fork"):
        verify_receipt(
            forged,
            leaked.public_key(),
            origin=ORIGIN,
            key_history=history,
            rotation_proof=honest_proof,
        )
    fork.dispose()


def test_an_honest_receipt_of_a_retired_key_verifies_with_the_proof_to_the_point(
    engine: sa.Engine, tmp_path: Path
) -> None:
    log, ring, receipt, signer = _receipt_before_a_rotation(engine, tmp_path)
    history = _history(ring)
    verify_receipt(receipt, signer.public_key(), origin=ORIGIN)  # pinned, no history: as before
    with pytest.raises(VerificationError, match="rotation_proof"):
        verify_receipt(receipt, signer.public_key(), origin=ORIGIN, key_history=history)
    verify_receipt(
        receipt,
        signer.public_key(),
        origin=ORIGIN,
        key_history=history,
        rotation_proof=_b64(log.consistency_proof(3, 7)),
    )


def test_the_cli_takes_a_rotation_proof_and_says_which_points_a_trail_passed(
    engine: sa.Engine, tmp_path: Path
) -> None:
    log, ring, receipt, first = _receipt_before_a_rotation(engine, tmp_path / "keys")
    files = {
        "receipt": json.dumps(receipt),
        "history": ring.history_path.read_text(),
        "key.pem": public_key_pem(first).decode(),
        "proof": json.dumps(_b64(log.consistency_proof(3, 7))),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    common = [
        "--public-key", str(tmp_path / "key.pem"), "--origin", ORIGIN,
        "--key-history", str(tmp_path / "history"),
    ]  # fmt: skip
    runner = CliRunner()
    verify = ["audit", "verify-receipt", str(tmp_path / "receipt"), *common]
    refused = runner.invoke(cli, verify)
    assert refused.exit_code == 1 and "rotation_proof" in refused.output
    accepted = runner.invoke(cli, [*verify, "--rotation-proof", str(tmp_path / "proof")])
    assert accepted.exit_code == 0, accepted.output

    export_jsonl(log, tmp_path / "trail.jsonl")
    trail = runner.invoke(cli, ["audit", "verify", str(tmp_path / "trail.jsonl"), *common])
    assert trail.exit_code == 0, trail.output
    assert "passes through 1 key rotation point" in " ".join(trail.output.split())


def test_a_proof_from_a_retired_keys_receipt_must_reach_the_rotation_point(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """``verify_proof`` with a receipt as its trusted point: the honest log's proof to its
    current head (past the point) stands for the rotation proof; a forger's proof inside
    their own fork (below the point, by the retired key) does not."""
    log, ring, receipt, first = _receipt_before_a_rotation(engine, tmp_path / "keys")
    history = _history(ring)
    proof = build_proof(log, receipt["inclusion"]["tree_size"])
    verify_proof(proof, first.public_key(), ORIGIN, trusted=receipt, key_history=history)

    fork = sa.create_engine(f"sqlite:///{tmp_path / 'fork.sqlite'}")
    create_tables(fork, backend_for(fork))
    forger = audit_log_on(fork, StaticSigningKeys(first))
    forged = issue(forger, new_commitment_nonce())
    fill(forger, 2)
    forged_proof = build_proof(forger, forged["inclusion"]["tree_size"])
    # Refused at the document's own checkpoint, the retired key's below its point (LL,
    # decision 0175-retired-below), before the receipt's point is looked at.
    with pytest.raises(VerificationError, match="rotation proof from 3 to 7"):
        verify_proof(forged_proof, first.public_key(), ORIGIN, trusted=forged, key_history=history)
    fork.dispose()
