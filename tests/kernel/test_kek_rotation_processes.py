"""KEK rotation by one process while another runs on the same stores (both backends,
two real processes).

``uprof keys rotate`` re-wraps every data key under a new KEK epoch and forgets the old
one. A server that was already running kept the ring it loaded at start, so after a
rotation by the CLI it could not unwrap any key it had not cached ("kek-2 no longer
exists": every such subject answered as erased), it wrapped the keys of new subjects
under the epoch the rotation had just forgotten (those subjects were unreadable by every
other process, and by itself after a restart), and a rotation it ran itself started
from its stale ring and overwrote the newest KEK (every key wrapped under it was lost).
"""

from __future__ import annotations

import json
import threading

import pytest
from cryptography.hazmat.primitives.keywrap import aes_key_wrap

from tests.conftest import Backend
from tests.kernel.conftest import consent, say, settings_for
from tests.kernel.other_process import run_in_another_process
from tests.kernel.test_erasure import CANARIES
from uprof.crypto.keydir import FileKeyMaterialStore
from uprof.crypto.keystore import KekRing, KeyStore
from uprof.kernel import Uprof

READ_ALICE = """
print(json.dumps([a.value for a in kernel.profile("alice").attributes]))
"""


def rotate_elsewhere(backend: Backend) -> None:
    done = run_in_another_process(backend, "print(json.dumps(kernel.rotate_keys()))")
    assert done.returncode == 0, done.stderr[-3000:]


def attributes_elsewhere(backend: Backend, subject: str) -> list[str]:
    done = run_in_another_process(
        backend,
        f"print(json.dumps([a.value for a in kernel.profile({subject!r}).attributes]))",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    values: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return values


def remember(kernel: Uprof, subject: str) -> None:
    consent(kernel, subject)
    kernel.capture(subject, say(f"I live in {CANARIES['attribute']}"))
    kernel.process()


def test_a_running_process_reads_keys_rewrapped_by_another_processs_rotation(
    backend: Backend, kernel: Uprof
) -> None:
    remember(kernel, "alice")
    rotate_elsewhere(backend)
    # The key is no longer cached here (a bounded cache drops it, or it was never read).
    kernel.keystore.evict(str(kernel.stream_of("alice")))
    assert [a.value for a in kernel.profile("alice").attributes] == [CANARIES["attribute"]]


def test_a_subject_created_after_another_processs_rotation_is_readable_everywhere(
    backend: Backend, kernel: Uprof
) -> None:
    remember(kernel, "alice")  # this process is running, with the ring it started with
    rotate_elsewhere(backend)
    remember(kernel, "carol")
    assert attributes_elsewhere(backend, "carol") == [CANARIES["attribute"]]


def test_a_rotation_after_another_processs_rotation_keeps_every_key(
    backend: Backend, kernel: Uprof
) -> None:
    remember(kernel, "alice")
    rotate_elsewhere(backend)
    outcome = kernel.rotate_keys()
    assert attributes_elsewhere(backend, "alice") == [CANARIES["attribute"]]
    assert outcome["epoch"] == 3  # started from the ring the other rotation left
    kernel.keystore.evict(str(kernel.stream_of("alice")))
    assert [a.value for a in kernel.profile("alice").attributes] == [CANARIES["attribute"]]


def test_a_key_wrapped_while_another_process_rotates_is_rewrapped_by_the_rotation(
    backend: Backend, kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rotation runs between this process choosing the epoch and storing the key:
    it must wait for the key, then re-wrap it with the others."""
    remember(kernel, "alice")
    # Another process's key store: the same stores and key folder, nothing shared in memory.
    key_dir = settings_for(backend).key_dir
    assert key_dir is not None
    material = FileKeyMaterialStore(key_dir)
    other = KeyStore(
        kernel.keys_engine, master_secret=material.master_secret(), kek_ring=KekRing(material)
    )
    rotations: list[dict[str, int]] = []
    rotation = threading.Thread(target=lambda: rotations.append(other.rotate_kek()))
    creator = threading.get_ident()

    def wrap_while_rotating(kek: bytes, key: bytes) -> bytes:
        if threading.get_ident() == creator and not rotation.is_alive() and not rotations:
            rotation.start()
            rotation.join(timeout=3)  # runs to its end unless it waits for this key
        return aes_key_wrap(kek, key)

    monkeypatch.setattr("uprof.crypto.keystore.aes_key_wrap", wrap_while_rotating)
    remember(kernel, "carol")
    rotation.join(timeout=60)
    assert rotations and rotations[0]["epoch"] == 2
    monkeypatch.undo()
    assert attributes_elsewhere(backend, "carol") == [CANARIES["attribute"]]
