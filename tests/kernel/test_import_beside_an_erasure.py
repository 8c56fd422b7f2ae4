"""An import in one process while another erases one of its subjects (real processes,
SQLite and PostgreSQL; decision 0144-import-and-adapters-attacks).

The import has checked the subject (live, consent in force) and written one of its
records, and is about to write the next when the other process erases it. Held: every
record of the erased subject written after the erasure fails, named and counted; none
creates the subject again or leaves a capture of it; the other subject's records are all
imported; a re-run changes nothing.
"""

from __future__ import annotations

import pytest

from domain.errors import SubjectErasedError
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, settings_for
from tests.kernel.import_race_child import import_held_at, lines_for
from uprof.eventstore import CAPTURED_TOPIC
from uprof.services.importer import import_interactions

EACH = 20


def test_an_import_racing_an_erasure_never_brings_the_subject_back(backend: Backend) -> None:
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    try:
        consent(setup, "alice")
        consent(setup, "bob")
    finally:
        setup.close()
    lines = lines_for(["bob", "alice"], EACH)
    ctx = children.CONTEXT
    sync = {"ready": ctx.Event(), "erased": ctx.Event()}
    out = ctx.Queue()
    child = ctx.Process(target=import_held_at, args=(settings, "alice", lines, sync, out))
    child.start()
    try:
        assert sync["ready"].wait(timeout=120), "the import never reached alice's first write"
        eraser = build_kernel(settings, FakeClock())
        try:
            eraser.erase_subject("alice")
        finally:
            eraser.close()
        sync["erased"].set()
        imported, skipped, failed, stopped = out.get(timeout=120)
    finally:
        child.join(60)
    assert child.exitcode == 0
    assert stopped is None
    # bob's records all in and alice's first; each of alice's others failed, named.
    assert (imported, skipped) == (EACH + 1, 0), (imported, skipped, failed)
    assert len(failed) == EACH - 1 and all(f[1] in ("(record)", "subject") for f in failed), failed
    assert all("erased" in f[2] for f in failed), failed
    after = build_kernel(settings, FakeClock())
    try:
        with pytest.raises(SubjectErasedError):
            after.subjects.find("alice")

        def captures_in_log() -> int:  # alice's are shredded: counted, not decoded
            return len(after.app.notifications_after(0, 100_000, [CAPTURED_TOPIC]))

        in_log = captures_in_log()  # bob's and alice's first: nothing after the erasure
        assert in_log == EACH + 1
        after.process()
        again = import_interactions(after, lines)
        assert (again.captured, again.skipped, len(again.failed)) == (0, EACH, EACH), again
        assert captures_in_log() == in_log
    finally:
        after.close()
