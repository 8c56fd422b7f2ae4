"""Slice latency through the whole service: gate, rank, pack, record, audit.

``uprof bench slice [--memories 5000] [--queries 200] [--runs 3]``: one subject holding
N memories of real conversation text, LoCoMo dev turns (every conversation, in order,
repeated with later dates until N are captured), captured through the public API
(MiniLM embeddings computed by the projection). Then slices at B=1024 for distinct
LoCoMo dev questions, hybrid and lexical-only, and, side by side in the same run over
the same turns and questions, the plain baselines of the retrieval benchmarks
(MiniLM top-k and BM25 from ``benchmarks.baselines``, rendered and packed as there).
Each uprof slice includes identity resolution, the read-your-writes check, the policy,
consent and visibility gate, ranking, packing, and recording the ``SliceServed`` event
and its audit entry: handed to the recorder thread by default (``read_recording=async``),
written before the slice returns as the baseline beside it (``sync``). Reported: p50/p95
per system, the median over ``runs`` rounds, the load average before and after, and the
time spent embedding a query.

``--seeded DIR`` keeps the captured subject in DIR (created and seeded on the first run,
reused as it is on later ones, with the same ``--memories``): capture dominates the run
(about 25 minutes at 20,000 memories), and two versions of the code can then be timed on
the very same stored memories. A reused folder holds no more and no fewer memories than
asked for, or the run stops.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_common import DEFAULT_DATA_DIR, BenchTurn, percentile, run_context
from benchmarks.kernel_bench import deployment
from benchmarks.locomo import load_locomo
from domain.values import Interaction

APP, AGENT, PURPOSE = "app:planner", "agent:bench", "personalization"
BUDGET = 1024
# Each repetition of the dev turns is dated this much later, so the copies are
# distinct events on a plausible timeline (LoCoMo conversations span months).
REPEAT_SHIFT = timedelta(days=3 * 365)


def locomo_turns(data_dir: Path, memories: int) -> list[BenchTurn]:
    """The first ``memories`` turns of the dev conversations, repeated as needed."""
    base = [t for conv in load_locomo(data_dir / "locomo_dev.json") for t in conv.turns]
    turns: list[BenchTurn] = []
    repeat = 0
    while len(turns) < memories:
        for t in base[: memories - len(turns)]:
            turns.append(
                replace(
                    t,
                    source_ref=f"{t.source_ref}#{repeat}",
                    occurred_at=t.occurred_at + repeat * REPEAT_SHIFT,
                )
            )
        repeat += 1
    return turns


def locomo_questions(data_dir: Path, count: int) -> list[str]:
    """Distinct dev questions, in file order (no query is a cache hit by repetition)."""
    seen: dict[str, None] = {}
    for conv in load_locomo(data_dir / "locomo_dev.json"):
        for q in conv.questions:
            seen.setdefault(q.question, None)
    questions = list(seen)
    if len(questions) < count:
        raise ValueError(f"queries: the dev split has only {len(questions)} distinct questions")
    return questions[:count]


def _interaction(turn: BenchTurn) -> Interaction:
    return Interaction(
        app_id=APP,
        agent_id=AGENT,
        occurred_at=turn.occurred_at,
        user_input=turn.content,
        actor=turn.actor,
        session_id=f"s{turn.session}",
        source_ref=turn.source_ref,
        sharing="shared",
    )


def _summary(samples: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p95_ms": round(percentile(samples, 95), 2),
    }


def _median_runs(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}


SEEDED_MARKER = "slice-bench-seeded.json"


@contextmanager
def _seeded_deployment(folder: Path) -> Iterator[Any]:
    """A deployment whose SQLite files live in ``folder`` and stay there after the run."""
    from benchmarks.uprof_system import bench_authorizer
    from uprof.bootstrap import bootstrap
    from uprof.settings import Settings

    settings = Settings(data_dir=folder / "data", embedder="minilm")
    k = bootstrap(settings, authorizer=bench_authorizer(("personalization",)))
    try:
        yield k
    finally:
        k.close()


def serve_bench_slice(
    k: Any, question: str, *, lexical: bool = False, now: datetime | None = None
) -> Any:
    """One slice of the bench subject for the bench app, agent, purpose and budget."""
    return k.slice(
        "bench",
        question,
        budget_tokens=BUDGET,
        purpose=PURPOSE,
        app_id=APP,
        agent_id=AGENT,
        lexical_only=lexical,
        now=now,
    )


class PrecomputedEmbedder:
    """The real embedder, except that each given question's vector is computed once up
    front: a timed hybrid slice then measures everything but embedding the question."""

    dimension = 384

    def __init__(self, real: Any, questions: Sequence[str]) -> None:
        self._real = real
        self._vectors: dict[str, np.ndarray] = {q: real.embed([q]) for q in questions}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 1 and texts[0] in self._vectors:
            return self._vectors[texts[0]]
        return np.asarray(self._real.embed(texts))


@dataclass(frozen=True)
class SeededRun:
    """The command line of a script timing slices on a copy of a seeded folder:
    ``SEEDED N ROUNDS OUT``."""

    seeded: Path
    questions: list[str]
    rounds: int
    out: Path

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> SeededRun:
        """Parse the arguments, read the N questions and pin torch to one thread (the
        service's setting), so every such script measures alike."""
        from benchmarks.baselines import set_torch_threads  # torch loads only to run

        set_torch_threads(1)
        questions = locomo_questions(DEFAULT_DATA_DIR, int(argv[1]))
        return cls(Path(argv[0]), questions, int(argv[2]), Path(argv[3]))

    def header(self) -> dict[str, Any]:
        """The start of the result: what was run, and the load average before it."""
        return {
            "questions": len(self.questions),
            "rounds": self.rounds,
            "load_before": os.getloadavg(),
        }


def write_result(out: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Stamp the load average after the run, write ``result`` to ``out`` and print it."""
    result["load_after"] = os.getloadavg()
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return result


def _seed(k: Any, turns: Sequence[BenchTurn]) -> None:
    k.grant_consent("bench", app_id=APP, categories=["*"], purposes=[PURPOSE])
    for lo in range(0, len(turns), 1_000):
        k.capture_many("bench", [_interaction(t) for t in turns[lo : lo + 1_000]])
    k.process()


def _subject(turns: Sequence[BenchTurn], seeded: Path | None) -> Any:
    """The deployment holding the bench subject: seeded now, or reused from ``seeded``."""
    if seeded is None:
        return _fresh_subject(turns)
    return _reused_subject(turns, seeded)


@contextmanager
def _fresh_subject(turns: Sequence[BenchTurn]) -> Iterator[Any]:
    with deployment("sqlite", embedder="minilm") as k:
        _seed(k, turns)
        yield k


@contextmanager
def _reused_subject(turns: Sequence[BenchTurn], folder: Path) -> Iterator[Any]:
    marker = folder / SEEDED_MARKER
    folder.mkdir(parents=True, exist_ok=True)
    with _seeded_deployment(folder) as k:
        if marker.exists():
            seeded = json.loads(marker.read_text(encoding="utf-8"))
            if seeded["memories"] != len(turns):
                raise ValueError(f"{folder} holds {seeded['memories']} memories, not {len(turns)}")
            k.process()
        else:
            _seed(k, turns)
            marker.write_text(json.dumps({"memories": len(turns)}) + "\n", encoding="utf-8")
        yield k


def run(
    memories: int,
    queries: int,
    runs: int,
    data_dir: Path,
    seeded: Path | None = None,
    dump_contents: Path | None = None,
) -> dict[str, Any]:
    from benchmarks.baselines import BM25System, EmbeddingSystem, minilm_embedder

    turns = locomo_turns(data_dir, memories)
    questions = locomo_questions(data_dir, queries)
    now = max(t.occurred_at for t in turns) + timedelta(days=1)
    result: dict[str, Any] = {
        "memories": memories,
        "text": "LoCoMo dev turns, repeated",
        "queries": queries,
        "runs": runs,
        "budget_tokens": BUDGET,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    if seeded is not None:
        result["seeded"] = "reused" if (seeded / SEEDED_MARKER).exists() else "seeded now"
    with _subject(turns, seeded) as k:
        embedder = k.slice_service._embedder
        embed_ms = []
        for q in questions[:24]:
            began = time.perf_counter()
            embedder.embed([q])
            embed_ms.append((time.perf_counter() - began) * 1000)
        result["query_embedding_p50_ms"] = round(statistics.median(embed_ms), 2)
        if dump_contents is not None:
            dump_contents.parent.mkdir(parents=True, exist_ok=True)
            dump_contents.write_text(
                json.dumps(slice_contents(k, questions, now), indent=1) + "\n", encoding="utf-8"
            )
        if runs == 0:  # seeding, or a contents dump, only
            return result

        baselines = {
            "baseline_minilm_topk": EmbeddingSystem(minilm_embedder()),
            "baseline_bm25": BM25System(),
        }
        for system in baselines.values():
            system.ingest("bench", turns)
            system.slice("bench", "warm-up", BUDGET, now)  # builds its index, as uprof's view

        per_run: dict[str, list[dict[str, float]]] = {}
        for _ in range(runs):
            for recording in ("async", "sync"):
                k.reads.drain()
                k.reads.mode = recording  # the deployment's setting, switched for the baseline
                for mode, lexical in (("hybrid", False), ("lexical_only", True)):
                    name = mode if recording == "async" else f"{mode}_sync_recording"
                    samples = _time_uprof(k, questions, lexical=lexical)
                    per_run.setdefault(name, []).append(_summary(samples))
            for name, system in baselines.items():
                # A fresh query cache each run: every question is embedded once, as uprof does.
                if isinstance(system, EmbeddingSystem):
                    system._queries.clear()
                samples = _time_baseline(system, questions, now)
                per_run.setdefault(name, []).append(_summary(samples))
    for name, rows in per_run.items():
        result[name] = _median_runs(rows) | {"p50_ms_per_run": [r["p50_ms"] for r in rows]}
    result["ratio_hybrid_to_minilm_topk_p50"] = round(
        result["hybrid"]["p50_ms"] / result["baseline_minilm_topk"]["p50_ms"], 3
    )
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def _time_uprof(k: Any, questions: list[str], *, lexical: bool) -> list[float]:
    """Milliseconds per slice, after one warm-up slice (it builds the subject's view)."""

    serve_bench_slice(k, questions[0], lexical=lexical)
    timings = []
    for question in questions:
        began = time.perf_counter()
        serve_bench_slice(k, question, lexical=lexical)
        timings.append((time.perf_counter() - began) * 1000)
    return timings


def slice_contents(k: Any, questions: list[str], now: datetime) -> dict[str, Any]:
    """What each question's slice holds, hybrid and lexical-only: item ids in rendered
    order, the token count, a digest of the text and the left-out report.

    Ranking is measured from a fixed ``now``, so two versions of the code that rank and
    pack alike give equal dumps on copies of one seeded folder (a copy, because every
    served slice counts as a visit and heat reads the visits).
    """
    out: dict[str, Any] = {}
    for mode, lexical in (("hybrid", False), ("lexical_only", True)):
        rows = []
        for question in questions:
            served = serve_bench_slice(k, question, lexical=lexical, now=now)
            rows.append(
                {
                    "question": question,
                    "items": [item.item_id for item in served.items],
                    "n_tokens": served.n_tokens,
                    "text_sha256": hashlib.sha256(served.text.encode("utf-8")).hexdigest(),
                    "left_out": [[lo.item_id, lo.reason] for lo in served.left_out],
                }
            )
        out[mode] = rows
    return out


def _time_baseline(system: Any, questions: list[str], now: datetime) -> list[float]:
    timings = []
    for question in questions:
        began = time.perf_counter()
        system.slice("bench", question, BUDGET, now)
        timings.append((time.perf_counter() - began) * 1000)
    return timings


def main(
    out: Path,
    memories: int,
    queries: int,
    echo: Callable[[str], None],
    runs: int = 3,
    data_dir: Path = DEFAULT_DATA_DIR,
    seeded: Path | None = None,
    dump_contents: Path | None = None,
) -> dict[str, Any]:
    result = run(memories, queries, runs, data_dir, seeded, dump_contents)
    if runs == 0:
        return result
    result["measured_at"] = datetime.now(tz=UTC).isoformat(timespec="seconds")
    result["context"] = run_context()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    echo(json.dumps(result, indent=2))
    return result
