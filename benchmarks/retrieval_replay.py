"""Ablation replay of the LoCoMo and PrefEval harnesses over recorded slice inputs.

A full harness run pushes every turn (LoCoMo) or every user's 51-201 captures
(PrefEval) through the capture API for each code version: an hour or more per
variant. The ranking and packing code under test only sees ``build_slice``'s
inputs, so this tool records them once and replays ``build_slice`` per variant:

* **record** (``--record``): LoCoMo's dev conversations are ingested in mode S through
  the capture API (``UprofBenchSystem``: consent, extraction, projections, MiniLM),
  and each question is asked once through ``kernel.slice``; the gated inputs handed
  to ``build_slice`` are kept (memories and their vectors, attributes, intents, their
  vectors, the query vector). Each PrefEval preference is captured once, into its own
  subject, and asked its own question, keeping the same inputs.
* **replay**: LoCoMo questions are answered by ``build_slice`` over the recorded
  inputs. PrefEval users are drawn exactly as ``benchmarks.prefeval.evaluate_system``
  draws them (``random.Random(7)`` per N, user by user); a user's subject is the union
  of its events' recorded items, re-timed as the harness times its captures
  (``EPOCH`` + i seconds). Both are scored with the harnesses' own scorers
  (``locomo.score_question``, ``prefeval.is_hit``), and the baselines (BM25, MiniLM
  top-k) run beside them through the harnesses' own ``evaluate_system``.

Each variant's ``build_slice`` calls are timed (``slice_ms`` in the report: p50, p95, and
the median per-slice difference against the ``default`` variant's same slices when it ran
earlier in the process; run a warm-up copy of the default first, so the default is not the
one charged for each index's first use). ``--tables REPORT`` prints the decision records'
ablation tables (tune, check, full) from a ``--out`` report.

Halves: a case goes to the tune half when the first byte of the SHA-256 of its id is
even, else to the check half. The case is the unit the withheld split holds out: the
conversation (LoCoMo ``sample_id``) and the topic (PrefEval file name).

Usage::

    python -m benchmarks.retrieval_replay --record /tmp/replay.pkl   # once per ingestion code
    python -m benchmarks.retrieval_replay --inputs /tmp/replay.pkl --out /tmp/ablation.json \\
        --variants 'default|no-bridges'
    python -m benchmarks.retrieval_replay --tables /tmp/ablation.json \\
        --labels 'default=uprof (main)|no-bridges=bridges off'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np

from benchmarks import locomo, prefeval
from benchmarks.bench_common import DEFAULT_DATA_DIR, BenchSlice, SliceItemRef, count_tokens
from uprof.retrieval import Candidate, MemoryIndex, build_slice
from uprof.retrieval.slices import SliceOptions

LOCOMO_BUDGETS: tuple[int, ...] = (256, 1024, 2048)
#: (N, B) PrefEval settings of the issue's goals.
PREF_SETTINGS: tuple[tuple[int, int], ...] = ((50, 128), (50, 256), (200, 128))
RECORD_BUDGET = 256


def half_of(case_id: str) -> str:
    """``tune`` or ``check``, fixed by the SHA-256 of the case id."""
    return "tune" if hashlib.sha256(case_id.encode("utf-8")).digest()[0] % 2 == 0 else "check"


@dataclass
class SliceInputs:
    """What ``build_slice`` was handed for one question (everything but options, budget)."""

    query: str
    memories: tuple[Candidate, ...]
    memory_vectors: np.ndarray | None
    attributes: tuple[Candidate, ...]
    attribute_vectors: np.ndarray | None
    intents: tuple[Candidate, ...]
    intent_vectors: np.ndarray | None
    query_vector: np.ndarray | None
    now: datetime


@contextmanager
def _recording() -> Iterator[list[SliceInputs]]:
    """Route the service's ``build_slice`` through a recorder for the duration."""
    from uprof.services import slices as service

    seen: list[SliceInputs] = []

    def recorder(**kwargs: Any) -> Any:
        index: MemoryIndex = kwargs["memory_index"]
        seen.append(
            SliceInputs(
                query=kwargs["query"],
                memories=tuple(index.candidates),
                memory_vectors=None if index.vectors is None else index.vectors.copy(),
                attributes=tuple(kwargs["attributes"]),
                attribute_vectors=kwargs.get("attribute_vectors"),
                intents=tuple(kwargs["intents"]),
                intent_vectors=kwargs.get("intent_vectors"),
                query_vector=kwargs["query_vector"],
                now=kwargs["now"],
            )
        )
        return build_slice(**kwargs)  # the function the service module imported

    with patch.object(service, "build_slice", recorder):
        yield seen


