"""Review of decision 0110 (audit key rotation), on both backends: a key folder that does
not match the log's rotations, and a rotation's audit entry taken over by another
process's start (real processes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from audit._codec import b64encode
from audit.errors import AuditKeyError
from audit.keyring import HISTORY_FILE, LOCK_FILE
from audit.keys import public_key_pem
from audit.receipts import verify_receipt
from domain.errors import PermissionDeniedError
from domain.principal import Principal, PrincipalKind
from tests.children import until_ended_or_blocked_on
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.test_audit_key_rotation_processes import child, wait_for
from tests.kernel.test_keys_apart import ALICE, fill
from uprof.facade import Facade
from uprof.kernel import Uprof


def test_a_history_lost_after_a_rotation_stops_the_start(
    backend: Backend, clock: FakeClock
) -> None:
    """audit-keys.json deleted (or a key folder put together without it) after a rotation:
    the ring made a new history whose first key is the current one, silently. The log's
    older checkpoints then failed the integrity check (and with it restore), receipts
    signed before were refused by POST /v1/audit/verify, and GET /v1/audit/key published
    a history that no longer names the key verifiers pinned. The log records the rotation,
    so the start now refuses, naming the file."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        k.erase_subject("alice")
        k.rotate_audit_key(requested_by="operator:test")
    (settings.key_path / HISTORY_FILE).unlink()
    with pytest.raises(AuditKeyError, match=HISTORY_FILE), running(settings, clock):
        pass


