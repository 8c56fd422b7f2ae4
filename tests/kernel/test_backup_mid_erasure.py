"""A backup taken while an erasure is half done (its process killed at each step), then
restored, before or after the erasure is finished: nothing erased comes back readable, and
the erasure still finishes (or says a restore rolled it back)."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.errors import ErasureRolledBackError, SubjectErasedError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from tests.kernel.other_process import crash_at
from tests.kernel.test_keys_apart import (
    ALICE,
    BOB,
    assert_erased_everywhere,
    assert_intact,
    filled_deployment,
)
from uprof.services.backup import backup, restore

#: (method replaced by os._exit(9), its owner): before the ledger record, between the
#: ledger record and the keys, after the keys (waiting for the purge).
STEPS = [
    ("record_subject", "kernel.keystore.ledger"),
    ("destroy", "kernel.keystore"),
    ("_catch_up", "kernel.erasure_service"),
]


@pytest.mark.parametrize("step", STEPS, ids=[s[0] for s in STEPS])
@pytest.mark.parametrize("finish", ["before-restore", "after-restore"])
def test_a_backup_of_a_half_done_erasure_restored_brings_nothing_back(
    backend: Backend, clock: FakeClock, tmp_path: Path, step: tuple[str, str], finish: str
) -> None:
    settings = filled_deployment(backend, clock, "alice", "bob")
    died = crash_at(backend, step[0], 'erase_subject("alice")', owner=step[1])
    assert died.returncode == 9, died.stderr[-3000:]
    backup(settings, tmp_path / "bk")
    if finish == "before-restore":
        k = build_kernel(settings, clock)
        try:
            k.erase_subject("alice")
        finally:
            k.close()
    restore(settings, tmp_path / "bk")
    k = build_kernel(settings, clock)
    try:
        if finish == "after-restore":
            k.erase_subject("alice")  # finishes, with a receipt
        else:
            with pytest.raises((SubjectErasedError, ErasureRolledBackError)):
                k.erase_subject("alice")  # asked again: refused, or rolled back
        assert_erased_everywhere(k, "alice", list(ALICE.values()), tmp_path)
        assert_intact(k, "bob", BOB)
    finally:
        k.close()
