"""Bug WG (0236-review-of-0232): ``pipeline_unmoved_s`` with workers split by partition
(``uprof worker --partitions 2 --partition K``), one of them gone (killed -9, never
restarted), SQLite and PostgreSQL.

A ``serve --no-worker`` server counts how long the pending work has not moved. With
partitioned workers, the live worker's positions move on every write it projects, any
subject's: the count started again at 0 each time, while the dead worker's partition,
captures pending, did not move at all. The count is now each partition position's own:
the longest any position with work pending has not moved.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock, FakeExtractor
from tests.kernel.conftest import consent, say, settings_for
from uprof.adapters.embeddings import HashingEmbedder
from uprof.api.runtime import ExternalProgress
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof
from uprof.settings import Settings

PARTITIONS = 2


@pytest.fixture
def settings(backend: Backend) -> Settings:
    return settings_for(backend).model_copy(
        update={"worker_partitions": PARTITIONS, "background_workers": True, "run_worker": False}
    )


def _kernel(settings: Settings, clock: FakeClock, partitions: list[int] | None) -> Uprof:
    return bootstrap(
        settings,
        clock=clock,
        embedder=HashingEmbedder(),
        extractor=FakeExtractor(),
        partitions=partitions,
    )


@pytest.fixture
def server(settings: Settings, clock: FakeClock) -> Iterator[Uprof]:
    """The ``serve --no-worker`` server: it runs no pipeline."""
    kernel = _kernel(settings, clock, None)
    try:
        yield kernel
    finally:
        kernel.close()


def _subjects_in_each_partition(server: Uprof) -> dict[int, str]:
    """A consenting subject of each partition, each with a capture."""
    found: dict[int, str] = {}
    for n in range(64):
        name = f"subject-{n}"
        consent(server, name)
        k = server.extraction._partitioning.of(server.stream_of(name))
        if k not in found:
            found[k] = name
            server.capture(name, say(f"I live in town {n}", ref=f"c{n}"))
        if len(found) == PARTITIONS:
            return found
    raise AssertionError(f"64 subjects fell in the partitions {sorted(found)} only")


def test_wg_the_live_partitions_work_does_not_hide_the_dead_ones(
    server: Uprof, settings: Settings, clock: FakeClock
) -> None:
    now = [100.0]
    progress = ExternalProgress(monotonic=lambda: now[0])
    subjects = _subjects_in_each_partition(server)
    live = _kernel(settings, clock, [0])  # partition 1's worker is gone
    try:
        live.process()
        assert server.lag().extraction_pending >= 1  # partition 1's capture
        assert progress.unmoved_s(server.lag()) == 0.0  # the first look starts the count
        now[0] += 5
        assert progress.unmoved_s(server.lag()) == 5.0
        # Work for the live worker: a consent of its partition's subject, projected.
        consent(server, subjects[0], app="app:calendar")
        before = live.projections.partition_position(0)
        live.process()
        assert live.projections.partition_position(0) > before, "the live worker moved nothing"
        now[0] += 5
        unmoved = progress.unmoved_s(server.lag())
    finally:
        live.close()
    assert server.lag().extraction_pending >= 1
    assert unmoved == 10.0, (
        f"partition 1's capture has waited 10 s with no worker; readiness says {unmoved} s"
    )