def record(
    data_dir: Path, path: Path, progress: Callable[[str], None], embedder: str = "minilm"
) -> None:
    """Ingest both data sets through the capture API once and keep every slice's inputs
    (``embedder``: uprof's model, UPROF_EMBEDDER's values; the baselines keep MiniLM)."""
    from benchmarks.uprof_system import UprofBenchSystem

    convs = locomo.load_locomo(data_dir / "locomo_dev.json")
    items = prefeval.load_prefeval(data_dir / "prefeval" / "explicit_preference")
    out: dict[str, Any] = {"locomo": {}, "prefeval": {}}
    system = UprofBenchSystem(embedder=embedder, torch_threads=1)
    try:
        with _recording() as seen:
            for conv in convs:
                start = time.perf_counter()
                system.ingest(conv.sample_id, list(conv.turns))
                for q in conv.questions:
                    seen.clear()
                    system.slice(conv.sample_id, q.question, RECORD_BUDGET, conv.now)
                    out["locomo"][(conv.sample_id, q.qa_index)] = seen[-1]
                progress(f"locomo {conv.sample_id}: {time.perf_counter() - start:.0f}s")
            start = time.perf_counter()
            for item in items:
                subject = f"pref/{item.source_ref}"
                system.ingest(subject, prefeval.as_turns([item]))
                seen.clear()
                system.slice(subject, item.question, RECORD_BUDGET, prefeval.EPOCH)
                out["prefeval"][item.source_ref] = seen[-1]
                system.forget(subject)
            progress(f"prefeval: {time.perf_counter() - start:.0f}s")
    finally:
        system.close()
    with path.open("wb") as fh:
        pickle.dump(out, fh, protocol=pickle.HIGHEST_PROTOCOL)


