"""An old backup restored after KEK rotations (decision 0059): the backup holds no key,
so what it brings back opens with the key folder's ring as it is now."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, say
from tests.kernel.test_keys_apart import (
    ALICE,
    BOB,
    assert_erased_everywhere,
    assert_intact,
    filled_deployment,
)
from uprof.services.backup import backup, restore


def test_an_old_backup_restored_after_rotations_opens_and_keeps_erasures(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = filled_deployment(backend, clock, "alice", "bob")
    backup(settings, tmp_path / "bk")
    k = build_kernel(settings, clock)
    try:
        first = k.keystore._ring.current_epoch
        k.rotate_keys()
        k.erase_subject("alice")
        k.rotate_keys()
        k.keystore._ring.reload()
        assert first not in k.keystore._ring.keys  # the epoch of the backup's time is gone
    finally:
        k.close()
    restore(settings, tmp_path / "bk")
    k = build_kernel(settings, clock)
    try:
        assert_intact(k, "bob", BOB)
        assert_erased_everywhere(k, "alice", list(ALICE.values()), tmp_path)
        k.capture("bob", say("new after the restore"))  # new keys wrap under the live ring
    finally:
        k.close()
