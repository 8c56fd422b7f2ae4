"""Readers of the views beside another process's ``projections rebuild`` (SQLite and
PostgreSQL, real processes; decision 0240-readers-beside-a-rebuild).

A rebuild resets the views and replays the log into them under the views' schema lock
(0166-backup-beside-rebuild). Halfway, the views list only what the replay has passed.
0236-review-of-0232 attacked a history read of the subject there (bug WF); these attack
the other readers of a process that was already running, with the rebuild in a process
of its own held just after its reset (0233's ``_REBUILD_WHEN_TOLD``), or killed -9 there.

The scenario is 0236's: an item erasure killed between its ledger record and its
``ItemsErased`` leaves the item's events in the log with no erasure of them, so every
replay lists the item again until someone erases it again. A read of the subject asks
the ledger first (bug IP), and then catches the views up: bug WY, the ask looked at the
views before they were caught up, found nothing listed, and the catch-up brought the
item back into the answer.
"""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from domain.errors import UprofError
from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    APP,
    SAIL,
    build_kernel,
    consent,
    running,
    sail_intent_of_alice,
    say,
    settings_for,
)
from tests.kernel.test_erasure_leftovers import _killed_after_record
from tests.kernel.test_review_0232_views_halfway import _let_go, _listed, _rebuild_child
from tests.kernel.test_start_beside_a_rebuild import WAIT_S, _wait_for
from uprof.api.errors import classify, retry_after_s
from uprof.backends import SchemaLockWaitError
from uprof.kernel import Uprof
from uprof.services.residue import ResidueReport


def _profile(kernel: Uprof) -> Any:
    return [i.item_id for i in kernel.profile("alice").intents]


def _export(kernel: Uprof) -> Any:
    return kernel.export_subject("alice")


def _slice(kernel: Uprof) -> Any:
    return kernel.slice(
        "alice",
        f"learn to {SAIL}",
        budget_tokens=512,
        purpose="personalization",
        app_id=APP,
        agent_id="agent:one",
    )


READERS: dict[str, Callable[[Uprof], Any]] = {
    "profile": _profile,
    "export": _export,
    "slice": _slice,
}


def _served(answer: Any, item_id: str) -> bool:
    """Whether an answer (item ids, an export, a slice) names the erased item (the
    canary's words stay in the capture and in the memory drawn from it: the erasure
    took the intent only)."""
    return item_id in str(answer)


def _scan(kernel: Uprof) -> ResidueReport | UprofError:
    """The residue scan for the canary, or the error it was refused with."""
    try:
        return kernel.residue_scan([SAIL])
    except UprofError as refused:
        return refused


