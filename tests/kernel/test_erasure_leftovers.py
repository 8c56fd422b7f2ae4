"""Leftovers of decisions 0141, 0145 and 0147 (decision XXXX-erasure-leftovers).

Bug IO: a restore that rolled a capture erasure's events back (its ``ErasedRefsNoted``
and its ``CaptureErased``) had the erasure's events appended again without the ref's
token, so once the idempotency retention passed, re-importing the file captured the
erased words again. Both backends, end to end: import, erase, restore a backup taken
before the erasure, ask again (or not), re-import a day later.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.errors import ErasureIncompleteError
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, settings_for
from tests.kernel.test_erasure_resume_scopes import (
    projections_stall_after_first_wait,
    unfinished_request,
)
from tests.kernel.test_import_erased_refs import captured
from tests.kernel.test_import_idempotency import record
from uprof.services.backup import backup, restore
from uprof.services.importer import import_interactions

ERASED = "Qzxerasedcanary lives here"
LINES = [record(ERASED, ref="r-erased"), record("I like tea", ref="r-kept")]


@pytest.mark.parametrize("finished_before_restore", [False, True], ids=["incomplete", "receipted"])
def test_a_restored_capture_erasure_still_skips_its_reimport(
    backend: Backend,
    clock: FakeClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    finished_before_restore: bool,
) -> None:
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        consent(kernel)
        assert import_interactions(kernel, LINES).captured == 2
        kernel.ensure_fresh(10)
        erased = next(
            c.capture_id
            for c in kernel.queries.all_captures(str(kernel.stream_of("alice")))
            if c.source_ref == "r-erased"
        )
    finally:
        kernel.close()
    backup(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    try:
        if finished_before_restore:
            kernel.erase_capture("alice", erased)
        else:
            with monkeypatch.context() as behind:
                projections_stall_after_first_wait(kernel, behind)
                with pytest.raises(ErasureIncompleteError):
                    kernel.erase_capture("alice", erased)
            assert unfinished_request(kernel, "capture", [erased])
    finally:
        kernel.close()
    restore(settings, tmp_path / "bk")
    kernel = build_kernel(settings, clock)
    try:
        if not finished_before_restore:
            # Asked again: the erasure's events are appended again (the log lost them).
            kernel.erase_capture("alice", erased)
        clock.advance(seconds=kernel.settings.idempotency_retention_s + 3600)
        kernel.purge_idempotency_keys()
        kernel.ensure_fresh(10)
        again = import_interactions(kernel, LINES)
        assert (again.captured, again.erased) == (0, ("line 1",)), again
        kernel.ensure_fresh(10)
        texts = [c.source_ref for c in kernel.queries.all_captures(str(kernel.stream_of("alice")))]
        assert texts == ["r-kept"]
        assert len(captured(kernel)) == 1
    finally:
        kernel.close()
