"""PrefEval-PR@B harness: distractor sampling, hit rule, budgets, outputs."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pytest

from benchmarks.baselines import OracleSystem, baseline_factories
from benchmarks.bench_common import BenchSlice, BenchTurn, SliceItemRef, render_bullet_line
from benchmarks.prefeval import (
    as_turns,
    is_hit,
    load_prefeval,
    main,
    run_prefeval,
    user_events,
)
from tests.bench.synthetic import PREF_TOPICS, hashed_embedder, write_prefeval


@pytest.fixture()
def pref_dir(tmp_path: Path) -> Path:
    return write_prefeval(tmp_path)


def test_load_accepts_folder_or_parent(pref_dir: Path) -> None:
    items = load_prefeval(pref_dir)
    assert len(items) == 9
    assert load_prefeval(pref_dir.parent) == items
    assert {i.topic for i in items} == set(PREF_TOPICS)
    assert [i.topic for i in load_prefeval(pref_dir, ["travel_hotel"])] == ["travel_hotel"] * 3
    assert len({i.source_ref for i in items}) == 9


def test_distractors_come_from_other_topics_and_are_seeded(pref_dir: Path) -> None:
    items = load_prefeval(pref_dir)
    user = items[0]
    events = user_events(user, items, 5, random.Random(7))
    assert len(events) == 6 and events.count(user) == 1
    assert all(e.topic != user.topic for e in events if e is not user)
    assert len(set(events)) == 6
    assert events == user_events(user, items, 5, random.Random(7))
    # Shuffled: over many draws the preference is not always in the same place.
    rng = random.Random(7)
    positions = {user_events(user, items, 5, rng).index(user) for _ in range(50)}
    assert len(positions) > 1
    with pytest.raises(ValueError, match="distractors requested"):
        user_events(user, items, 7, rng)  # only 6 items in other topics


def test_hit_rule(pref_dir: Path) -> None:
    user = next(i for i in load_prefeval(pref_dir) if i.topic == "travel_hotel" and i.index == 0)
    text = "- I avoid gluten.\n- i only  STAY in hotels that allow dogs.\n"
    assert is_hit(BenchSlice(text, ()), user)
    assert not is_hit(BenchSlice("- I like hotels.", ()), user)
    assert is_hit(
        BenchSlice("Likes dog-friendly hotels.", (SliceItemRef((user.source_ref,)),)), user
    )
    cites_many = SliceItemRef((user.source_ref, "a", "b", "c"))
    assert not is_hit(BenchSlice("A summary.", (cites_many,)), user)


class LongWinded:
    """Always returns every stored line, ignoring the budget."""

    name = "long"

    def __init__(self) -> None:
        self.store: dict[str, list[BenchTurn]] = {}

    def ingest(self, subject_key: str, turns: Sequence[BenchTurn]) -> None:
        self.store[subject_key] = list(turns)

    def slice(self, subject_key: str, query: str, budget_tokens: int, now: datetime) -> BenchSlice:
        turns = self.store[subject_key]
        return BenchSlice(
            "\n".join(render_bullet_line(t) for t in turns),
            tuple(SliceItemRef((t.source_ref,)) for t in turns),
        )


def test_run_prefeval_end_to_end(pref_dir: Path, tmp_path: Path) -> None:
    systems = {
        **baseline_factories(
            ["bm25", "embedding"], render=render_bullet_line, embed=hashed_embedder()
        ),
        "oracle": lambda: OracleSystem(render_bullet_line),
        "long": LongWinded,
    }
    out = tmp_path / "p.json"
    md = tmp_path / "bench.md"
    report = run_prefeval(
        pref_dir, out, systems, distractor_counts=[2, 4], budgets=[16, 256], markdown_path=md
    )
    res = report["results"]
    assert set(res) == {"bm25", "embedding", "oracle", "long"}
    assert set(res["bm25"]) == {"N2_B16", "N2_B256", "N4_B16", "N4_B256"}
    cell = res["bm25"]["N4_B256"]
    assert cell["n"] == 9 and set(cell["by_topic"]) == set(PREF_TOPICS)
    # 5 short lines always fit in 256 tokens: every system that respects the budget hits.
    for name in ("bm25", "embedding", "oracle"):
        assert res[name]["N4_B256"]["overall"] == 1.0
    # The oracle needs one line, so even 16 tokens are enough for it.
    assert res["oracle"]["N4_B16"]["overall"] == 1.0
    # Ignoring the budget costs everything where the text does not fit.
    assert res["long"]["N4_B16"]["overall"] == 0.0
    assert res["long"]["N4_B16"]["over_budget"] == 9
    assert res["long"]["N2_B256"]["overall"] == 1.0
    rows = [json.loads(x) for x in (tmp_path / "p.rows.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 9 * 2 * 2
    assert json.loads(out.read_text())["settings"] == [[2, 16], [2, 256], [4, 16], [4, 256]]
    assert "<!-- bench:prefeval:start -->" in md.read_text()


def test_same_seed_same_numbers(pref_dir: Path) -> None:
    def once(seed: int) -> list[dict]:
        systems = baseline_factories(["bm25"], render=render_bullet_line)
        r = run_prefeval(pref_dir, None, systems, distractor_counts=[3], budgets=[16], seed=seed)
        return r["results"]["bm25"]["N3_B16"]["by_topic"]

    assert once(7) == once(7)


def test_turns_are_captured_in_order(pref_dir: Path) -> None:
    items = load_prefeval(pref_dir)
    turns = as_turns(items[:3])
    assert [t.source_ref for t in turns] == [i.source_ref for i in items[:3]]
    assert turns[0].occurred_at < turns[1].occurred_at < turns[2].occurred_at
    assert turns[0].content == items[0].preference


def test_main_cli(pref_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.json"
    assert (
        main(
            [
                "--data",
                str(pref_dir),
                "--out",
                str(out),
                "--systems",
                "bm25",
                "--distractors",
                "2",
                "--budgets",
                "64",
                "--topics",
                "travel_hotel,entertain_games",
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["data"]["topics"] == ["entertain_games", "travel_hotel"]
    assert "PrefEval-PR@B" in capsys.readouterr().out
