"""Views read halfway through another process's replay (``uprof projections rebuild``),
SQLite and PostgreSQL, real processes (0236-review-of-0232).

An item erasure records itself in the erasure ledger before it appends its
``ItemsErased``; killed between the two (or a restore of data older than the erasure),
the log holds the item's events and no erasure of it. Whoever finds the item listed in
the views erases it again: a start (``recovery._erase_items_again``) or a read of the
subject (``ErasureService.erase_recorded_items``, bug IP). Both decide from the views. A
rebuild in another process resets the views and replays the log into them: halfway,
the item is not listed yet, and once the replay passes its events it is listed again.

- KB's lock (0166-backup-beside-rebuild): the start reads the views under the views'
  schema lock, which a rebuild holds from before its reset to the end of its replay.
  0233-test-suite-speed-round-9 found that putting back only that lock failed no test
  (its Left): ``test_a_start_*`` here is that test.
- Bug WF: a read of the subject that found nothing listed halfway through the replay
  remembered the ledger's items as gone, for the life of the process: once the replay
  brought the item back, that process served it on every read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, sail_intent_of_alice, settings_for
from tests.kernel.test_erasure_leftovers import _killed_after_record
from tests.kernel.test_start_beside_a_rebuild import (
    _REBUILD_WHEN_TOLD,
    LOCK_TRY_S,
    RESET_WAIT_S,
    WAIT_S,
    _wait_for,
)
from uprof.kernel import Uprof
from uprof.services import recovery

_SIGNALS = ("ready", "start", "wants", "held", "reset", "go")


def _listed(kernel: Uprof, item_id: str) -> bool:
    """Whether the views list the item (read from the views: no read of the subject,
    which would erase it again)."""
    stream = str(kernel.stream_of("alice"))
    return item_id in [i.item_id for i in kernel.queries.intents(stream)]


def _rebuild_child(backend: Backend, tmp_path: Path) -> tuple[PythonChild, dict[str, Path]]:
    """A real rebuild in a process of its own, started (its own start done) and waiting
    to be told: it resets the views, says so, and replays once let go."""
    signals = {name: tmp_path / name for name in _SIGNALS}
    child = PythonChild(
        _REBUILD_WHEN_TOLD,
        backend.kind,
        backend.url,
        str(backend.data_dir),
        *(str(signals[name]) for name in _SIGNALS),
        str(LOCK_TRY_S),
    )
    assert _wait_for(signals["ready"], child, WAIT_S), "the rebuild never got ready"
    return child, signals


def _let_go(child: PythonChild, signals: dict[str, Path]) -> None:
    signals["start"].touch()
    signals["go"].touch()
    _, err = child.communicate(timeout=WAIT_S)
    assert child.returncode == 0, err[-3000:]


def test_a_start_reads_the_views_whole_beside_another_processs_rebuild(
    backend: Backend, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KB's lock: a start re-applying the ledger has caught the views up when another
    process's rebuild is told to go. Without the lock the rebuild resets the views, the
    start finds the erased item not listed and erases nothing; the replay brings it back.
    With it the rebuild waits for the start, which erases the item again."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        intent = sail_intent_of_alice(kernel)
        child, signals = _rebuild_child(backend, tmp_path)
        try:
            _killed_after_record(settings, "item", intent.item_id)
            assert _listed(kernel, intent.item_id)  # the ledger names it; the log erased nothing
            caught_up = recovery._project_to_head

            def then_a_rebuild_elsewhere(started: Any) -> None:
                caught_up(started)
                signals["start"].touch()
                assert _wait_for(signals["wants"], child, WAIT_S), "the rebuild never asked"
                # Reset, or refused its lock (held by this start): bounded either way.
                _wait_for(signals["reset"], child, RESET_WAIT_S, or_for=signals["held"])

            monkeypatch.setattr(recovery, "_project_to_head", then_a_rebuild_elsewhere)
            report = recovery.reapply_ledger(kernel)  # what every start runs first
            monkeypatch.undo()
        finally:
            _let_go(child, signals)
        kernel.process()
        assert not _listed(kernel, intent.item_id), (
            "the start read the views halfway through the rebuild's replay and erased "
            f"nothing; the replay listed the erased item again ({report})"
        )
        assert report.items_reerased == 1, report
        assert intent.item_id not in [i.item_id for i in kernel.profile("alice").intents]
    finally:
        kernel.close()


def test_wf_a_read_halfway_through_a_replay_does_not_forget_the_ledger(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Bug WF: a running process reads the subject while another process's rebuild has
    reset the views: the item is not listed, and the read remembered the ledger's items
    of the subject as gone. Once the replay listed the item again, every read of that
    process served it (the process ran on; nothing asked again)."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        intent = sail_intent_of_alice(kernel)
        child, signals = _rebuild_child(backend, tmp_path)
        try:
            _killed_after_record(settings, "item", intent.item_id)
            assert _listed(kernel, intent.item_id)
            signals["start"].touch()
            assert _wait_for(signals["reset"], child, WAIT_S), "the rebuild never reset"
            # A read of the subject (the history read: it waits for no view), halfway.
            kernel.profile("alice", as_of=clock.now())
        finally:
            _let_go(child, signals)
        kernel.process()
        served = [i.item_id for i in kernel.profile("alice").intents]
        assert intent.item_id not in served, (
            "a read halfway through another process's replay forgot the ledger: the "
            "erased item is served again"
        )
        assert not _listed(kernel, intent.item_id)
    finally:
        kernel.close()