class _InputsUnpickler(pickle.Unpickler):
    """Reads a recording whichever module wrote it: run as ``python -m``, the recorder
    pickles its classes as ``__main__``'s, which another entry point does not have."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__" and name == SliceInputs.__name__:
            return SliceInputs
        return super().find_class(module, name)


def load_inputs(path: Path) -> dict[str, Any]:
    """A recording written by ``--record`` (our own file: unpickled as such)."""
    with path.open("rb") as fh:
        loaded: dict[str, Any] = _InputsUnpickler(fh).load()
    return loaded


# ---------------------------------------------------------------- replay


def _counter() -> Any:
    from uprof.adapters.tokens import TiktokenCounter

    return TiktokenCounter()


def _bench_slice(packed: Any) -> BenchSlice:
    return BenchSlice(
        text=packed.text, items=tuple(SliceItemRef(source_refs=c.source_refs) for c in packed.items)
    )


def _index(memories: Sequence[Candidate], vectors: np.ndarray | None, counter: Any) -> MemoryIndex:
    return MemoryIndex.build(memories, vectors, counter)


class TextVectors:
    """Texts embedded at replay time, for a variant that needs vectors the recording does
    not hold (it keeps each question's vector only): ``embed`` (the recording's model:
    ``minilm_embed``) takes one batch per call, as the service embeds a slice's texts in
    one call, and every vector is kept by text across variants and budgets. ``seconds``,
    ``texts`` and ``calls`` count the embedding work done (decision
    0234-retrieval-round-17 embedded each question's sub-queries so)."""

    def __init__(self, embed: Callable[[Sequence[str]], np.ndarray]) -> None:
        self._embed = embed
        self._cache: dict[str, np.ndarray] = {}
        self.seconds = 0.0
        self.texts = 0
        self.calls = 0

    def __call__(self, texts: Sequence[str]) -> np.ndarray | None:
        """One row per text, in order (None for no texts); only unseen texts are embedded."""
        if not texts:
            return None
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            start = time.perf_counter()
            vectors = np.asarray(self._embed(missing), dtype=np.float32)
            self.seconds += time.perf_counter() - start
            self.texts += len(missing)
            self.calls += 1
            self._cache.update(zip(missing, vectors, strict=True))
        return np.stack([self._cache[t] for t in texts])


def minilm_embed(torch_threads: int = 1) -> Callable[[Sequence[str]], np.ndarray]:
    """The product's MiniLM embedder from its local weights (no download), with torch's
    threads set as the product sets them; loaded on first use."""
    from uprof.adapters.embeddings import SentenceEmbedder

    return SentenceEmbedder(torch_threads=torch_threads).embed


def recorded_questions_by_conversation(
    data_dir: Path, inputs: Mapping[Any, Any], half: str, category: int, counter: Any
) -> Iterator[tuple[Any, list[tuple[Any, Any]], MemoryIndex]]:
    """Each dev conversation of ``half`` ("full" for all) holding questions of
    ``category``: the conversation, its questions with their recorded inputs, and the
    memory index built once from the first one's (the diagnosis tools' common walk)."""
    for conv in locomo.load_locomo(data_dir / "locomo_dev.json"):
        if half != "full" and half_of(conv.sample_id) != half:
            continue
        asked = [
            (q, inputs[(conv.sample_id, q.qa_index)])
            for q in conv.questions
            if q.category == category
        ]
        if asked:
            first = asked[0][1]
            yield conv, asked, _index(first.memories, first.memory_vectors, counter)


def recorded_slice(
    got: SliceInputs, index: MemoryIndex, budget: int, counter: Any, options: SliceOptions
) -> Any:
    """``build_slice`` for one recorded question over its conversation's index."""
    return build_slice(
        query=got.query,
        attributes=got.attributes,
        intents=got.intents,
        memory_index=index,
        budget_tokens=budget,
        counter=counter,
        query_vector=got.query_vector,
        now=got.now,
        options=options,
        attribute_vectors=got.attribute_vectors,
        intent_vectors=got.intent_vectors,
    )


def replay_locomo(
    inputs: Mapping[tuple[str, int], SliceInputs],
    convs: Sequence[locomo.Conversation],
    options: SliceOptions,
    budgets: Sequence[int],
    counter: Any,
    indexes: dict[str, MemoryIndex],
    timings: list[float] | None = None,
    half: str = "full",
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for conv in convs:
        if half != "full" and half_of(conv.sample_id) != half:
            continue
        for q in conv.questions:
            got = inputs[(conv.sample_id, q.qa_index)]
            index = indexes.get(conv.sample_id)
            if index is None:
                index = indexes[conv.sample_id] = _index(got.memories, got.memory_vectors, counter)
            for budget in budgets:
                start = time.perf_counter()
                packed = recorded_slice(got, index, budget, counter, options)
                if timings is not None:
                    timings.append(time.perf_counter() - start)
                _, over, union, *_ = locomo.score_question(conv, q, [_bench_slice(packed)], budget)
                rows.append(
                    {
                        "case": conv.sample_id,
                        "category": q.category,
                        "B": budget,
                        "strict": union.strict,
                        "over": over,
                    }
                )
    return rows


def _retimed(candidates: Sequence[Candidate], moment: datetime) -> list[Candidate]:
    return [replace(c, occurred_at=moment) for c in candidates]


def _stack(parts: Sequence[np.ndarray | None], counts: Sequence[int]) -> np.ndarray | None:
    kept = [p for p, n in zip(parts, counts, strict=True) if n]
    if not kept or any(p is None for p in kept):
        return None
    return np.concatenate([np.asarray(p) for p in kept if p is not None], axis=0)


def pref_users(
    items: Sequence[prefeval.PrefItem], n: int
) -> list[tuple[prefeval.PrefItem, list[prefeval.PrefItem]]]:
    """Every user's events exactly as the harness draws them for N = n."""
    rng = random.Random(prefeval.SEED)
    return [(user, prefeval.user_events(user, items, n, rng)) for user in items]


def user_subject(
    events: Sequence[prefeval.PrefItem], inputs: Mapping[str, SliceInputs], counter: Any
) -> tuple[MemoryIndex, list[Candidate], np.ndarray | None, list[Candidate], np.ndarray | None]:
    """One user's subject from its events' recorded items, timed as the harness captures."""
    memories: list[Candidate] = []
    mem_vecs: list[np.ndarray | None] = []
    attrs: list[Candidate] = []
    attr_vecs: list[np.ndarray | None] = []
    intents: list[Candidate] = []
    intent_vecs: list[np.ndarray | None] = []
    counts: dict[str, list[int]] = {"m": [], "a": [], "i": []}
    for i, event in enumerate(events):
        got = inputs[event.source_ref]
        moment = prefeval.EPOCH + timedelta(seconds=i)
        memories += _retimed(got.memories, moment)
        mem_vecs.append(got.memory_vectors)
        counts["m"].append(len(got.memories))
        attrs += _retimed(got.attributes, moment)
        attr_vecs.append(got.attribute_vectors)
        counts["a"].append(len(got.attributes))
        intents += _retimed(got.intents, moment)
        intent_vecs.append(got.intent_vectors)
        counts["i"].append(len(got.intents))
    index = _index(memories, _stack(mem_vecs, counts["m"]), counter)
    return (
        index,
        attrs,
        _stack(attr_vecs, counts["a"]),
        intents,
        _stack(intent_vecs, counts["i"]),
    )


#: When the harness asks PrefEval's questions: the day after the captures.
PREF_NOW = prefeval.EPOCH + timedelta(days=1)


def prefeval_slice(
    user: prefeval.PrefItem,
    subject: Any,
    asked: SliceInputs,
    budget: int,
    options: SliceOptions,
    counter: Any,
) -> Any:
    """``build_slice`` for one PrefEval user over its ``user_subject`` at ``budget``."""
    index, attrs, attr_vecs, intents, intent_vecs = subject
    return build_slice(
        query=user.question,
        attributes=attrs,
        intents=intents,
        memory_index=index,
        budget_tokens=budget,
        counter=counter,
        query_vector=asked.query_vector,
        now=PREF_NOW,
        options=options,
        attribute_vectors=attr_vecs,
        intent_vectors=intent_vecs,
    )


def replay_prefeval(
    inputs: Mapping[str, SliceInputs],
    items: Sequence[prefeval.PrefItem],
    options: SliceOptions,
    settings: Sequence[tuple[int, int]],
    counter: Any,
    subjects: dict[tuple[str, int], Any],
    timings: list[float] | None = None,
    half: str = "full",
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n in sorted({n for n, _ in settings}):
        budgets = [b for m, b in settings if m == n]
        # Every user is drawn, so the other half's draws stay those of the whole run.
        for user, events in pref_users(items, n):
            if half != "full" and half_of(user.topic) != half:
                continue
            key = (user.source_ref, n)
            subject = subjects.get(key)
            if subject is None:
                subject = subjects[key] = user_subject(events, inputs, counter)
            asked = inputs[user.source_ref]
            for budget in budgets:
                start = time.perf_counter()
                packed = prefeval_slice(user, subject, asked, budget, options, counter)
                if timings is not None:
                    timings.append(time.perf_counter() - start)
                sl = _bench_slice(packed)
                over = count_tokens(sl.text) > budget
                rows.append(
                    {
                        "case": user.topic,
                        "N": n,
                        "B": budget,
                        "hit": (not over) and prefeval.is_hit(sl, user),
                        "over": over,
                    }
                )
    return rows


# ---------------------------------------------------------------- baselines


def baseline_rows(
    convs: Sequence[locomo.Conversation],
    items: Sequence[prefeval.PrefItem],
    budgets: Sequence[int],
    settings: Sequence[tuple[int, int]],
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """BM25 and MiniLM top-k through the harnesses' own code, SPEC rendering."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    names = ("bm25", "embedding")
    loco = locomo.default_systems(names, convs)
    pref = prefeval.default_systems(names, items)
    for name in names:
        got = locomo.evaluate_system(name, loco[name], convs, "S", budgets)
        loc_rows = [
            {
                "case": r.sample_id,
                "category": r.category,
                "B": r.budget,
                "strict": r.union.strict,
                "over": r.over_budget,
            }
            for r in got
        ]
        pref_rows: list[dict[str, Any]] = []
        for n in sorted({n for n, _ in settings}):
            bs = [b for m, b in settings if m == n]
            for r in prefeval.evaluate_system(name, pref[name], items, [n], bs):
                pref_rows.append(
                    {"case": r.topic, "N": r.n_distractors, "B": r.budget, "hit": r.hit}
                )
        out[name] = {"locomo": loc_rows, "prefeval": pref_rows}
    return out


# ---------------------------------------------------------------- summaries


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


PARTS: tuple[str, ...] = ("tune", "check", "full")


def summarise(
    locomo_rows: Sequence[dict[str, Any]],
    pref_rows: Sequence[dict[str, Any]],
    parts: Sequence[str] = PARTS,
) -> Any:
    """Per half and full: ER-strict per budget and per category, PrefEval PR per setting
    (``parts``: the halves this run replayed; a run of one half summarises only it)."""
    out: dict[str, Any] = {}
    for part in parts:

        def keep(row: dict[str, Any], part: str = part) -> bool:
            return part == "full" or half_of(row["case"]) == part

        loc = [r for r in locomo_rows if keep(r)]
        pref = [r for r in pref_rows if keep(r)]
        budgets = sorted({r["B"] for r in loc})
        out[part] = {
            "locomo": {
                f"B{b}": {
                    "all": _mean([r["strict"] for r in loc if r["B"] == b]),
                    **{
                        f"cat{c}": _mean(
                            [r["strict"] for r in loc if r["B"] == b and r["category"] == c]
                        )
                        for c in (1, 2, 3, 4)
                    },
                    **{
                        f"n_cat{c}": sum(r["B"] == b and r["category"] == c for r in loc)
                        for c in (1, 2, 3, 4)
                    },
                    "n": sum(r["B"] == b for r in loc),
                    "over": sum(bool(r.get("over")) for r in loc if r["B"] == b),
                }
                for b in budgets
            },
            "prefeval": {
                f"N{n}_B{b}": {
                    "pr": _mean([float(r["hit"]) for r in pref if (r["N"], r["B"]) == (n, b)]),
                    "n": sum((r["N"], r["B"]) == (n, b) for r in pref),
                }
                for n, b in sorted({(r["N"], r["B"]) for r in pref})
            },
        }
    return out


def _weighted(a: Mapping[str, Any], b: Mapping[str, Any], key: str, count: str) -> float:
    """The count-weighted mean of two halves' figures (a half with no rows has NaN)."""
    parts = [(h[key], h[count]) for h in (a, b) if h[count]]
    total = sum(n for _, n in parts)
    return float(sum(v * n for v, n in parts) / total) if total else float("nan")


def full_of_halves(tune: Mapping[str, Any], check: Mapping[str, Any]) -> dict[str, Any]:
    """The full split's summary from two runs' half summaries, each figure weighted by
    its questions (users): what ``summarise`` gives over both halves' rows."""
    locomo_full: dict[str, Any] = {}
    for key, a in tune["locomo"].items():
        b = check["locomo"][key]
        row: dict[str, Any] = {"all": _weighted(a, b, "all", "n")}
        for c in (1, 2, 3, 4):
            row[f"cat{c}"] = _weighted(a, b, f"cat{c}", f"n_cat{c}")
            row[f"n_cat{c}"] = a[f"n_cat{c}"] + b[f"n_cat{c}"]
        row["n"], row["over"] = a["n"] + b["n"], a["over"] + b["over"]
        locomo_full[key] = row
    pref_full = {
        key: {
            "pr": _weighted(a, check["prefeval"][key], "pr", "n"),
            "n": a["n"] + check["prefeval"][key]["n"],
        }
        for key, a in tune["prefeval"].items()
    }
    return {"locomo": locomo_full, "prefeval": pref_full}


def merged_reports(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report from runs of separate halves: each result's halves side by side, and
    its full split from them when both halves are there and no run replayed it whole."""
    merged: dict[str, Any] = {"halves": {}, "results": {}}
    for report in reports:
        merged["halves"].update(report.get("halves", {}))
        for name, result in report["results"].items():
            into = merged["results"].setdefault(name, {})
            for part in PARTS:
                if part in result:
                    into[part] = result[part]
    for result in merged["results"].values():
        if "full" not in result and "tune" in result and "check" in result:
            result["full"] = full_of_halves(result["tune"], result["check"])
    return merged


def slice_times(
    times: Mapping[str, Sequence[float]], default: Mapping[str, Sequence[float]] | None
) -> dict[str, Any]:
    """Median and p95 ms of one variant's ``build_slice`` calls per data set, and the
    median of the per-slice differences against the default variant's same slices when
    it ran earlier in this process (the same slices in the same order)."""
    out: dict[str, Any] = {}
    for part, values in times.items():
        if not values:
            continue
        ms = np.asarray(values) * 1000
        row = {"p50": float(np.median(ms)), "p95": float(np.percentile(ms, 95)), "n": len(ms)}
        base = None if default is None else default.get(part)
        if base is not None and len(base) == len(values):
            row["p50_added_vs_default"] = float(np.median(ms - np.asarray(base) * 1000))
        out[part] = row
    return out


def worst_fall(result: Mapping[str, Any], main: Mapping[str, Any]) -> tuple[float, int, int]:
    """The largest fall of a LoCoMo category's ER-strict against main on one half, over
    every budget: (delta, category, budget); the first of equal deltas in budget order."""
    worst: tuple[float, int, int] | None = None
    for key, row in result["locomo"].items():
        budget = int(key[1:])
        for c in (1, 2, 3, 4):
            delta = row[f"cat{c}"] - main["locomo"][key][f"cat{c}"]
            if worst is None or delta < worst[0] - 1e-12:
                worst = (delta, c, budget)
    return worst if worst is not None else (0.0, 0, 0)


def markdown_tables(
    report: Mapping[str, Any], labels: Mapping[str, str], main: str = "default"
) -> str:
    """The decision records' ablation tables (tune, check, full) from a ``--out`` report.

    ``labels`` maps result names to row labels, in row order; "worst cat Δ" is
    ``worst_fall`` against ``main``'s row of the same half."""
    results = report["results"]
    head = (
        "| variant | B=256 all / mh | B=1024 all / mh | B=2048 all / mh | cat 1/2/3/4 @2048 "
        "| worst cat Δ | N=50, B=128 | N=50, B=256 | N=200, B=128 |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    out: list[str] = []
    for part in PARTS:
        if any(part not in results[name] for name in labels):
            continue
        lines = [f"{part}:", "", head]
        for name, label in labels.items():
            got = results[name][part]
            loc, pref = got["locomo"], got["prefeval"]
            cells = [f"**{label}**" if name == main else label]
            cells += [
                f"{loc[k]['all']:.3f} / {loc[k]['cat1']:.3f}" for k in ("B256", "B1024", "B2048")
            ]
            cells.append("/".join(f"{loc['B2048'][f'cat{c}']:.3f}" for c in (1, 2, 3, 4)))
            if name in (main, "bm25", "embedding"):
                cells.append("")
            else:
                delta, cat, budget = worst_fall(got, results[main][part])
                cells.append(f"{delta:+.3f} (cat {cat}, {budget})")
            cells += [f"{pref[k]['pr']:.3f}" for k in ("N50_B128", "N50_B256", "N200_B128")]
            lines.append("| " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


# ---------------------------------------------------------------- variants


def service_options() -> SliceOptions:
    from uprof.services.slices import SLICE_OPTIONS

    return SLICE_OPTIONS


#: Named variants: overrides of the service's options (the "default" row is the service).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "no-bridges": {"bridge_weight": 0.0},
    "no-neighbours": {"neighbour_weight": 0.0},
    "lexical-0.5": {"lexical_weight": 0.5},
    "lexical-0.3": {"lexical_weight": 0.3},
    "no-mmr": {"mmr_penalty": 0.0},
    # Round 8 (decision 0122-retrieval-round-8): reciprocal rank fusion of the lexical and
    # dense rankings in place of the score fusion, named before the run.
    "rrf": {"fusion": "rrf"},
    "rrf-equal": {"fusion": "rrf", "lexical_weight": 0.5},
    "rrf-equal-k10": {"fusion": "rrf", "lexical_weight": 0.5, "rrf_k": 10.0},
    "rrf-dense": {"fusion": "rrf", "lexical_weight": 0.3},
    # Second pass, named from the tune half's table only (a smaller k came closer).
    "rrf-equal-k3": {"fusion": "rrf", "lexical_weight": 0.5, "rrf_k": 3.0},
    "rrf-k10": {"fusion": "rrf", "rrf_k": 10.0},
}


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """A named variant, or ``name=knob:value;knob:value`` for ad-hoc overrides."""
    if "=" not in spec:
        if spec not in VARIANTS:
            raise ValueError(f"unknown variant {spec!r}; known: {', '.join(VARIANTS)}")
        return spec, VARIANTS[spec]
    name, body = spec.split("=", 1)
    overrides: dict[str, Any] = {}
    for part in body.split(";"):
        knob, value = part.split(":", 1)
        overrides[knob] = json.loads(value)
    return name, overrides


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--record", type=Path, help="ingest and write recorded inputs here")
    parser.add_argument("--inputs", type=Path, help="recorded inputs to replay")
    parser.add_argument("--out", type=Path, help="JSON summaries")
    parser.add_argument("--variants", default="default", help="'|'-separated variant specs")
    parser.add_argument("--baselines", action="store_true", help="run BM25 and MiniLM beside")
    parser.add_argument("--budgets", default=",".join(map(str, LOCOMO_BUDGETS)))
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--embedder", default="minilm", help="uprof's model when recording: minilm or mpnet"
    )
    parser.add_argument("--skip", default="", help="locomo or prefeval to skip")
    parser.add_argument(
        "--half",
        choices=("tune", "check", "full"),
        default="full",
        help="replay only this half's cases (the other half's rows stay empty)",
    )
    parser.add_argument(
        "--tables",
        help="print the ablation tables of these ','-separated --out reports (runs of "
        "separate halves are merged) and stop (rows: --labels)",
    )
    parser.add_argument(
        "--labels", default="", help="'|'-separated name=label rows for --tables (default all)"
    )
    args = parser.parse_args(argv)
    if args.tables:
        report_in = merged_reports(
            [json.loads(Path(p).read_text()) for p in args.tables.split(",") if p]
        )
        pairs = [tuple(p.split("=", 1)) for p in args.labels.split("|") if p]
        labels = dict(pairs) or {n: n for n in report_in["results"]}
        print(markdown_tables(report_in, labels), end="")
        return 0
    from benchmarks.baselines import set_torch_threads

    set_torch_threads(args.torch_threads or None)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.record:
        record(args.data, args.record, progress, embedder=args.embedder)
        return 0
    specs = [s for s in args.variants.split("|") if s]
    if specs and not args.inputs:
        parser.error("replaying variants needs --inputs (written by --record)")
    inputs: dict[str, Any] = {}
    if specs and args.inputs:
        inputs = load_inputs(args.inputs)
    convs = locomo.load_locomo(args.data / "locomo_dev.json")
    items = prefeval.load_prefeval(args.data / "prefeval" / "explicit_preference")
    budgets = [int(b) for b in args.budgets.split(",")]
    counter = _counter()
    report: dict[str, Any] = {"halves": {}, "results": {}}
    for conv in convs:
        report["halves"][conv.sample_id] = half_of(conv.sample_id)
    for topic in dict.fromkeys(i.topic for i in items):
        report["halves"][topic] = half_of(topic)
    if args.baselines:
        start = time.perf_counter()
        for name, rows in baseline_rows(convs, items, budgets, PREF_SETTINGS).items():
            report["results"][name] = summarise(rows["locomo"], rows["prefeval"])
        progress(f"baselines: {time.perf_counter() - start:.0f}s")
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    parts = PARTS if args.half == "full" else (args.half,)
    indexes: dict[str, MemoryIndex] = {}
    subjects: dict[tuple[str, int], Any] = {}
    parsed = [parse_variant(spec) for spec in specs]
    timings: dict[str, dict[str, list[float]]] = {}
    for name, overrides in parsed:
        options = replace(service_options(), **overrides)
        start = time.perf_counter()
        timings[name] = {"locomo": [], "prefeval": []}
        loc = (
            []
            if "locomo" in args.skip
            else replay_locomo(
                inputs["locomo"],
                convs,
                options,
                budgets,
                counter,
                indexes,
                timings[name]["locomo"],
                args.half,
            )
        )
        pref = (
            []
            if "prefeval" in args.skip
            else replay_prefeval(
                inputs["prefeval"],
                items,
                options,
                PREF_SETTINGS,
                counter,
                subjects,
                timings[name]["prefeval"],
                args.half,
            )
        )
        report["results"][name] = summarise(loc, pref, parts)
        report["results"][name]["overrides"] = overrides
        report["results"][name]["slice_ms"] = slice_times(timings[name], timings.get("default"))
        progress(f"{name}: {time.perf_counter() - start:.0f}s")
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    for name, result in report["results"].items():
        for part in (p for p in PARTS if p in result):
            loc = result[part]["locomo"]
            pref = result[part]["prefeval"]
            cells = [f"{k} {v['all']:.3f}/{v['cat1']:.3f}" for k, v in loc.items()]
            cells += [f"{k} {v['pr']:.3f}" for k, v in pref.items()]
            print(f"{name:24s} {part:5s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
