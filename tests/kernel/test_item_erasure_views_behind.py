"""An item erasure survives a restore of a backup whose views were behind its log.

An item erased without its evidence destroys no key: after a restore of data older
than the erasure, only the erasure ledger's ``items`` record keeps it erased, and the
start re-applied it only to items the *views* listed. A backup taken while projection
lagged holds the item's event in the log but not in the views: the start found
nothing to erase, and the projection, catching up, served the item again. Both
backends.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from projections.profile import tables as t
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    build_kernel,
    consent,
    running,
    sail_intent_of_alice,
    say,
    settings_for,
)
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore


def listed_intents(kernel: Uprof) -> int:
    with kernel.views_engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(t.intents)).scalar_one())


def test_an_erased_item_the_backups_views_did_not_list_stays_erased(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    consent(kernel)
    kernel.capture("alice", say("I want to learn to sail", ref="sail"))
    while kernel.extraction.run_once():  # extracted into the log, not projected
        pass
    assert listed_intents(kernel) == 0
    kernel.close()
    backup(settings, tmp_path / "bk")  # the log holds the intent, the views do not

    with running(settings, clock) as kernel:
        kernel.process()
        (intent,) = kernel.profile("alice").intents
        kernel.erase_item("alice", intent.item_id)

    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        assert intent.item_id not in [i.item_id for i in kernel.profile("alice").intents]
        assert listed_intents(kernel) == 0


def test_an_erased_item_the_backups_log_had_not_extracted_stays_erased(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    consent(kernel)
    kernel.capture("alice", say("I want to learn to sail", ref="sail"))
    kernel.close()
    backup(settings, tmp_path / "bk")  # captured, not yet extracted

    with running(settings, clock) as kernel:
        kernel.process()
        (intent,) = kernel.profile("alice").intents
        kernel.erase_item("alice", intent.item_id)

    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        assert [i.description for i in kernel.profile("alice").intents] == []


def test_a_start_projects_to_the_head_it_found_not_after_it(
    backend: Backend, clock: FakeClock
) -> None:
    """``_project_to_head`` brings the views to the log's head as the start found it.
    Writers of other processes go on appending meanwhile; on a2a025c it projected until
    the log stopped growing, so a start (a server's, a worker's, any CLI command's) under
    a steady write load faster than one projector never finished."""
    from uprof.services.recovery import _project_to_head

    settings = settings_for(backend)
    with running(settings, clock) as kernel:
        intent = sail_intent_of_alice(kernel, "sail")
        kernel.erase_item("alice", intent.item_id)  # the ledger names an item from now on
        kernel.process()
        for i in range(3):  # the views fall behind the log
            kernel.capture("alice", say(f"note {i}", ref=f"n{i}"))
        head = kernel.app.max_notification_id()
        assert kernel.projections.position < head

        batches = 0
        run_once = kernel.projections.run_once

        def another_process_writes_meanwhile() -> int:
            nonlocal batches
            batches += 1
            if batches > 20:
                raise AssertionError("the start is still projecting what was written after it")
            kernel.capture("alice", say(f"later {batches}", ref=f"l{batches}"))
            return run_once()

        kernel.projections.run_once = another_process_writes_meanwhile  # type: ignore[method-assign]
        _project_to_head(kernel)
        assert kernel.projections.position >= head
        assert batches <= 3