@pytest.mark.parametrize("reader", sorted(READERS))
def test_wy_a_read_halfway_through_a_replay_serves_no_erased_item(
    backend: Backend, clock: FakeClock, tmp_path: Path, reader: str
) -> None:
    """Bug WY: a running process reads the subject (profile, export, slice) while another
    process's rebuild has reset the views. The read asked the ledger, found the item not
    listed and erased nothing; its own catch-up then replayed the log into the views and
    it served the erased item (once: the next read erased it)."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        intent = sail_intent_of_alice(kernel)
        assert _served(READERS[reader](kernel), intent.item_id)  # the reader shows it
        child, signals = _rebuild_child(backend, tmp_path)
        try:
            _killed_after_record(settings, "item", intent.item_id)
            assert _listed(kernel, intent.item_id)
            signals["start"].touch()
            assert _wait_for(signals["reset"], child, WAIT_S), "the rebuild never reset"
            assert not _listed(kernel, intent.item_id)  # halfway: not replayed yet
            answer = READERS[reader](kernel)
        finally:
            _let_go(child, signals)
        assert not _served(answer, intent.item_id), (
            f"the {reader} read halfway through another process's replay served the erased item"
        )
        kernel.process()
        assert not _listed(kernel, intent.item_id)
        assert not _served(READERS[reader](kernel), intent.item_id)
    finally:
        kernel.close()


def test_wy_a_rebuild_killed_halfway_then_every_reader(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The rebuild killed -9 just after its reset (its lock goes with it; the views are
    empty, their positions 0). The process that was running reads on: the residue scan
    is not clean (the interrupted erasure is a finding whatever the views hold); the
    profile, the export and the slice do not serve the erased item; a rebuild from the
    log then gives the views the live projection holds."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        intent = sail_intent_of_alice(kernel)
        child, signals = _rebuild_child(backend, tmp_path)
        try:
            _killed_after_record(settings, "item", intent.item_id)
            signals["start"].touch()
            assert _wait_for(signals["reset"], child, WAIT_S), "the rebuild never reset"
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.communicate(timeout=WAIT_S)
        assert child.returncode == -signal.SIGKILL
        assert not _listed(kernel, intent.item_id)  # the views are empty
        scanned = _scan(kernel)
        assert not (isinstance(scanned, ResidueReport) and scanned.clean), scanned
        for name, read in sorted(READERS.items()):
            assert not _served(read(kernel), intent.item_id), (
                f"after a rebuild killed halfway, the {name} read served the erased item"
            )
        assert not _listed(kernel, intent.item_id)
        assert kernel.ensure_fresh(10)  # the reads served above, recorded and projected
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
        assert not _served(_profile(kernel), intent.item_id)
    finally:
        kernel.close()


#: A real rebuild in a process of its own held inside its replay: its first batch read
#: (after the reset), it says so and waits to be let go before applying it.
_REBUILD_HELD_IN_ITS_REPLAY = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.conftest import Backend
    from tests.fakes.ports import FakeClock
    from tests.kernel.conftest import build_kernel, settings_for

    backend = Backend(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    applying, go = Path(sys.argv[4]), Path(sys.argv[5])
    settings = settings_for(backend).model_copy(update={"worker_partitions": int(sys.argv[6])})
    kernel = build_kernel(settings, FakeClock())
    views = kernel.projections._views
    apply = views.apply_batch

    def held(*args, **kwargs):
        if not applying.exists():
            applying.touch()
            while not go.exists():
                time.sleep(0.01)
        return apply(*args, **kwargs)

    views.apply_batch = held
    try:
        print("replayed", kernel.rebuild())
    finally:
        kernel.close()
    """
)


@pytest.mark.parametrize("partitions", [1, 2])
def test_held_an_erasure_and_a_worker_beside_a_rebuild_held_in_its_replay(
    backend: Backend, clock: FakeClock, tmp_path: Path, partitions: int
) -> None:
    """Another process's rebuild has reset the views and read its first batch (the log
    up to the item) when a running process erases the item (its receipt issued once its
    own catch-up passed the erasure) and projects a new capture as a worker does. Let go,
    the rebuild's batch must not list the item again, nor project anything twice: the
    views are then what a rebuild from the log gives. With two pipeline partitions too
    (each its own position; the rebuild replays both)."""
    settings = settings_for(backend).model_copy(update={"worker_partitions": partitions})
    kernel = build_kernel(settings, clock)
    try:
        intent = sail_intent_of_alice(kernel)
        applying, go = tmp_path / "applying", tmp_path / "go"
        child = PythonChild(
            _REBUILD_HELD_IN_ITS_REPLAY,
            backend.kind,
            backend.url,
            str(backend.data_dir),
            str(applying),
            str(go),
            str(partitions),
        )
        try:
            assert _wait_for(applying, child, WAIT_S), "the rebuild never read a batch"
            result = kernel.erase_item("alice", intent.item_id)
            assert result.receipt is not None
            kernel.capture("alice", say("I live in Porto", ref="porto"))
            kernel.process()
        finally:
            go.touch()
            out, err = child.communicate(timeout=WAIT_S)
        kernel.process()
        assert not _listed(kernel, intent.item_id), (
            f"the rebuild listed the erased item again after its receipt ({out} {err[-2000:]})"
        )
        assert not _served(_profile(kernel), intent.item_id)
        assert kernel.ensure_fresh(10)
        live = kernel.queries.table_digest()
        kernel.rebuild()
        assert kernel.queries.table_digest() == live
        print("REBUILD", child.returncode, out, err[-1500:])
    finally:
        kernel.close()


