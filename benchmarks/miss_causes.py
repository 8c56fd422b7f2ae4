"""Why each missed LoCoMo evidence turn is not in the slice, read from the slice's own report.

``benchmarks.evidence_misses`` describes a missed turn (rank bucket, short reply, shared
names); this tool assigns each missed turn of one category (multi-hop, category 1, by
default) at one or more budgets exactly one cause, over a replay recording
(``benchmarks.retrieval_replay --record``), and for causes that lie in the ranking names
the ranker term responsible. Each question is answered by ``build_slice`` with the
service's options (or ``--variant``'s) and scored as the harness scores it. A missed turn's
memory is looked up in the slice's left-out report (``PackedSlice.left_out``):

* ``not indexed``: no memory cites the turn;
* ``packed, not matched``: its memory is in the slice but the harness did not count it;
* ``outside pool``: never retrieved (ranked below ``pool_size``);
* ``low relevance``: in the pool with a utility below ``min_utility``;
* ``duplicate``: left out as a near-duplicate of a chosen item;
* left out for ``budget``, split by replaying the packer's steps (``PackProblem`` as the
  builder made it, ``packer._Packing``, the same greedy):

  - ``budget: did not fit``: at some step its gain beat the item taken, so only its cost
    kept it out;
  - ``marginal relevance``: its gain never beat the item taken, but its undiscounted
    utility did at some step (the MMR discount for resembling chosen items cost it);
  - ``ranked too low``: its utility never beat the item taken at any step: the budget went
    to memories the ranker put above it.

For ``ranked too low`` and ``outside pool`` the ranker term is named: the memory's final
relevance is decomposed into lexical share, dense share, speaker, recency and heat,
neighbour flow and bridges (their sum is checked against the ranker's relevance), the gap
to each packed memory ranked above it is split the same way, and the term with the largest
mean contribution to the gap is the cause.

Usage::

    python -m benchmarks.miss_causes --inputs /tmp/replay.pkl --half tune --budgets 1024,2048
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np

from benchmarks import locomo
from benchmarks.bench_common import DEFAULT_DATA_DIR
from benchmarks.retrieval_replay import (
    _bench_slice,
    _counter,
    load_inputs,
    parse_variant,
    recorded_questions_by_conversation,
    recorded_slice,
    service_options,
)
from uprof.retrieval import MemoryIndex, builder, packer, ranker
from uprof.retrieval.index import epoch_seconds
from uprof.retrieval.slices import SliceOptions

TERMS: tuple[str, ...] = ("lexical", "dense", "speaker", "recency/heat", "neighbours", "bridges")
#: Causes in table order (a question's cause is its first missed turn's in this order).
CAUSES: tuple[str, ...] = (
    "not indexed",
    "outside pool",
    "low relevance",
    "ranked too low",
    "marginal relevance",
    "budget: did not fit",
    "duplicate",
    "packed, not matched",
)


@dataclass(frozen=True)
class Terms:
    """Every memory's relevance split into the ranker's terms, (n,) each."""

    parts: dict[str, np.ndarray]
    relevance: np.ndarray  # the ranker's final relevance (sum of the parts)


def relevance_terms(index: MemoryIndex, got: Any, options: SliceOptions) -> Terms:
    """The ranker's relevance of every memory, split by term.

    Recomputes ``memory_relevance``'s fusion term by term (score fusion, no feedback:
    the service's options) and checks the sum against the ranker's own functions."""
    if options.fusion != "score" or options.feedback_weight > 0:
        raise ValueError("the split covers score fusion without feedback only")
    query = ranker.analyse_query(got.query)
    fused, weight, _ = ranker.memory_relevance(index, query, got.query_vector, got.now, options)
    named, name_terms = ranker._query_actors(index, query)
    lexical_terms = [t for t in query.terms if t not in name_terms]
    lexical = index.bm25_scores(lexical_terms).astype(np.float64)
    if lexical.max(initial=0.0) > 0:
        lexical = np.clip(lexical / index.ideal_bm25(lexical_terms), 0.0, 1.0)
    n = len(index)
    dense = np.zeros(n)
    if index.vectors is not None and got.query_vector is not None:
        q = np.asarray(got.query_vector, dtype=np.float32).reshape(-1)
        cosines = ranker._cosines(index.vectors, q)
        dense = ranker.DenseScale.of(cosines)(cosines).astype(np.float64)
    else:
        weight = 1.0
    speaker = np.zeros(n)
    if named.any():
        speaker = options.actor_weight * (
            (index.actor_of >= 0) & named[np.maximum(index.actor_of, 0)]
        )
    age_days = np.maximum(epoch_seconds(got.now) - index.timestamps, 0.0) / 86_400.0
    recency = options.recency_weight * np.nan_to_num(
        np.exp2(-age_days / options.recency_half_life_days), nan=0.0
    )
    own = {
        "lexical": weight * lexical,
        "dense": (1.0 - weight) * dense,
        "speaker": speaker.astype(np.float64),
        "recency/heat": recency + options.heat_weight * index.heat,
    }
    total = sum(own.values())
    assert np.allclose(total, fused, atol=1e-4), "term split does not match the fusion"
    lifted = ranker._with_neighbours(index, fused, options.neighbour_weight)
    final = ranker._with_bridges(index, lifted, options)
    parts = {
        **own,
        "neighbours": lifted.astype(np.float64) - fused.astype(np.float64),
        "bridges": final.astype(np.float64) - lifted.astype(np.float64),
    }
    return Terms(parts, final.astype(np.float64))


def gap_term(terms: Terms, row: int, above: Sequence[int]) -> str:
    """The term with the largest mean contribution to the gap between the memories
    ``above`` and memory ``row``."""
    if not above:
        return "none above"
    rows = np.asarray(above, dtype=np.int64)
    means = {name: float(np.mean(part[rows] - part[row])) for name, part in terms.parts.items()}
    return max(TERMS, key=lambda name: means[name])


@dataclass
class PackTrace:
    """The builder's choices and packing problem, and per step the gains and the taken."""

    choices: list[Any]
    problem: packer.PackProblem | None = None
    steps: list[tuple[np.ndarray, np.ndarray, int]] | None = None  # (gains, eligible, taken)


