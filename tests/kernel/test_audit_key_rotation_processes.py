"""Audit key rotation with real processes: two rotating at once, and SIGKILL at each step.

Whatever happens, the key folder ends with one current key, the history names it last
and verifies from the first key, the log's integrity check passes, and a rotation that
switched the key is on the log (recorded late by the next start when its process died).
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from audit.keyring import HISTORY_FILE, KEY_FILE, NEXT_KEY_FILE, verify_key_history
from audit.keys import key_id, load_signing_key, public_key_pem
from audit.receipts import verify_receipt
from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import running, settings_for
from tests.kernel.test_keys_apart import ALICE, fill

PRELUDE = """
import json, os, sys, time
from pathlib import Path
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for

backend = Backend({kind!r}, {url!r}, Path({data_dir!r}))
"""


def child(backend: Backend, body: str) -> PythonChild:
    script = PRELUDE.format(kind=backend.kind, url=backend.url, data_dir=str(backend.data_dir))
    return PythonChild(script + textwrap.dedent(body), new_session=True)


def wait_for(path: Path, process: PythonChild, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None:
            _out, err = process.communicate()
            raise AssertionError(f"the child ended ({process.returncode}): {err[-3000:]}")
        assert time.monotonic() < deadline, "the child never reached the step"
        time.sleep(0.02)


def check_folder(backend: Backend, first_pem: bytes) -> list[str]:
    """One current key, no next key left, the history verifying from the first key and
    naming the current key last; returns the history's key ids."""
    folder = settings_for(backend).key_path
    assert not (folder / NEXT_KEY_FILE).exists()
    assert not list(folder.glob(".*.tmp"))
    document = json.loads((folder / HISTORY_FILE).read_text())
    verified = verify_key_history(document, first_pem)
    assert verified.current_key_id == key_id(load_signing_key(folder / KEY_FILE))
    return list(verified.key_ids)


def test_two_processes_rotating_at_once_make_two_successive_rotations(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    with running(settings_for(backend), clock) as k:
        first_pem = public_key_pem(k.audit_log.public_key)
        first = k.audit_log.key_id
    go = tmp_path / "go"
    body = f"""
    kernel = build_kernel(settings_for(backend), FakeClock())
    try:
        Path({str(tmp_path)!r}, f"ready-{{os.getpid()}}").touch()
        while not Path({str(go)!r}).exists():
            time.sleep(0.005)
        print(json.dumps(kernel.rotate_audit_key(requested_by="operator:race")))
    finally:
        kernel.close()
    """
    racers = [child(backend, body) for _ in range(2)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 2:
        assert all(r.poll() is None for r in racers), [r.communicate()[1][-2000:] for r in racers]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    go.touch()
    outputs = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    ids = check_folder(backend, first_pem)
    assert len(ids) == 3 and ids[0] == first
    # Each rotation endorsed the key the other left current: a chain, not a fork.
    assert sorted((o["previous_key_id"], o["key_id"]) for o in outputs) == sorted(
        [(ids[0], ids[1]), (ids[1], ids[2])]
    )
    with running(settings_for(backend), clock) as k:
        entries = [e.entry for e in k.audit_log.entries(action="audit.key_rotated")]
        assert [(e["audit_key_seq"], e["audit_key_id"]) for e in entries] == [
            (1, ids[1]),
            (2, ids[2]),
        ]
        assert k.audit_log.verify_integrity() == k.audit_log.size()


#: Where the victim stops (and is SIGKILLed): what it patches, and what the folder holds.
STEPS = {
    # the next key written, the history not yet: the rotation never happened
    "next-key-written": ("write", "audit-signing.next.pem", False),
    # the history names the new key (the commit point), the key file not yet renamed
    "history-written": ("write", "audit-keys.json", True),
    # the key switched, its audit entry not yet appended
    "key-switched": ("record", "", True),
}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_sigkill_during_a_rotation_leaves_one_current_key_named_by_the_history(
    backend: Backend, clock: FakeClock, tmp_path: Path, step: str
) -> None:
    settings = settings_for(backend)
    with running(settings, clock) as k:
        fill(k, "alice", ALICE)
        receipt = k.erase_subject("alice").receipt
        first_pem = public_key_pem(k.audit_log.public_key)
        first = k.audit_log.key_id
        origin = k.audit_log.origin
    kind, name, rotated = STEPS[step]
    marker = tmp_path / "stopped"
    stop = f"Path({str(marker)!r}).touch(); time.sleep(600)"
    if kind == "write":
        patch = f"""
        import audit.keyring as ring
        original = ring._write_private
        def write(path, data):
            original(path, data)
            if path.name == {name!r}:
                {stop}
        ring._write_private = write
        """
    else:
        patch = f"""
        def record_many(*args, **kwargs):
            {stop}
        kernel.audit.record_many = record_many
        """
    body = (
        "kernel = build_kernel(settings_for(backend), FakeClock())\n"
        + textwrap.dedent(patch)
        + "kernel.rotate_audit_key(requested_by='operator:victim')\n"
    )
    victim = child(backend, body)
    try:
        wait_for(marker, victim)
    finally:
        victim.kill()  # SIGKILL
        victim.wait(60)
    assert victim.returncode == -9

    with running(settings, clock) as k:  # the next start repairs and records
        ids = check_folder(backend, first_pem)
        assert len(ids) == (2 if rotated else 1) and ids[0] == first
        assert k.audit_log.key_id == ids[-1]
        entries = [e.entry for e in k.audit_log.entries(action="audit.key_rotated")]
        if rotated:
            (entry,) = entries
            assert entry["audit_key_id"] == ids[1] and entry["reason_code"] == "recorded-late"
        else:
            assert entries == []
        assert k.audit_log.verify_integrity() == k.audit_log.size()
        history = k.audit_key_history()
        # The operator runs it again: it completes on top of whatever was left.
        again = k.rotate_audit_key(requested_by="operator:again")
        assert again["previous_key_id"] == ids[-1]
    ids = check_folder(backend, first_pem)
    assert len(ids) == (3 if rotated else 2)
    verify_receipt(receipt, first_pem, origin=origin, key_history=history)
