"""A key folder older than a subject's creation: a start refuses instead of losing it
(both backends; the start is another real process).

Decision 0062 made a key folder older than an *erasure* harmless. A key folder put back
from a copy older than a subject's *creation* (a key-folder backup taken before it, which
docs/governance.md asks to keep apart from the data) lacks that subject's data keys and
index row. Until 2026-12-05 the start said nothing: the subject answered "no such
subject", its captured events could never be read again, and the next consent under its
name created a new subject, so even a newer key folder found later could no longer be put
back cleanly. Now the start refuses, naming the cause, unless the operator says the keys
are gone for good (``UPROF_ACCEPT_LOST_KEYS``): those subjects are then recorded as erased.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, settings_for
from tests.kernel.other_process import run_in_another_process
from tests.kernel.test_key_folder_rollback import _put_key_folder_back, _save_key_folder
from tests.kernel.test_keys_apart import ALICE, BOB, assert_intact, fill


def test_a_start_on_a_key_folder_older_than_a_subject_refuses(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    k = build_kernel(settings, clock)
    fill(k, "bob", BOB)
    k.close()
    rows = _save_key_folder(backend, settings, tmp_path / "keys-before")
    k = build_kernel(settings, clock)
    fill(k, "alice", ALICE)  # a subject the saved key folder does not know
    k.close()
    _put_key_folder_back(backend, settings, tmp_path / "keys-before", rows)

    started = run_in_another_process(backend, 'print(kernel.profile("alice"))')

    assert started.returncode != 0
    assert "KeyMaterialError" in started.stderr and "older than the data" in started.stderr
    # Told the keys are gone for good, a start records those subjects as erased and runs.
    lost = settings.model_copy(update={"accept_lost_keys": True})
    k = build_kernel(lost, clock)
    try:
        assert_intact(k, "bob", BOB)
    finally:
        k.close()
    k = build_kernel(settings, clock)  # and later starts need no telling again
    k.close()