def _traced_pack(trace: PackTrace) -> Any:
    """``packer.pack`` with every step's gains kept (the same greedy, step for step)."""

    def traced(problem: packer.PackProblem) -> packer.PackResult:
        trace.problem, trace.steps = problem, []
        if len(problem.costs) == 0 or problem.budget <= 0:
            return packer.PackResult((), 0, {})
        state = packer._Packing(problem)
        limit = problem.max_chosen
        while limit is None or len(state.chosen) < limit:
            gains = state.gains()
            eligible = state.available & (gains > 0) & ~state.duplicates()
            ok = eligible & (state.extra <= state.room())
            if not ok.any():
                break
            best = int(np.argmax(np.where(ok, gains, -np.inf)))
            trace.steps.append((gains.copy(), eligible.copy(), best))
            state.take(best)
        return packer.PackResult(tuple(state.chosen), state.spent, packer._duplicates(state))

    return traced


def traced_slice(got: Any, index: MemoryIndex, budget: int, counter: Any, options: Any) -> Any:
    trace = PackTrace(choices=[])
    original = builder._problem

    def keep_choices(choices: list[Any], *args: Any) -> packer.PackProblem:
        trace.choices = choices
        return original(choices, *args)

    with (
        patch.object(builder, "_problem", keep_choices),
        patch.object(builder, "pack", _traced_pack(trace)),
    ):
        packed = recorded_slice(got, index, budget, counter, options)
    return packed, trace


def budget_cause(trace: PackTrace, j: int) -> str:
    """Why choice j, left out for budget, was never taken (see the module docstring)."""
    assert trace.problem is not None and trace.steps is not None
    utility = trace.problem.utility
    beaten_by_utility = False
    for gains, eligible, taken in trace.steps:
        if eligible[j] and gains[j] > gains[taken]:
            return "budget: did not fit"
        if eligible[j] and utility[j] > gains[taken]:
            beaten_by_utility = True
    return "marginal relevance" if beaten_by_utility else "ranked too low"


