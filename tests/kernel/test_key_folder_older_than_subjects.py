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

import re
from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from tests.kernel.other_process import run_in_another_process
from tests.kernel.test_key_folder_rollback import _put_key_folder_back, _save_key_folder
from tests.kernel.test_keys_apart import (
    ALICE,
    BOB,
    assert_intact,
    canaries,
    fill,
    filled_deployment,
)
from uprof.crypto.keydir import KeyMaterialError


def test_a_start_on_a_key_folder_older_than_a_subject_refuses(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = filled_deployment(backend, clock, "bob")
    rows = _save_key_folder(backend, settings, tmp_path / "keys-before")
    k = build_kernel(settings, clock)
    fill(k, "alice", ALICE)  # a subject the saved key folder does not know
    k.close()
    _put_key_folder_back(backend, settings, tmp_path / "keys-before", rows)

    started = run_in_another_process(backend, 'print(kernel.profile("alice"))')

    assert started.returncode != 0
    assert "KeyMaterialError" in started.stderr and "older than the data" in started.stderr
    # Told the keys are gone for good, a start records those subjects as erased and runs.
    # "1" (what the first version of this check asked for) names no loss: it accepts none.
    with pytest.raises(KeyMaterialError, match="names another loss"):
        build_kernel(settings.model_copy(update={"accept_lost_keys": "1"}), clock).close()
    lost = settings.model_copy(update={"accept_lost_keys": _acceptance(started.stderr)})
    k = build_kernel(lost, clock)
    try:
        assert_intact(k, "bob", BOB)
    finally:
        k.close()
    k = build_kernel(settings, clock)  # and later starts need no telling again
    k.close()


def _acceptance(refusal: str) -> str:
    """The value the refusal tells the operator to start with."""
    found = re.search(r"UPROF_ACCEPT_LOST_KEYS=(\S+)", refusal)
    assert found, refusal
    return found.group(1)


def test_an_acceptance_left_set_does_not_erase_the_subjects_of_a_later_loss(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The acceptance names the loss it accepts. Left in the environment after the start
    it was given for (a service unit, an env file), it must not turn a later, different
    loss (another old key folder, a mistyped UPROF_KEY_DIR) into erasures: those would be
    permanent, written into the data stores' record, so that even the right key folder
    found again would have the subjects' keys destroyed (decision 0062's join)."""
    settings = filled_deployment(backend, clock, "bob")
    first = _save_key_folder(backend, settings, tmp_path / "keys-1")
    k = build_kernel(settings, clock)
    fill(k, "alice", ALICE)
    k.close()
    _put_key_folder_back(backend, settings, tmp_path / "keys-1", first)
    with pytest.raises(KeyMaterialError) as refused:
        build_kernel(settings, clock).close()
    accepted = settings.model_copy(update={"accept_lost_keys": _acceptance(str(refused.value))})
    build_kernel(accepted, clock).close()  # alice is recorded as erased, as asked

    # Later, with the acceptance still set: carol's keys go missing the same way.
    second = _save_key_folder(backend, settings, tmp_path / "keys-2")
    k = build_kernel(accepted, clock)
    fill(k, "carol", canaries("carol"))
    k.close()
    newer = _save_key_folder(backend, settings, tmp_path / "keys-3")
    _put_key_folder_back(backend, settings, tmp_path / "keys-2", second)

    with pytest.raises(KeyMaterialError, match="older than the data"):
        build_kernel(accepted, clock).close()
    # Nothing was recorded: the newer key folder, found again, still opens carol.
    _put_key_folder_back(backend, settings, tmp_path / "keys-3", newer)
    k = build_kernel(accepted, clock)
    try:
        assert_intact(k, "carol", canaries("carol"))
        assert_intact(k, "bob", BOB)
    finally:
        k.close()
