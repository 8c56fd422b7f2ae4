"""Where LoCoMo's missed evidence turns are: ranked too low, out of the pool, or not indexed.

``benchmarks.slice_form_gap`` splits PrefEval's losses into steps; this is its LoCoMo
counterpart for the evidence of one category (multi-hop, category 1, by default) at one
budget, over a replay recording (``benchmarks.retrieval_replay --record``). Each question
is answered by ``build_slice`` with the service's options, scored as the harness scores it
(an evidence turn is covered when its text is in the slice or a concise item cites it), and
each evidence turn left out is described by what a later round would need to know first:

* its rank in uprof's memory ranking (``rank_memories``: fusion, neighbour flow, bridges)
  and whether that is inside the packing pool (``pool_size``) or beyond it;
* whether it is a short reply (at most ``SHORT_WORDS`` words: "Yes, at the gym");
* whether the turn it replies to (``MemoryIndex.prev``) ranks better than it, and whether
  that turn is among the first ``CONTEXT_TOP`` (the question-and-answer split that
  contextual vectors address, decision on retrieval round 6);
* whether it shares a proper name (not a speaker's), or any term held by at most
  ``RARE_DF`` memories, with one of the ``SEED_TOP`` best memories (what entity links
  address);
* how many sentences it holds (``memory_sentences``), against the mean of every memory
  of the same conversations: a long turn's whole-text vector is diluted by its other
  sentences (retrieval round 9 measured sentence-level matching against that).

``--variant`` answers with a replay variant's options instead of the service's.

Usage::

    python -m benchmarks.evidence_misses --inputs /tmp/replay.pkl --half tune
    python -m benchmarks.evidence_misses --inputs /tmp/replay.pkl --half tune --show
    python -m benchmarks.evidence_misses --inputs /tmp/replay.pkl --half tune --variant no-bridges
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

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
from uprof.adapters.extraction.text import normalise, split_sentences
from uprof.retrieval import MemoryIndex, ranker
from uprof.retrieval.slices import SliceOptions
from uprof.retrieval.text import terms

SHORT_WORDS = 12
CONTEXT_TOP = 30
SEED_TOP = 10
RARE_DF = 5

_NAME = re.compile(r"(?<![.!?\n:\"\[(])\s+([A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*)")


def proper_names(text: str) -> set[str]:
    """Stemmed terms of the capitalised words inside a sentence ("Sweden", "Harry
    Potter"); a capital that starts a sentence, a quote or a bracket is skipped."""
    found: set[str] = set()
    for match in _NAME.finditer(text):
        found.update(terms(match.group(1)))
    return found


def memory_sentences(text: str) -> list[str]:
    """A memory's sentences as the rule extractor splits a turn (``split_sentences`` of
    the normalised text)."""
    return split_sentences(normalise(text))


def rank_bucket(rank: int, pool_size: int) -> str:
    """A 0-based rank as the table's bucket: inside the pool by fifty, or beyond it."""
    if rank >= pool_size:
        return "outside pool"
    low = (rank // 50) * 50
    return f"pool {low}-{min(low + 49, pool_size - 1)}"


def full_ranking(index: MemoryIndex, got: Any, options: SliceOptions) -> np.ndarray:
    """0-based rank of every memory in uprof's ranking (the pool is its first rows)."""
    ranking = ranker.rank_memories(
        index,
        ranker.analyse_query(got.query),
        got.query_vector,
        got.now,
        replace(options, pool_size=len(index)),
    )
    rank = np.empty(len(index), dtype=np.int64)
    rank[ranking.rows] = np.arange(len(ranking.rows))
    return rank


def question_misses(
    conv: locomo.Conversation,
    q: locomo.Question,
    got: Any,
    index: MemoryIndex,
    options: SliceOptions,
    budget: int,
    counter: Any,
) -> list[dict[str, Any]]:
    """One row per evidence turn the slice left out (empty: the question is a hit)."""
    packed = recorded_slice(got, index, budget, counter, options)
    sl = _bench_slice(packed)
    covered = locomo.verbatim_covered(
        [sl.text], q.evidence, conv.verbatim, conv.verbatim_captioned
    ) | locomo.derived_covered([sl])
    missing = [e for e in q.evidence if e not in covered]
    if not missing:
        return []
    rank = full_ranking(index, got, options)
    seeds = np.argsort(rank)[:SEED_TOP].tolist()
    df = np.diff(index.bm25.weights.indptr)
    vocab = index.bm25.vocabulary
    rows_of = {ref: r for r, c in enumerate(index.candidates) for ref in c.source_refs}
    out: list[dict[str, Any]] = []
    for ref in missing:
        row = rows_of.get(ref)
        if row is None:
            out.append({"ref": ref, "where": "not indexed"})
            continue
        text = index.candidates[row].text
        own_terms = set(terms(text))
        names = proper_names(text)
        seed_rows = [s for s in seeds if s != row]
        rare = {
            t
            for s in seed_rows
            for t in own_terms & set(terms(index.candidates[s].text))
            if t in vocab and df[vocab[t]] <= RARE_DF
        }
        speakers = set().union(*index.actor_terms)
        shared_names = {
            n for s in seed_rows for n in names & proper_names(index.candidates[s].text)
        } - speakers
        prev = int(index.prev[row])
        out.append(
            {
                "ref": ref,
                "where": rank_bucket(int(rank[row]), options.pool_size),
                "rank": int(rank[row]),
                "short": len(text.split()) <= SHORT_WORDS,
                "prev_better": prev >= 0 and rank[prev] < rank[row],
                "prev_top": prev >= 0 and rank[prev] < CONTEXT_TOP,
                "rare_with_seed": sorted(rare),
                "name_with_seed": sorted(shared_names),
                "sentences": len(memory_sentences(text)),
                "text": text,
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=Path, required=True, help="a --record file")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--half", choices=("tune", "check", "full"), default="tune")
    parser.add_argument("--category", type=int, default=1)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--show", action="store_true", help="print every missed turn")
    parser.add_argument("--variant", default="default", help="a retrieval_replay variant spec")
    args = parser.parse_args(argv)
    inputs = load_inputs(args.inputs)["locomo"]
    options = replace(service_options(), **parse_variant(args.variant)[1])
    counter = _counter()
    counts: Counter[str] = Counter()
    sentences = {"missed": 0, "indexed": 0, "all": 0, "memories": 0}
    walk = recorded_questions_by_conversation(args.data, inputs, args.half, args.category, counter)
    for conv, asked, index in walk:
        sentences["all"] += sum(len(memory_sentences(c.text)) for c in index.candidates)
        sentences["memories"] += len(index)
        for q, got in asked:
            rows = question_misses(conv, q, got, index, options, args.budget, counter)
            counts["questions"] += 1
            counts["missed questions"] += bool(rows)
            for row in rows:
                counts["missed turns"] += 1
                counts[row["where"]] += 1
                if "sentences" in row:  # a turn not indexed has none
                    sentences["missed"] += row["sentences"]
                    sentences["indexed"] += 1
                for flag in ("short", "prev_better", "prev_top"):
                    counts[flag] += bool(row.get(flag))
                counts["rare term with a top hit"] += bool(row.get("rare_with_seed"))
                counts["name with a top hit"] += bool(row.get("name_with_seed"))
                if args.show:
                    print(f"{conv.sample_id} q{q.qa_index} {row['ref']}: {row}")
    print(f"{args.half} half, category {args.category}, B={args.budget}:")
    for key, value in sorted(counts.items()):
        print(f"  {key}: {value}")
    if sentences["indexed"] and sentences["memories"]:
        print(
            f"  sentences per missed turn: {sentences['missed'] / sentences['indexed']:.2f} "
            f"(every memory: {sentences['all'] / sentences['memories']:.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
