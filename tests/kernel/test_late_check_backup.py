"""Review of decision 0112: a backup's check positions never run ahead of its audit log.

On SQLite a backup copies ``views.sqlite`` (the audit log) first, then ``events.sqlite``
(the event log and, since decision 0112, the check positions), each one snapshot
through the backup API. A request captured between the two copies is in the backup's
log and its ``capture.accepted`` is not in the backup's audit log; the check that ran
meanwhile found the entry on the live log and moved its position past the request. A
restore into emptied data stores (a disaster: the live audit log is gone, the backup's
is taken) then held a request the audit log never names, behind a check position that
said it was checked: never named. The backup now copies each check position as it
stood before the audit log was copied, so what was checked after is checked again.

PostgreSQL's backup is one exported snapshot of every table (``pg_dump``): the check
positions and the audit log are read at one instant, so there is no between.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import uprof.backends.sqlite as sqlite_backend
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, running, say, settings_for
from tests.kernel.test_capture_accepted_reconciled import accepted
from tests.kernel.test_restore_bad_input import _empty_data_stores
from uprof.eventstore import CAPTURED_TOPIC
from uprof.services.backup import backup, restore
from uprof.services.late_captures import LateCaptures


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_request_captured_between_the_two_copies_is_named_after_a_restore(
    backend: Backend, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(backend).model_copy(update={"late_capture_check_s": 0})
    with running(settings, clock) as kernel:
        consent(kernel, "bob")
        late = kernel.extraction.late_captures
        assert isinstance(late, LateCaptures)
        kernel.capture("bob", say("I collect stamp number 0"))
        kernel.process()  # the check position has started, past stamp 0
        events_db = settings.data_dir / "events.sqlite"
        views_db = settings.data_dir / "views.sqlite"
        copied: list[Path] = []
        between: list[int] = []

        def connect(path: Any, *a: Any, **k: Any) -> sqlite3.Connection:
            copied.append(Path(path))
            if Path(path) == events_db and views_db in copied[:-1] and not between:
                # The audit log is copied; the event log is not yet: a request arrives,
                # is extracted and checked (its entry is on the live log).
                kernel.capture("bob", say("I collect stamp number 1"))
                kernel.process()
                row = late.check_row(kernel.extraction.tracking_name(0))
                between.append(kernel.app.check_position(row) or 0)
            return sqlite3.connect(path, *a, **k)

        driver = SimpleNamespace(**{n: getattr(sqlite3, n) for n in dir(sqlite3) if n[0] != "_"})
        driver.connect = connect
        monkeypatch.setattr(sqlite_backend, "sqlite3", driver)
        backup(settings, tmp_path / "bk")
        monkeypatch.undo()
        captures = [n.id for n in kernel.app.notifications_after(0, 100, topics=(CAPTURED_TOPIC,))]
        assert between == [captures[-1]]  # checked, on the live log
    _empty_data_stores(backend, settings)  # a disaster: the live audit log is gone
    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        kernel.process()
        named = sorted(e["notification_id"] for e in accepted(kernel))
        assert named == captures  # every capture in the restored log is named
