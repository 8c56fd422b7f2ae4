"""The production ProjectionRunner on the fakes: capture, extraction, projection.

The runner holds the ``ViewStore`` port and a memory-embedding function, no engine, so
its read-ahead, partition positions, exactly-once and rebuild run here in milliseconds.
Across processes the same guarantees are checked on SQL in ``tests/reliability``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import uprof.services.projection
from projections.profile.projector import embed_memories
from tests.fakes.ports import FakeExtractor
from tests.unit.conftest import World, grant, say
from uprof.adapters.embeddings import HashingEmbedder
from uprof.partitions import Partitioning
from uprof.services.extraction import EvidenceChecker, ExtractionWorker
from uprof.services.projection import ProjectionRunner

DIMENSION = 16
SUBJECTS = ("alice", "bob", "carol", "dave")


@pytest.fixture
def runners(world: World) -> Iterator[list[ProjectionRunner]]:
    """Runners over the world's fake stores, each closed at the end."""
    started: list[ProjectionRunner] = []
    yield started
    for runner in started:
        runner.close()


def runner(world: World, started: list[ProjectionRunner], **options: Any) -> ProjectionRunner:
    built = ProjectionRunner(
        world.events,
        world.views,
        partial(embed_memories, HashingEmbedder(DIMENSION)),
        **options,
    )
    started.append(built)
    return built


def capture_and_extract(world: World, days: range = range(1, 4)) -> None:
    for subject in SUBJECTS:
        grant(world, subject)
    for day in days:
        for subject in SUBJECTS:
            text = f"I live in Paris and I want to learn to cook, day {day} of {subject}"
            world.capture.capture(subject, say(text))
    ExtractionWorker(
        world.events, FakeExtractor(), EvidenceChecker(world.views), world.clock
    ).run_until_idle()


def count_applied(world: World, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record what every ``apply_batch`` on the store applied (events, not notifications)."""
    applied: list[int] = []
    apply_batch = world.views.apply_batch

    def counting(*args: Any, **kwargs: Any) -> int:
        applied.append(apply_batch(*args, **kwargs))
        return applied[-1]

    monkeypatch.setattr(world.views, "apply_batch", counting)
    return applied


def streams(world: World) -> list[str]:
    found = [world.subjects.find(s) for s in SUBJECTS]
    return [str(h.stream_id) for h in found if h is not None]


def every_view(world: World) -> dict[tuple[str, str], Any]:
    """Every query's answer for every subject, through the port (vectors as lists)."""
    views = world.views
    answers: dict[tuple[str, str], Any] = {}
    for sid in streams(world):
        rows, vectors = views.memories(sid, include_archived=True, with_vectors=True)
        answers["memories", sid] = (rows, None if vectors is None else vectors.tolist())
        answers["attributes", sid] = views.attributes(sid)
        answers["intents", sid] = views.intents(sid)
        answers["consents", sid] = views.consents(sid)
        answers["captures", sid] = views.all_captures(sid)
        answers["sessions", sid] = views.session_activity(sid)
        answers["reads", sid] = views.item_reads(sid)
    return answers


def test_the_runner_projects_captures_and_extraction_results_with_vectors(
    world: World, runners: list[ProjectionRunner]
) -> None:
    capture_and_extract(world)
    projections = runner(world, runners)
    head = world.events.max_notification_id()
    assert projections.lag() == head
    assert projections.run_until_idle() == head
    assert projections.position == head and projections.lag() == 0
    alice = str(world.subjects.find("alice").stream_id)  # type: ignore[union-attr]
    assert [(a.key, a.value) for a in world.views.attributes(alice)] == [("home_location", "Paris")]
    assert [i.description for i in world.views.intents(alice)] == ["learn to cook"]
    memories, vectors = world.views.memories(alice, with_vectors=True)
    assert sorted(m.text for m in memories) == [
        f"I live in Paris and I want to learn to cook, day {day} of alice" for day in (1, 2, 3)
    ]
    # The runner's embedding thread made the vectors, one per memory, in memory order.
    assert vectors is not None and vectors.shape == (3, DIMENSION)
    expected = HashingEmbedder(DIMENSION).embed([m.text for m in memories])
    assert abs(vectors - expected).max() < 1e-6
    assert list(world.views.session_activity(alice).values()) == [3]


def test_a_second_runner_over_the_same_store_applies_nothing_twice(
    world: World, runners: list[ProjectionRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    capture_and_extract(world)
    applied = count_applied(world, monkeypatch)
    # Batches of 3: the first runner reads the batch after the one it applies ahead.
    first, second = runner(world, runners, batch_size=3), runner(world, runners, batch_size=3)
    assert first.run_once() == 3
    second.run_until_idle()  # projects everything meanwhile
    assert first.run_until_idle() == 0  # its batch read ahead starts behind the position
    assert first.read_ahead_dropped == 1
    head = world.events.max_notification_id()
    assert sum(applied) == head  # every event of the log applied once, by one runner
    assert first.position == second.position == head
    for sid in streams(world):
        assert list(world.views.session_activity(sid).values()) == [3]  # counted once


def test_partitioned_runners_apply_each_event_once(
    world: World, runners: list[ProjectionRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    capture_and_extract(world)
    applied = count_applied(world, monkeypatch)
    two = Partitioning(2)
    # One runner per partition and a third on both, as `uprof worker --partition` runs.
    zero = runner(world, runners, batch_size=4, partitioning=two, partitions=[0])
    one = runner(world, runners, batch_size=4, partitioning=two, partitions=[1])
    both = runner(world, runners, batch_size=4, partitioning=two)
    head = world.events.max_notification_id()
    zero.run_until_idle()
    # Partition 0's batches move its position over partition 1's events too, but the
    # log is projected only up to the lowest partition position.
    assert zero.partition_position(0) == head
    assert zero.position == both.position == 0 and both.lag() == head
    while both.run_once() + one.run_once():
        pass
    assert sum(applied) == head
    assert [world.views.position(zero.position_name(k), world.events.name) for k in (0, 1)] == [
        head,
        head,
    ]
    assert zero.position == one.position == both.position == head
    for sid in streams(world):
        assert list(world.views.session_activity(sid).values()) == [3]


def test_reset_and_rebuild_give_the_same_views(
    world: World, runners: list[ProjectionRunner]
) -> None:
    capture_and_extract(world)
    projections = runner(world, runners, batch_size=5)
    projections.run_until_idle()
    live = every_view(world)
    assert all(live["memories", sid][1] is not None for sid in streams(world))
    projections.reset()
    assert projections.position == 0
    assert all(world.views.all_captures(sid) == [] for sid in streams(world))
    head = world.events.max_notification_id()
    assert projections.rebuild() == head
    assert every_view(world) == live


def test_the_runner_imports_no_sql() -> None:
    """Storage only through the ports: the runner's module imports no SQL of its own."""
    source = Path(uprof.services.projection.__file__).read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    assert "uprof.ports" in imported  # the walk sees the imports there are
    assert not {m for m in imported if m.split(".")[0] == "sqlalchemy"}
    assert not {m for m in imported if m.startswith("projections")}