def _bob_erased_and_alice_held(kernel: Uprof) -> None:
    """Bob erased whole (his receipt issued), alice holding her intent: a scan of the
    whole views is clean."""
    consent(kernel, "bob")
    kernel.capture("bob", say(f"Bob wants to {SAIL} too", ref="bob"))
    sail_intent_of_alice(kernel)
    kernel.erase_subject("bob")
    kernel.process()
    whole = _scan(kernel)
    assert isinstance(whole, ResidueReport) and whole.clean, whole


def test_wz_a_residue_scan_halfway_through_a_replay_says_nothing_clean(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug WZ: the residue scan of a running process, while another process's rebuild had
    reset the views and not replayed them, checked the erased streams' rows in views that
    held none of anyone's, and said clean ("residue: 0"): a check that could not fail.
    It now scans under the rebuild's own lock: beside a rebuild that outlasts the wait,
    it is refused, and after it, it scans the whole views."""
    settings = settings_for(backend).model_copy(update={"schema_lock_wait_s": 1.0})
    kernel = build_kernel(settings, clock)
    try:
        _bob_erased_and_alice_held(kernel)
        child, signals = _rebuild_child(backend, tmp_path)
        try:
            signals["start"].touch()
            assert _wait_for(signals["reset"], child, WAIT_S), "the rebuild never reset"
            halfway = _scan(kernel)
        finally:
            _let_go(child, signals)
        assert not isinstance(halfway, ResidueReport), (
            f"the residue scan reported over views another process was replaying: {halfway}"
        )
        assert isinstance(halfway, SchemaLockWaitError), halfway
        # The console's scan answers it as a temporary refusal, not a fault.
        assert (classify(halfway), retry_after_s(halfway)) == ((503, "store_unavailable"), 5)
        after = _scan(kernel)
        assert isinstance(after, ResidueReport) and after.clean, after
    finally:
        kernel.close()


def test_held_a_residue_scan_over_views_a_killed_rebuild_left_empty(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The rebuild killed -9 after its reset leaves the views empty and their positions
    at 0, its lock gone with it. A server whose workers do not catch the views up
    (``serve --no-worker``) scans them as they stand: clean, and the same verdict once a
    process has caught them up, since the replay of an erased stream writes no row of
    it (its events do not open): the empty views hid nothing from the rows-left check."""
    settings = settings_for(backend)
    with running(settings, clock) as setup:
        _bob_erased_and_alice_held(setup)
        bob = setup.keystore.shredded_stream_ids()
    assert bob
    stalled = settings.model_copy(update={"background_workers": True, "read_wait_timeout_s": 0.5})
    kernel = build_kernel(stalled, clock)
    try:
        child, signals = _rebuild_child(backend, tmp_path)
        try:
            signals["start"].touch()
            assert _wait_for(signals["reset"], child, WAIT_S), "the rebuild never reset"
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.communicate(timeout=WAIT_S)
        assert child.returncode == -signal.SIGKILL
        assert kernel.projections.position == 0
        scanned = _scan(kernel)
        assert isinstance(scanned, ResidueReport) and scanned.clean, scanned
        assert scanned.streams_checked == len(bob)
    finally:
        kernel.close()
    with running(settings, clock) as caught_up:
        caught_up.process()
        assert caught_up.projections.position == caught_up.app.max_notification_id()
        after = _scan(caught_up)
        assert isinstance(after, ResidueReport) and after.clean, after
        assert after.streams_checked == len(bob)
