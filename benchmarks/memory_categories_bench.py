"""Cost and reach of the memory category gate (decision 0016), on LoCoMo's user turns.

Reads the benchmark file in place (never copied). Reports, as medians of ``--runs``:
the detector's time per turn, the read gate's time per memory (RevealGate.reason, as a
slice meets it when the index of a reader is built), and the share of turns the detector
tags per category, which shows that it does not tag everything.

    python -m benchmarks.memory_categories_bench --data ../shared/bench/data/locomo_dev.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.bench_common import DEFAULT_DATA_DIR
from domain.categories import DETECTED_CATEGORIES, detect_categories
from domain.values import CATEGORIES, CapturedInteraction, Interaction
from uprof.adapters.extraction.rules import RuleBasedExtractor
from uprof.services.memory_gate import RevealGate

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def turns(path: Path) -> list[str]:
    data = json.loads(path.read_text(encoding="utf-8"))
    out: list[str] = []
    for sample in data:
        conversation = sample["conversation"]
        for key, value in conversation.items():
            if key.startswith("session_") and isinstance(value, list):
                out.extend(t.get("text", "") for t in value if t.get("text"))
    return out


def median_seconds(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR / "locomo_dev.json")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    texts = turns(args.data)
    n = len(texts)

    extractor = RuleBasedExtractor()
    captures = [
        CapturedInteraction(
            f"c{i}", Interaction(app_id="app:bench", agent_id="a", occurred_at=NOW, user_input=t)
        )
        for i, t in enumerate(texts)
    ]
    extract = median_seconds(lambda: [extractor.extract(c) for c in captures], args.runs)
    detect = median_seconds(lambda: [detect_categories(t) for t in texts], args.runs)
    tags = Counter(c for t in texts for c in detect_categories(t))
    tagged = sum(1 for t in texts if detect_categories(t))

    allow_all = dict.fromkeys(CATEGORIES, "")
    deny_location = {**allow_all, "location": "policy"}
    values = [("location", "Lisbon"), ("family", "sister named Carla"), ("pet", "dog named Rufus")]
    items = [("location", (f"c{i}",)) for i in range(0, n, 50)]
    rows = [(("conversation",), (f"c{i}",), t) for i, t in enumerate(texts)]

    def gate(allowed: dict[str, str]) -> None:
        reveal = RevealGate.build(allowed, items=items, values=values)
        for categories, evidence, text in rows:
            reveal.reason(categories, evidence, (text,))

    baseline = median_seconds(
        lambda: [allow_all.get(c[0], "policy") for c, _, _ in rows], args.runs
    )
    gate_all = median_seconds(lambda: gate(allow_all), args.runs)
    gate_deny = median_seconds(lambda: gate(deny_location), args.runs)

    print(f"turns: {n}  (median of {args.runs} runs)")
    print(f"rule extractor (baseline): {extract / n * 1e6:.1f} us/turn")
    print(f"detector: {detect / n * 1e6:.1f} us/turn  ({detect * 1e3:.0f} ms for all)")
    print(
        f"read gate per memory: primary-category lookup {baseline / n * 1e6:.2f} us (before), "
        f"all allowed {gate_all / n * 1e6:.2f} us, location denied {gate_deny / n * 1e6:.2f} us"
    )
    print(f"turns tagged by the detector: {tagged / n:.1%}")
    for category in DETECTED_CATEGORIES:
        print(f"  {category:<9} {tags[category] / n:.1%}")


if __name__ == "__main__":
    main()
