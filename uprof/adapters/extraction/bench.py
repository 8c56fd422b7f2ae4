"""Measure rule-based extraction throughput on short turns.

Run ``python -m uprof.adapters.extraction.bench [--seconds N]``.

Prints extractions per second on one core over a fixed mix of short English
turns (facts, plans, questions and small talk), so runs are comparable.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from domain.values import CapturedInteraction, Interaction
from uprof.adapters.extraction.rules import RuleBasedExtractor

SHORT_TURNS: tuple[str, ...] = (
    "My name is Sam Lee and I live in Berlin.",
    "I love hiking, swimming and reading",
    "ok thanks",
    "I want to run a marathon by June",
    "Can you recommend a good book about history?",
    "I'm a software engineer at Google",
    "Every morning I go for a run",
    "What's the weather like tomorrow in Paris?",
    "I don't like olives",
    "I'm tired today, long day at work.",
)


def measure(seconds: float = 3.0) -> float:
    """Extractions per second over SHORT_TURNS for about ``seconds``."""
    extractor = RuleBasedExtractor()
    at = datetime(2025, 3, 12, 15, 0, tzinfo=UTC)
    captures = [
        CapturedInteraction(
            f"c{i}", Interaction(app_id="a", agent_id="g", occurred_at=at, user_input=t)
        )
        for i, t in enumerate(SHORT_TURNS)
    ]
    for c in captures:  # warm caches (regex compilation happens at import already)
        extractor.extract(c)
    done = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for c in captures:
            extractor.extract(c)
        done += len(captures)
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="how long to run")
    args = parser.parse_args()
    print(f"{measure(args.seconds):,.0f} extractions/s (rules/v1, short turns, one core)")


if __name__ == "__main__":
    main()
