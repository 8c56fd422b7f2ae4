"""PrefEval preference recall under distractors (PrefEval-PR@B), SPEC section 2.

Each PrefEval item is one synthetic user: the stated preference is captured
together with N distractors (preferences of users from other topics), in a
shuffled order; the later question is then asked at budget B. A hit is the
preference text inside the slice, or a concise slice item citing the preference
event. Questions rarely share words with their preference, so this separates
semantic from lexical retrieval.

Usage::

    python -m benchmarks.prefeval --data ../shared/bench/data/prefeval/explicit_preference \\
        --out /tmp/prefeval.json --systems bm25,embedding
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.baselines import baseline_factories, set_torch_threads, torch_thread_count
from benchmarks.bench_common import (
    DEFAULT_DATA_DIR,
    BenchSlice,
    BenchSystem,
    BenchTurn,
    Forgetful,
    GoldAware,
    SystemFactory,
    count_tokens,
    mean,
    normalise_text,
    percentile,
    render_bullet_line,
    run_context,
)

DISTRACTOR_COUNTS: tuple[int, ...] = (10, 50, 200)
BUDGETS: tuple[int, ...] = (128, 256, 512)
SEED = 7
# The LoCoMo rule against summaries, applied here too: an item citing the
# preference among many events is not evidence that the preference was surfaced.
MAX_DERIVED_REFS = 3
DEFAULT_SYSTEMS = ("bm25", "embedding")
# Captures need timestamps; a fixed epoch keeps runs identical.
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
ACTOR = "user"


@dataclass(frozen=True)
class PrefItem:
    """One synthetic user: a stated preference and the question that depends on it."""

    topic: str
    index: int
    preference: str
    question: str

    @property
    def source_ref(self) -> str:
        """Provenance of the captured preference; unique across all topics."""
        return f"pref:{self.topic}:{self.index}"


def preference_dir(data_path: Path) -> Path:
    """Accept the topic folder itself, ``prefeval/`` or the data root."""
    for candidate in (
        data_path,
        data_path / "explicit_preference",
        data_path / "prefeval" / "explicit_preference",
    ):
        if candidate.is_dir() and any(candidate.glob("*.json")):
            return candidate
    raise FileNotFoundError(f"no PrefEval topic files under {data_path}")


def load_prefeval(data_path: Path | str, topics: Sequence[str] | None = None) -> list[PrefItem]:
    """All items of the topic files present (any subset of PrefEval's 20), by topic name."""
    folder = preference_dir(Path(data_path))
    items: list[PrefItem] = []
    for path in sorted(folder.glob("*.json")):
        if topics and path.stem not in topics:
            continue
        for i, raw in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            items.append(PrefItem(path.stem, i, raw["preference"], raw["question"]))
    return items


def user_events(
    user: PrefItem, pool: Sequence[PrefItem], n_distractors: int, rng: random.Random
) -> list[PrefItem]:
    """The preference plus N distractors from other topics, shuffled.

    Draws from ``rng`` in a fixed order (sample, then shuffle), so a run is
    reproducible from the seed alone.
    """
    others = [p for p in pool if p.topic != user.topic]
    if n_distractors > len(others):
        raise ValueError(f"{n_distractors} distractors requested, {len(others)} available")
    events = [user, *rng.sample(others, n_distractors)]
    rng.shuffle(events)
    return events


def as_turns(events: Sequence[PrefItem]) -> list[BenchTurn]:
    """Captured events: one per stated preference, a second apart."""
    return [
        BenchTurn(
            source_ref=e.source_ref,
            actor=ACTOR,
            content=e.preference,
            occurred_at=EPOCH + timedelta(seconds=i),
            session=1,
        )
        for i, e in enumerate(events)
    ]


def is_hit(sl: BenchSlice, user: PrefItem, max_refs: int = MAX_DERIVED_REFS) -> bool:
    """Preference text in the slice (normalised), or a concise item citing it."""
    if normalise_text(user.preference) in normalise_text(sl.text):
        return True
    return any(
        user.source_ref in item.source_refs and len(set(item.source_refs)) <= max_refs
        for item in sl.items
    )


@dataclass(frozen=True)
class PrefResult:
    """One row: a user, a distractor count, a budget, a system."""

    topic: str
    index: int
    n_distractors: int
    budget: int
    system: str
    n_tokens: int
    over_budget: bool
    hit: bool
    latency_ms: float

    def row(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "index": self.index,
            "N": self.n_distractors,
            "B": self.budget,
            "system": self.system,
            "n_tokens": self.n_tokens,
            "over_budget": self.over_budget,
            "hit": self.hit,
        }


def evaluate_system(
    name: str,
    factory: SystemFactory,
    items: Sequence[PrefItem],
    counts: Sequence[int],
    budgets: Sequence[int],
    seed: int = SEED,
) -> list[PrefResult]:
    """All users at every N and B for one system.

    One ``random.Random(seed)`` per N, consumed user by user in topic order, so each
    setting's distractor sets do not depend on which other settings are run.
    """
    system: BenchSystem = factory()
    out: list[PrefResult] = []
    for n in counts:
        rng = random.Random(seed)
        for user in items:
            events = user_events(user, items, n, rng)
            subject = f"{user.topic}/{user.index}/N{n}"
            system.ingest(subject, as_turns(events))
            now = EPOCH + timedelta(days=1)
            for budget in budgets:
                if isinstance(system, GoldAware):
                    system.set_gold(subject, user.question, (user.source_ref,))
                start = time.perf_counter()
                sl = system.slice(subject, user.question, budget, now)
                elapsed = (time.perf_counter() - start) * 1000.0
                n_tokens = count_tokens(sl.text)
                over = n_tokens > budget
                hit = (not over) and is_hit(sl, user)
                out.append(
                    PrefResult(
                        user.topic, user.index, n, budget, name, n_tokens, over, hit, elapsed
                    )
                )
            if isinstance(system, Forgetful):
                system.forget(subject)
    return out


def summarise(results: Sequence[PrefResult], topics: Sequence[str]) -> dict[str, Any]:
    """Overall (micro over users), per topic, and macro over topics."""
    by_topic = {t: mean([float(r.hit) for r in results if r.topic == t]) for t in topics}
    present = [v for v in by_topic.values() if v == v]  # skip NaN (topic absent)
    latencies = [r.latency_ms for r in results]
    return {
        "overall": mean([float(r.hit) for r in results]),
        "macro": mean(present),
        "by_topic": by_topic,
        "n": len(results),
        "mean_tokens": mean([r.n_tokens for r in results]),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "over_budget": sum(r.over_budget for r in results),
    }


# SPEC section 2: "one line per candidate", the preference text as-is. Not the
# LoCoMo dialogue line: a "[date] user:" prefix costs 16 tokens per candidate
# and dilutes BM25 and MiniLM (it cost them 0.11 and 0.04 at N=50, B=256).
CANDIDATE_RENDER = render_bullet_line


def default_systems(names: Sequence[str], items: Sequence[PrefItem]) -> dict[str, SystemFactory]:
    """The named baselines with the SPEC rendering; the embedder is warmed with
    every candidate line up front (candidates are what gets ingested). Every entry
    point (this module's CLI, ``uprof bench prefeval``, tests) builds them here."""

    def warm() -> list[str]:
        return [CANDIDATE_RENDER(t) for t in as_turns(items)]

    return baseline_factories(names, render=CANDIDATE_RENDER, warm_texts=warm)


def run_prefeval(
    data_path: Path | str = DEFAULT_DATA_DIR / "prefeval" / "explicit_preference",
    out_path: Path | str | None = None,
    systems: Mapping[str, SystemFactory] | None = None,
    distractor_counts: Sequence[int] = DISTRACTOR_COUNTS,
    budgets: Sequence[int] = BUDGETS,
    markdown_path: Path | str | None = None,
    rows_path: Path | str | None = None,
    topics: Sequence[str] | None = None,
    seed: int = SEED,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run PrefEval-PR@B for every system at every (N, B); return the results dict.

    ``results[system]["N<n>_B<b>"] = {overall, macro, by_topic, n, mean_tokens,
    p50_ms, p95_ms, over_budget}``. Baselines default to BM25 and MiniLM top-k with
    one plain line per candidate; pass ``{"uprof": ...}`` (plus baselines) to
    measure the service beside them.
    """
    items = load_prefeval(data_path, topics)
    if not items:
        raise ValueError("no PrefEval items selected")
    topic_names = list(dict.fromkeys(i.topic for i in items))
    systems = systems if systems is not None else default_systems(DEFAULT_SYSTEMS, items)
    report: dict[str, Any] = {
        "benchmark": "PrefEval-PR@B",
        "data": {
            "path": str(data_path),
            "topics": topic_names,
            "n_users": len(items),
            "users_by_topic": {t: sum(i.topic == t for i in items) for t in topic_names},
        },
        "seed": seed,
        "distractor_counts": list(distractor_counts),
        "budgets": list(budgets),
        "settings": [[n, b] for n in distractor_counts for b in budgets],
        "max_derived_refs": MAX_DERIVED_REFS,
        "systems": list(systems),
        "run": {**run_context(), "torch_threads": {}},
        "results": {},
        "run_seconds": {},
    }
    rows: list[PrefResult] = []
    for name, factory in systems.items():
        start = time.perf_counter()
        got = evaluate_system(name, factory, items, distractor_counts, budgets, seed)
        report["run_seconds"][name] = time.perf_counter() - start
        report["run"]["torch_threads"][name] = torch_thread_count()
        rows.extend(got)
        report["results"][name] = {
            f"N{n}_B{b}": summarise(
                [r for r in got if r.n_distractors == n and r.budget == b], topic_names
            )
            for n in distractor_counts
            for b in budgets
        }
        report["run"]["load_avg_end"] = run_context()["load_avg"]
        # Written after every system: a long run shows its finished systems early,
        # and the table marks the ones still missing.
        _write_outputs(report, rows, out_path, rows_path, markdown_path)
        if progress:
            progress(f"{name}: {report['run_seconds'][name]:.1f}s")
    return report


def _write_outputs(
    report: dict[str, Any],
    rows: Sequence[PrefResult],
    out_path: Path | str | None,
    rows_path: Path | str | None,
    markdown_path: Path | str | None,
) -> None:
    from benchmarks.report import prefeval_markdown, write_markdown_section

    if out_path is not None:
        out = Path(out_path)
        if rows_path is None:
            rows_path = out.with_name(out.stem + ".rows.jsonl")
        report["rows_path"] = str(rows_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if rows_path is not None:
        path = Path(rows_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r.row()) + "\n")
    if markdown_path is not None:
        write_markdown_section(Path(markdown_path), "prefeval", prefeval_markdown(report))


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the baselines and print the summary table."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.prefeval", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA_DIR / "prefeval" / "explicit_preference"
    )
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    parser.add_argument(
        "--rows", type=Path, default=None, help="rows JSONL (default <out>.rows.jsonl)"
    )
    parser.add_argument("--markdown", type=Path, default=None, help="Markdown file to update")
    parser.add_argument("--systems", type=_str_list, default=list(DEFAULT_SYSTEMS))
    parser.add_argument("--distractors", type=_int_list, default=list(DISTRACTOR_COUNTS))
    parser.add_argument("--budgets", type=_int_list, default=list(BUDGETS))
    parser.add_argument("--topics", type=_str_list, default=None, help="topic file stems")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="torch intra-op threads (0: leave as is)"
    )
    args = parser.parse_args(argv)
    set_torch_threads(args.torch_threads or None)

    from benchmarks.report import prefeval_markdown

    items = load_prefeval(args.data, args.topics)
    report = run_prefeval(
        data_path=args.data,
        out_path=args.out,
        systems=default_systems(args.systems, items),
        distractor_counts=args.distractors,
        budgets=args.budgets,
        markdown_path=args.markdown,
        rows_path=args.rows,
        topics=args.topics,
        seed=args.seed,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    print(prefeval_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