def missed_turns(
    conv: locomo.Conversation,
    q: locomo.Question,
    got: Any,
    index: MemoryIndex,
    options: SliceOptions,
    budget: int,
    counter: Any,
) -> list[dict[str, Any]]:
    """One row per evidence turn the slice left out, with its cause (empty: a hit)."""
    packed, trace = traced_slice(got, index, budget, counter, options)
    sl = _bench_slice(packed)
    covered = locomo.verbatim_covered(
        [sl.text], q.evidence, conv.verbatim, conv.verbatim_captioned
    ) | locomo.derived_covered([sl])
    missing = [e for e in q.evidence if e not in covered]
    if not missing:
        return []
    reasons = {lo.item_id: lo.reason for lo in packed.left_out}
    in_slice = {c.item_id for c in packed.items}
    choice_of_row = {c.memory_row: j for j, c in enumerate(trace.choices) if c.memory_row >= 0}
    packed_rows = [c.memory_row for c in trace.choices if c.candidate.item_id in in_slice]
    packed_rows = [r for r in packed_rows if r >= 0]
    terms = relevance_terms(index, got, options)
    rows_of = {ref: r for r, c in enumerate(index.candidates) for ref in c.source_refs}
    out: list[dict[str, Any]] = []
    for ref in missing:
        row = rows_of.get(ref)
        if row is None:
            out.append({"ref": ref, "cause": "not indexed", "term": ""})
            continue
        item_id = index.candidates[row].item_id
        reason = reasons.get(item_id)
        if item_id in in_slice:
            cause = "packed, not matched"
        elif reason == "budget":
            cause = budget_cause(trace, choice_of_row[row])
        elif reason == "duplicate":
            cause = "duplicate"
        elif _outside(packed, item_id):
            cause = "outside pool"
        elif reason == "low_relevance":
            cause = "low relevance"
        else:
            raise AssertionError(f"{item_id} is neither in the slice nor in its report")
        term = ""
        if cause in ("ranked too low", "outside pool"):
            above = [r for r in packed_rows if terms.relevance[r] > terms.relevance[row]]
            term = gap_term(terms, row, above)
        out.append(
            {
                "ref": ref,
                "cause": cause,
                "term": term,
                "rank": int(np.sum(terms.relevance > terms.relevance[row])),
                "lexical": float(terms.parts["lexical"][row]),
                "dense": float(terms.parts["dense"][row]),
            }
        )
    return out


def _outside(packed: Any, item_id: str) -> bool:
    return any(lo.item_id == item_id for lo in packed.not_retrieved)


def tabulate(
    rows: Sequence[tuple[str, int, int, list[dict[str, Any]]]], budget: int
) -> dict[str, Any]:
    """Counts of one budget's missed turns and questions by cause, and of terms."""
    mine = [r for r in rows if r[2] == budget]
    turns: Counter[str] = Counter()
    questions: Counter[str] = Counter()
    by_term: Counter[str] = Counter()
    for _, _, _, missed in mine:
        if not missed:
            continue
        causes = [m["cause"] for m in missed]
        turns.update(causes)
        questions[min(causes, key=CAUSES.index)] += 1
        by_term.update(f"{m['cause']}: {m['term']}" for m in missed if m["term"])
    return {
        "questions": len(mine),
        "missed questions": sum(bool(m) for *_, m in mine),
        "missed turns": sum(turns.values()),
        "turns by cause": dict(turns),
        "questions by first cause": dict(questions),
        "turns by cause and term": dict(by_term),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=Path, required=True, help="a --record file")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--half", choices=("tune", "check", "full"), default="tune")
    parser.add_argument("--category", type=int, default=1)
    parser.add_argument("--budgets", default="1024,2048")
    parser.add_argument("--show", action="store_true", help="print every missed turn")
    parser.add_argument("--variant", default="default", help="a retrieval_replay variant spec")
    args = parser.parse_args(argv)
    inputs = load_inputs(args.inputs)["locomo"]
    options = replace(service_options(), **parse_variant(args.variant)[1])
    budgets = [int(b) for b in args.budgets.split(",")]
    counter = _counter()
    rows: list[tuple[str, int, int, list[dict[str, Any]]]] = []
    walk = recorded_questions_by_conversation(args.data, inputs, args.half, args.category, counter)
    for conv, asked, index in walk:
        for q, got in asked:
            for budget in budgets:
                missed = missed_turns(conv, q, got, index, options, budget, counter)
                rows.append((conv.sample_id, q.qa_index, budget, missed))
                if args.show:
                    for m in missed:
                        print(f"{conv.sample_id} q{q.qa_index} B={budget} {m}")
    for budget in budgets:
        table = tabulate(rows, budget)
        print(f"{args.half} half, category {args.category}, B={budget}:")
        for key, value in table.items():
            if isinstance(value, dict):
                print(f"  {key}:")
                for name, count in sorted(value.items(), key=lambda kv: -kv[1]):
                    print(f"    {name}: {count}")
            else:
                print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
