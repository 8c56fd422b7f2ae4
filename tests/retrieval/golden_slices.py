"""Slices of a fixed synthetic subject, to compare two versions of the retrieval code.

``python -m tests.retrieval.golden_slices OUT.json`` writes, for every (query, budget,
mode) case, what the slice holds: item ids in rendered order, the token count, a digest
of the text and a digest of the left-out report. ``slices_golden.json`` beside this file
was written by the code before the latency work of decision 0041-slice-latency-round-2;
``test_golden_slices.py`` checks that today's code still produces exactly those slices.
A speed-up that changes what a slice holds has to say so and regenerate the file.

The subject is generated from a seeded random generator (no file, no model): memories
of two speakers over many days, attributes and intents with every kind of mark, and
vectors from the deterministic hashing embedder.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from domain.values import Layer, Provenance
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.tokens import TiktokenCounter
from uprof.retrieval import Candidate, MemoryIndex, SliceOptions, build_slice

GOLDEN = Path(__file__).with_name("slices_golden.json")
T0 = datetime(2023, 1, 2, 9, 0, tzinfo=UTC)
NOW = datetime(2024, 6, 1, tzinfo=UTC)
WORDS = (
    "pottery camping swimming painting guitar hiking garden kids school job office "
    "promotion wedding sister brother mother father dog cat museum library beach lake "
    "mountain trip flight hotel concert book novel movie recipe dinner lunch coffee tea "
    "marathon running yoga church gym friends party birthday gift adoption agency "
    "counselling career teacher nurse engineer charity veterans volunteering shelter "
    "paris tokyo london spring summer autumn winter may june july 2022 2023 car bike "
    "bakery orchard castle meadow harbour station violin piano lessons exam degree"
).split()
QUERIES = (
    "What activities does Melanie do for fun?",
    "When did Caroline go to the adoption agency?",
    "What instrument does Melanie play?",
    "Where did they travel in summer 2023?",
    "What does Caroline think about her career as a counsellor?",
    "Which books has Melanie read recently?",
    "What did the kids do at the beach?",
    "Who is coming to the birthday party?",
    "What charity work does Caroline volunteer for?",
    "How is the marathon training going?",
    "What happened in May 2022?",
    "Does Melanie like the museum or the library more?",
)
BUDGETS = (256, 1024)


def _sentence(rng: random.Random) -> str:
    n = rng.randint(4, 40)
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def subject() -> tuple[list[Candidate], list[Candidate], list[Candidate]]:
    """Memories, attributes and intents of the synthetic subject."""
    rng = random.Random(20261203)
    memories: list[Candidate] = []
    at = T0
    for i in range(1_200):
        at += timedelta(minutes=rng.choice((1, 2, 5, 45, 600, 2_000)))
        text = _sentence(rng)
        if i % 97 == 0:
            text = memories[-1].text if memories else text  # a repeated turn
        memories.append(
            Candidate(
                item_id=f"m{i:04d}",
                layer=Layer.MEMORY,
                category=rng.choice(("conversation", "conversation", "hobbies", "work")),
                text=text,
                confidence=1.0 if i % 13 else 0.6,
                provenance=Provenance.EXPLICIT if i % 17 else Provenance.INFERRED,
                evidence=(f"ev{i // 2}",),  # two memories per capture now and then
                source_refs=(f"D{i // 50}:{i % 50}",),
                occurred_at=None if i % 211 == 0 else at,
                actor=("Caroline", "Melanie", "")[i % 3 if i % 29 else 2],
                heat=rng.random() if i % 5 == 0 else 0.0,
            )
        )
    attributes = [
        Candidate(
            item_id=f"a{i:03d}",
            layer=Layer.ATTRIBUTE,
            category=rng.choice(("hobbies", "occupation", "family", "likes", "location")),
            text=f"{rng.choice(WORDS)}: {' '.join(rng.choice(WORDS) for _ in range(3))}",
            confidence=rng.choice((0.95, 0.7, 0.4)),
            provenance=rng.choice(list(Provenance)),
            evidence=(f"ev{rng.randrange(600)}",),
            source_refs=(),
            occurred_at=None,
            status=rng.choice(("current", "current", "conflicting")),
        )
        for i in range(60)
    ]
    intents = [
        Candidate(
            item_id=f"i{i:03d}",
            layer=Layer.INTENT,
            category=rng.choice(("goal", "plan", "task")),
            text=_sentence(rng) + " " + _sentence(rng),
            confidence=rng.choice((0.9, 0.6)),
            provenance=Provenance.EXPLICIT,
            evidence=(f"ev{rng.randrange(600)}",),
            source_refs=(),
            occurred_at=None,
            status=rng.choice(("active", "active", "active", "done")),
        )
        for i in range(40)
    ]
    return memories, attributes, intents


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value).encode("utf-8")).hexdigest()


def slices() -> dict[str, Any]:
    """Every case's slice contents, keyed by case name."""
    memories, attributes, intents = subject()
    embedder = HashingEmbedder()
    counter = TiktokenCounter()
    vectors = embedder.embed([m.text for m in memories])
    attribute_vectors = embedder.embed([a.text for a in attributes])
    intent_vectors = embedder.embed([i.text for i in intents])
    index = MemoryIndex.build(memories, vectors, counter)
    lexical_index = MemoryIndex.build(memories, None, counter)
    out: dict[str, Any] = {}
    for grouped in (True, False):
        options = SliceOptions(group_memories_by_day=grouped)
        for query in QUERIES:
            query_vector = embedder.embed([query])[0]
            for budget in BUDGETS:
                for mode in ("hybrid", "lexical"):
                    hybrid = mode == "hybrid"
                    packed = build_slice(
                        query=query,
                        attributes=attributes,
                        intents=intents,
                        memory_index=index if hybrid else lexical_index,
                        budget_tokens=budget,
                        counter=counter,
                        query_vector=query_vector if hybrid else None,
                        now=NOW,
                        options=options,
                        attribute_vectors=attribute_vectors if hybrid else None,
                        intent_vectors=intent_vectors if hybrid else None,
                    )
                    out[f"{query} | B={budget} | {mode} | grouped={grouped}"] = {
                        "items": [c.item_id for c in packed.items],
                        "n_tokens": packed.n_tokens,
                        "text_sha256": hashlib.sha256(packed.text.encode("utf-8")).hexdigest(),
                        "left_out_sha256": _digest([list(lo) for lo in packed.left_out]),
                    }
    return out


def _counts(value: dict[str, Any]) -> np.ndarray:
    return np.asarray([len(v["items"]) for v in value.values()])


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else GOLDEN
    result = slices()
    target.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(result)} slices, {int(_counts(result).sum())} items -> {target}")