def test_a_key_folder_older_than_a_rotation_stops_the_start(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A key folder put back from a copy taken before a rotation (or, on PostgreSQL, a
    second machine's own copy of the folder, started after the first machine rotated):
    key file and history agree with each other, so the ring opened them, and the server
    signed with the retired key, whose private half the rotation was meant to end, while
    its verifiers refused every signature by the newer key. The log records the rotation
    the folder does not know: the start refuses, naming the history file."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
    before = tmp_path / "keys-before"
    shutil.copytree(settings.key_path, before)
    with running(settings, clock) as k:
        k.rotate_audit_key(requested_by="operator:test")
    shutil.rmtree(settings.key_path)
    shutil.copytree(before, settings.key_path)
    with pytest.raises(AuditKeyError, match="does not hold"), running(settings, clock):
        pass


def test_a_start_during_a_rotation_does_not_take_over_its_entry(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """A rotation switches the key, then appends audit.key_rotated naming who asked. A
    process starting in between (any CLI command, a server, another rotation) recorded
    that rotation as 'recorded-late', with nobody as requester, and the rotating process's
    own entry was then dropped as a duplicate: the log lost who rotated the key. Two real
    processes: the rotation stops before its entry, the other process starts meanwhile."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        receipt = k.erase_subject("alice").receipt
        first_pem = public_key_pem(k.audit_log.public_key)
        origin = k.audit_log.origin
    paused, go, started = tmp_path / "paused", tmp_path / "go", tmp_path / "started"
    rotating = child(
        backend,
        f"""
        kernel = build_kernel(settings_for(backend), FakeClock())
        original = kernel.audit.record_many
        def record_many(entries, **kwargs):
            if any(action == "audit.key_rotated" and "requested_by" in fields
                   for action, fields in entries):
                Path({str(paused)!r}).touch()
                while not Path({str(go)!r}).exists():
                    time.sleep(0.01)
            return original(entries, **kwargs)
        kernel.audit.record_many = record_many
        try:
            print(json.dumps(kernel.rotate_audit_key(requested_by="operator:rotating")))
        finally:
            kernel.close()
        """,
    )
    starting = None
    try:
        wait_for(paused, rotating)
        starting = child(
            backend,
            f"""
            import uprof.bootstrap as b
            original = b._refuse_audit_log_behind
            def check(log):  # the start's first use of the audit key (bug HT's check)
                Path({str(started)!r}).touch()
                return original(log)
            b._refuse_audit_log_behind = check
            build_kernel(settings_for(backend), FakeClock()).close()
            """,
        )
        wait_for(started, starting)
        # The start finishes (old code) or waits for the rotation (fixed): once it is
        # seen blocked on the key ring's flock, the rotation goes on, not after 10 s.
        until_ended_or_blocked_on(starting, settings.key_path / LOCK_FILE, 10)
    finally:
        go.touch()
    out, err = rotating.communicate(timeout=120)
    assert rotating.returncode == 0, err[-3000:]
    done = json.loads(out.strip().splitlines()[-1])
    assert starting is not None
    _out, err = starting.communicate(timeout=120)
    assert starting.returncode == 0, err[-3000:]
    with running(settings, clock) as k:
        entries = [e.entry for e in k.audit_log.entries(action="audit.key_rotated")]
        assert len(entries) == 1, entries
        (entry,) = entries
        assert entry["audit_key_id"] == done["key_id"]
        assert entry["requested_by"] == "operator:rotating"
        assert "reason_code" not in entry
        history = k.audit_key_history()
        assert k.audit_log.verify_integrity() == k.audit_log.size()
    verify_receipt(receipt, first_pem, origin=origin, key_history=history)


def test_rotation_entries_and_history_agree_after_several_rotations(
    backend: Backend, clock: FakeClock
) -> None:
    """Held: each rotation is on the log once, in order, naming the key the history
    holds at its position and the key before it; a restart records nothing more."""
    settings = settings_for(backend)
    with running(settings, clock) as k:
        for _ in range(3):
            k.rotate_audit_key(requested_by="operator:test")
    with running(settings, clock) as k:
        history = k.audit_key_history()
        assert history is not None
        ids = [r["key_id"] for r in history["keys"]]
        entries = [e.entry for e in k.audit_log.entries(action="audit.key_rotated")]
        assert [
            (e["audit_key_seq"], e["previous_audit_key_id"], e["audit_key_id"]) for e in entries
        ] == [(n, ids[n - 1], ids[n]) for n in (1, 2, 3)]
        assert all(e["requested_by"] == "operator:test" for e in entries)
        assert k.audit_log.verify_integrity() == k.audit_log.size()


def test_an_audit_only_key_cannot_rotate(kernel: Uprof) -> None:
    """Held: the audit right (reading the trail, verifying) does not include rotating
    the key: only ``operate`` does, and a refused rotation changes nothing."""
    compliance = Facade(
        kernel,
        Principal(
            kernel.subjects.tenant,
            "app:compliance-console",
            "k5",
            PrincipalKind.APP,
            frozenset({"app"}),
        ),
    )
    compliance.audit_checkpoint()  # it holds the audit right
    before = kernel.audit_key_history()
    with pytest.raises(PermissionDeniedError):
        compliance.rotate_audit_key()
    assert kernel.audit_key_history() == before
    assert list(kernel.audit_log.entries(action="audit.key_rotated")) == []


def test_rotations_beside_another_process_issuing_receipts_and_backups(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Held: one process rotates three times while another real process erases subjects
    (a receipt and a checkpoint each) and writes backups. Every receipt verifies offline
    from the first public key with the final history, every backup manifest is signed by
    a key of it, the log's integrity check passes, and each rotation is on the log once,
    naming who asked."""
    from uprof.services.backup import MANIFEST, BackupError, _check_signature

    settings = settings_for(backend)
    with running(settings, clock) as k:
        first_pem = public_key_pem(k.audit_log.public_key)
        origin = k.audit_log.origin
    out_dir, stop, busy = tmp_path / "out", tmp_path / "stop", tmp_path / "busy"
    out_dir.mkdir()
    worker = child(
        backend,
        f"""
        from uprof.services.backup import backup
        from tests.kernel.test_keys_apart import ALICE, fill
        kernel = build_kernel(settings_for(backend), FakeClock())
        out = Path({str(out_dir)!r})
        try:
            n = 0
            while not Path({str(stop)!r}).exists() or n < 3:
                fill(kernel, f"s{{n}}", ALICE)
                receipt = kernel.erase_subject(f"s{{n}}").receipt
                (out / f"receipt-{{n}}.json").write_text(json.dumps(receipt))
                kernel.audit_log.checkpoint()
                if n % 2 == 0:
                    backup(settings_for(backend), out / f"backup-{{n}}")
                n += 1
                Path({str(busy)!r}).touch()
        finally:
            kernel.close()
        """,
    )
    try:
        wait_for(busy, worker)
        with running(settings, clock) as k:
            for _ in range(3):  # each between two of the other process's erasures
                busy.unlink()
                wait_for(busy, worker)
                k.rotate_audit_key(requested_by="operator:rotating")
    finally:
        stop.touch()
    _out, err = worker.communicate(timeout=300)
    assert worker.returncode == 0, err[-3000:]
    with running(settings, clock) as k:
        history = k.audit_key_history()
        trusted = k.audit_log.trusted_keys()
        entries = [e.entry for e in k.audit_log.entries(action="audit.key_rotated")]
        assert [e["audit_key_seq"] for e in entries] == [1, 2, 3]
        assert all(e["requested_by"] == "operator:rotating" for e in entries)
        assert k.audit_log.verify_integrity() == k.audit_log.size()
        receipts = sorted(out_dir.glob("receipt-*.json"))
        assert len(receipts) >= 3
        log = k.audit_log
        for path in receipts:
            # A receipt issued before a rotation needs the log's proof up to that rotation's
            # point (decision 0160-rotation-bound, bug KG); the log gives it.
            verify_receipt(
                json.loads(path.read_text()),
                first_pem,
                origin=origin,
                key_history=history,
                rotation_proof=lambda m, n: [b64encode(h) for h in log.consistency_proof(m, n)],
            )
    manifests = sorted(out_dir.glob(f"backup-*/{MANIFEST}"))
    assert manifests
    for path in manifests:
        manifest = json.loads(path.read_text())
        # Every signature verifies; one by a key rotated out since vouches for its backup
        # only with the operator's word (--allow-unsigned, bug LM, 0175-retired-below).
        retired = manifest["signature"]["key_id"] in trusted.retired_at
        if retired:
            with pytest.raises(BackupError, match="--allow-unsigned"):
                _check_signature(manifest, trusted, False)
        _check_signature(manifest, trusted, retired)


class _RotatesAfterHistoryRead:
    """The deployment's key ring, with another process's rotation landing just after a
    reader took the history (delegates everything else)."""

    def __init__(self, ring: Any) -> None:
        self._ring = ring
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ring, name)

    def history(self) -> Any:
        taken = self._ring.history()
        if self.armed:
            self.armed = False
            self._ring.rotate()
        return taken


def test_the_published_key_and_its_checkpoint_agree_across_a_rotation(
    backend: Backend, clock: FakeClock
) -> None:
    """GET /v1/audit/key read the key id, the history and the checkpoint one after the
    other: a rotation in between gave a checkpoint by a key the response's history did
    not list, so a verifier checking the response with itself refused it."""
    from audit.checkpoint import verify_checkpoint
    from audit.keyring import trusted_keys

    with running(settings_for(backend), clock) as k:
        k.audit_log._keys = _RotatesAfterHistoryRead(k.audit_log.keys)
        published = k.audit_key()
        keys = trusted_keys(published["public_key_pem"], published["key_history"])
        verify_checkpoint(published["checkpoint"], keys, published["origin"])
