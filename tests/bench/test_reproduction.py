"""The baselines of ``uprof bench prefeval|locomo`` are the SPEC's, pinned on a fixed sample.

Runs the CLI commands themselves (not a side door into the harness) on a small fixed
slice of the real development data, read in place from ``../shared/bench/data`` (never
copied), and compares the recall figures with those measured on that slice when the
baselines were checked against the SPEC's reference tables (decision 0019). A change in
rendering, packing, tokenisation, distractor sampling or scoring moves them: the dated
dialogue line the PrefEval command used to render moves BM25 at N=25, B=256 here from
0.682 to 0.455.

Skipped only when the data folder is absent (it is beside every checkout and in CI).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.baselines import BM25System, EmbeddingSystem
from benchmarks.bench_common import render_bullet_line, render_dialogue_line
from benchmarks.cli import _factories
from uprof.cli.main import app as cli

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "bench" / "data"
PREF_DIR = DATA / "prefeval" / "explicit_preference"
LOCOMO = DATA / "locomo_dev.json"
# The two smallest development topics: 66 users, distractors from the other topic.
TOPICS = ("education_learning_styles", "shop_technology")

pytestmark = pytest.mark.skipif(
    not (PREF_DIR.is_dir() and LOCOMO.is_file()), reason="benchmark data not beside checkout"
)

# Measured on this sample with the harness that reproduces the SPEC (decision 0019).
# The dated dialogue line gives bm25 0.470 / 0.727 / 0.348 / 0.455 and embedding
# N25_B128 0.939; bare preference text gives bm25 N25_B128 0.470, N25_B256 0.697.
PREFEVAL_PINNED = {
    "bm25": {"N10_B128": 0.758, "N10_B256": 1.0, "N25_B128": 0.455, "N25_B256": 0.682},
    "embedding": {"N10_B128": 1.0, "N10_B256": 1.0, "N25_B128": 0.985, "N25_B256": 1.0},
}
LOCOMO_PINNED = {
    "recency": {"256": 0.0, "1024": 0.02},
    "bm25": {"256": 0.387, "1024": 0.553},
    "tfidf": {"256": 0.387, "1024": 0.553},
}


def _run(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output


@pytest.mark.model
def test_prefeval_cli_baselines_render_one_plain_line_per_candidate() -> None:
    """The CLI's baselines render ``- <preference>``, the SPEC's one line per candidate."""
    from benchmarks.prefeval import as_turns, default_systems, load_prefeval

    items = load_prefeval(PREF_DIR, list(TOPICS))[:3]
    factories = _factories("bm25,embedding", 1, lambda names: default_systems(names, items))
    turns = as_turns(items)
    for name in ("bm25", "embedding"):
        system = factories[name]()
        assert isinstance(system, BM25System | EmbeddingSystem)
        system.ingest("u", turns)
        sl = system.slice("u", items[0].question, 10_000, turns[-1].occurred_at)
        assert sl.text.splitlines() == [f"- {i.preference}" for i in items]
        assert sl.text.splitlines() == [render_bullet_line(t) for t in turns]


@pytest.mark.model
def test_locomo_cli_baselines_render_dated_dialogue_lines() -> None:
    from benchmarks.locomo import default_systems, load_locomo

    (conv,) = load_locomo(LOCOMO, None, sample_ids=["conv-26"])
    factories = _factories("bm25", 1, lambda names: default_systems(names, [conv]))
    system = factories["bm25"]()
    system.ingest("c", conv.turns[:2])
    lines = system.slice("c", "anything", 10_000, conv.now).text.splitlines()
    assert lines == [render_dialogue_line(t) for t in conv.turns[:2]]
    assert lines[0].startswith("[1:56 pm on 8 May, 2023] ")


@pytest.mark.model
def test_prefeval_cli_reproduces_pinned_baselines(tmp_path: Path) -> None:
    out = tmp_path / "pr.json"
    _run(
        [
            "bench", "prefeval", "--data", str(PREF_DIR), "--topics", ",".join(TOPICS),
            "--systems", "bm25,embedding", "--distractors", "10,25", "--budgets", "128,256",
            "--out", str(out), "--markdown", str(tmp_path / "b.md"),
        ]
    )  # fmt: skip
    results = json.loads(out.read_text())["results"]
    got = {s: {k: round(v["overall"], 3) for k, v in results[s].items()} for s in results}
    assert got == PREFEVAL_PINNED


@pytest.mark.model
def test_locomo_cli_reproduces_pinned_baselines(tmp_path: Path) -> None:
    out = tmp_path / "er.json"
    _run(
        [
            "bench", "locomo", "--data", str(LOCOMO), "--conversations", "conv-26",
            "--systems", "recency,bm25,tfidf", "--budgets", "256,1024",
            "--out", str(out), "--markdown", str(tmp_path / "b.md"),
        ]
    )  # fmt: skip
    results = json.loads(out.read_text())["results"]
    got = {
        s: {b: round(cell["verbatim"]["strict"], 3) for b, cell in results[s]["S"].items()}
        for s in results
    }
    assert got == LOCOMO_PINNED
