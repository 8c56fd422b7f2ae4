"""Two processes running the decay job at once do each item's work once (both backends,
real processes).

``uprof maintain`` chose the cold memories from the views, then loaded the subject and
archived them. The aggregate did not know which memories were archived, so a second run
archived the same ones again: when both runs saved at once, the loser's retry reloaded
and archived the same list once more; when the second run read the views before the
first run's archive was projected, it archived them again without any conflict. The log
then held two ``MemoriesArchived`` for the same memories, and the audit two
``maintenance.ran`` entries claiming the same work. Each child below stops at a meeting
point (files, no sleeps for ordering) that makes one of those interleavings certain.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import textwrap
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from domain.values import IntentProposal, ProposalBatch
from tests.children import PythonChild
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, consent, say
from uprof.kernel import Uprof

CHILD_TIMEOUT_S = 120
CAPACITY = 3


def maintainer(
    backend: Backend, meeting: Path, name: str, *, at: str, wait_for: str
) -> PythonChild:
    """A process that runs the decay job (capacity 3) two days after the test clock's now.

    At its first call of ``kernel.app.<at>`` (``load`` or ``save``) it writes ``name`` in
    ``meeting`` and waits until every file of ``wait_for`` (comma-separated) is there
    (giving up after 60 s so that a broken test ends). When it is done it writes
    ``<name>.done``. It prints the job's result, with how many times it loaded the subject
    (``loads``: 2 when its save lost and its retry reloaded)."""
    script = textwrap.dedent(
        f"""
        import json, time
        from datetime import timedelta
        from pathlib import Path
        from tests.conftest import Backend
        from tests.fakes.ports import FakeClock
        from tests.kernel.conftest import build_kernel, settings_for
        from uprof.services.maintenance import MaintenanceService

        meeting = Path({str(meeting)!r})
        backend = Backend({backend.kind!r}, {backend.url!r}, Path({str(backend.data_dir)!r}))
        clock = FakeClock()
        kernel = build_kernel(settings_for(backend), clock)
        kernel.maintenance = MaintenanceService(
            kernel.app, kernel.subjects, kernel.queries, capacity={CAPACITY}
        )
        original = getattr(kernel.app, {at!r})
        met = []

        def meet(*args, **kwargs):
            if not met:
                met.append(True)
                (meeting / {name!r}).touch()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not all(
                    (meeting / w).exists() for w in {wait_for!r}.split(",")
                ):
                    time.sleep(0.01)
            return original(*args, **kwargs)

        setattr(kernel.app, {at!r}, meet)
        loads = []
        load = kernel.app.load

        def counted_load(*args, **kwargs):
            loads.append(True)
            return load(*args, **kwargs)

        kernel.app.load = counted_load
        try:
            result = kernel.run_maintenance(now=clock.now() + timedelta(days=2))
            print(json.dumps(dict(result, loads=len(loads))))
        finally:
            kernel.close()
            (meeting / ({name!r} + ".done")).touch()
        """
    )
    return PythonChild(script)


def result_of(child: PythonChild) -> dict[str, int]:
    out, err = child.communicate(CHILD_TIMEOUT_S)
    assert child.returncode == 0, err[-3000:]
    result: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return result


def wait_for(child: PythonChild, path: Path) -> None:
    while not path.exists():
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(0.02)
        assert child.poll() is None or path.exists(), child.communicate()[1][-3000:]


def five_memories_and_an_intent_due(kernel: Uprof, clock: FakeClock) -> None:
    consent(kernel)
    kernel.capture_many("alice", [say(f"note number {i}", day=1 + i) for i in range(5)])
    batch = ProposalBatch(
        (IntentProposal("renew the passport", (), expires_at=clock.now() + timedelta(days=1)),),
        author="agent",
        owner_agent="agent:one",
        app_id=APP,
    )
    kernel.submit_proposals("alice", batch)
    kernel.process()


def work_on_the_log(kernel: Uprof) -> tuple[Counter[str], Counter[str]]:
    """How many times each memory was archived and each intent expired, per the log."""
    archived: Counter[str] = Counter()
    expired: Counter[str] = Counter()
    for event in kernel.app.events.get(kernel.stream_of("alice")):
        kind = type(event).__name__
        if kind == "MemoriesArchived":
            archived.update(event.item_ids)  # type: ignore[attr-defined]
        elif kind == "IntentStatusChanged" and event.status == "expired":  # type: ignore[attr-defined]
            expired[event.item_id] += 1  # type: ignore[attr-defined]
    return archived, expired


def check_done_once(kernel: Uprof, results: list[dict[str, Any]]) -> None:
    archived, expired = work_on_the_log(kernel)
    assert len(archived) == 2 and set(archived.values()) == {1}, archived
    assert len(expired) == 1 and set(expired.values()) == {1}, expired
    # What the runs say they did adds up to what the log holds, and the audit claims it once.
    assert sum(r["memories_archived"] for r in results) == 2, results
    assert sum(r["intents_expired"] for r in results) == 1, results
    claims = [e.entry["counts"] for e in kernel.audit_log.entries(action="maintenance.ran")]
    assert claims == [{"intents_expired": 1, "memories_archived": 2}], claims
    # The views show it, and equal a rebuild from the log.
    kernel.process()
    view = kernel.profile("alice")
    assert sorted(m.text for m in view.memories if m.archived) == [
        "note number 0",
        "note number 1",
    ]
    assert [i.status for i in view.intents] == ["expired"]
    live = kernel.queries.table_digest()
    kernel.rebuild()
    assert kernel.queries.table_digest() == live


def test_two_runs_saving_at_once_archive_each_memory_once(
    backend: Backend, kernel: Uprof, clock: FakeClock, tmp_path: Path
) -> None:
    """Both runs chose the same cold memories and loaded the same version; they meet at
    their save: one wins, the other's save conflicts and its retry reloads."""
    five_memories_and_an_intent_due(kernel, clock)
    meeting = tmp_path / "meeting"
    meeting.mkdir()

    first = maintainer(backend, meeting, "first", at="save", wait_for="first,second")
    second = maintainer(backend, meeting, "second", at="save", wait_for="first,second")

    results = [result_of(first), result_of(second)]
    assert sorted(r["loads"] for r in results) == [1, 2], results  # the race happened
    check_done_once(kernel, results)


def test_a_run_that_read_the_views_before_the_other_saved_archives_nothing_again(
    backend: Backend, kernel: Uprof, clock: FakeClock, tmp_path: Path
) -> None:
    """The second run chose its cold memories from views that did not show the first
    run's archive; it loads the subject only after the first run has finished (no
    version conflict: nothing but the aggregate can tell it the work is done)."""
    five_memories_and_an_intent_due(kernel, clock)
    meeting = tmp_path / "meeting"
    meeting.mkdir()

    second = maintainer(backend, meeting, "second", at="load", wait_for="first.done")
    wait_for(second, meeting / "second")  # its views read, before any archive
    first = maintainer(backend, meeting, "first", at="load", wait_for="first")

    check_done_once(kernel, [result_of(first), result_of(second)])
