"""``Uprof.process`` gives projections a turn while extraction is never idle (both backends).

The server's worker runs ``process``; erasures, freshness waits and reads wait on the
projections. Under a steady stream of captures extraction always has another batch, and
when ``process`` ran extraction until idle first, the projection stood still for as long
as the captures came (three copies of the erasure-under-load test at once: no projection
progress through four erasure attempts).
"""

from __future__ import annotations

import pytest

from tests.kernel.conftest import consent, say
from uprof.kernel import Uprof

BUSY_BATCHES = 20


def test_projections_advance_while_extraction_always_has_more(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    consent(kernel, subject="alice")
    kernel.capture("alice", say("I live in Oslo"))
    turns: list[str] = []
    extract, project = kernel.extraction.run_once, kernel.projections.run_once
    busy = iter(range(BUSY_BATCHES))

    def extraction_under_load() -> int:
        turns.append("extract")
        if next(busy, None) is not None:
            # Another capture arrived while this batch ran: there is always more.
            kernel.capture("alice", say(f"note {len(turns)}"))
            return extract() or 1
        return extract()

    def projection() -> int:
        turns.append("project")
        return project()

    monkeypatch.setattr(kernel.extraction, "run_once", extraction_under_load)
    monkeypatch.setattr(kernel.projections, "run_once", projection)

    kernel.process()

    first_projection = turns.index("project")
    assert first_projection <= 1, f"projections waited for {first_projection} extraction batches"
    # Turn by turn while extraction was busy, and everything projected at the end.
    assert turns[: 2 * BUSY_BATCHES : 2] == ["extract"] * BUSY_BATCHES
    assert turns[1 : 2 * BUSY_BATCHES : 2] == ["project"] * BUSY_BATCHES
    assert kernel.lag().projection_pending == 0
    assert [a.value for a in kernel.profile("alice").attributes] == ["Oslo"]
