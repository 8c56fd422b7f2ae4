"""The erasure ledger file replaced under a running process (not only appended to).

Processes noticed another process's erasures by the ledger's record count alone. A ledger
file put back from a copy (a key-folder restore, replicated storage failing over to a copy
that lags) and then appended to until it held as many records as before looked unchanged:
a running process went on handing out the keys of a subject erased after that, and kept
what it had decrypted of them. Now the file store hands out a new snapshot whenever the
file was replaced or truncated, and readers compare snapshots, not counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.errors import SubjectErasedError, SubjectNotFoundError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from tests.kernel.other_process import run_in_another_process
from tests.kernel.test_keys_apart import ALICE, BOB, fill, slice_text
from uprof.crypto.keydir import LEDGER_FILE, FileKeyMaterialStore
from uprof.crypto.ledger import ErasureLedger

MASTER = b"m" * 32


def _replace(path: Path, lines: list[bytes]) -> None:
    new = path.with_name(path.name + ".new")
    new.write_bytes(b"".join(lines))
    new.replace(path)  # a new file (new inode), as a copy put back would be


def test_a_ledger_replaced_by_one_as_long_is_read_again(tmp_path: Path) -> None:
    writer = ErasureLedger(FileKeyMaterialStore(tmp_path / "keys"), MASTER)
    reader = ErasureLedger(FileKeyMaterialStore(tmp_path / "keys"), MASTER)
    writer.record_subject("t", "alice", "stream-a")
    writer.record_subject("t", "carol", "stream-c")
    assert reader.state().streams == {"stream-a", "stream-c"}
    path = tmp_path / "keys" / LEDGER_FILE
    _replace(path, path.read_bytes().splitlines(keepends=True)[:1])  # the copy: alice only
    writer.record_subject("t", "bob", "stream-b")  # two records again
    state = reader.state()
    assert state.streams == {"stream-a", "stream-b"}
    assert reader.is_erased("t", "bob")


def test_a_running_process_sees_an_erasure_in_a_replaced_ledger_as_long_as_before(
    backend: Backend, clock: FakeClock
) -> None:
    settings = settings_for(backend)
    running = build_kernel(settings, clock)
    try:
        fill(running, "alice", ALICE)
        fill(running, "bob", BOB)
        assert any(v in slice_text(running, "bob") for v in BOB.values())
        bob = running.keystore.resolve(running.subjects.tenant, "bob")
        assert bob is not None
        bob_stream = str(bob.stream_id)
        assert running.keystore.key(bob_stream, 1) is not None  # cached, as a server has it
        done = run_in_another_process(backend, "kernel.erase_subject('alice')")
        assert done.returncode == 0, done.stderr[-2000:]
        running.forget_erased_elsewhere()
        path = settings.key_path / LEDGER_FILE
        seen = len(path.read_bytes().splitlines())
        done = run_in_another_process(backend, "kernel.erase_subject('bob')")
        assert done.returncode == 0, done.stderr[-2000:]
        # Before this process looks again, the file is replaced by a copy as long as the
        # one it saw (its last records: bob's erasure among them).
        _replace(path, path.read_bytes().splitlines(keepends=True)[-seen:])
        assert running.forget_erased_elsewhere() >= 1  # bob's caches dropped
        assert running.keystore.key(bob_stream, 1) is None
        with pytest.raises((SubjectErasedError, SubjectNotFoundError)):
            slice_text(running, "bob")
    finally:
        running.close()
