"""Paired wall time of a hybrid slice with the bridges' product in one thread or split.

On the shared 2-core machine, two bench runs minutes apart see different loads, and
splitting the bridges' product (decision 0042) gains only where a second core is free,
which is what load changes. So this script times both ways inside one process, question
by question, alternating which goes first: each pair sees the same moment's load.

* ``one_thread``: the bridges' product in the serving thread alone (round 2's way);
* ``split_bridges``: the service as it is.

(Decision 0042 also measured embedding the question ahead on another thread, commit
8ee6e9d, with a four-way version of this script: no gain, so it was not kept.)

Usage (``SEEDED`` from ``uprof bench slice --seeded``; a copy, served slices count as
visits)::

    cp -a SEEDED /tmp/copy
    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.slice_pairs /tmp/copy 100 3 out.json

Reports per round the p50 wall time of each way, and the median over the questions of
``split_bridges / one_thread``; the load average before and after. Not run in the test suite or CI.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from benchmarks import slice_bench as sb
from uprof.retrieval import ranker

#: Ways to serve a slice: split the bridges' product or not.
WAYS: dict[str, bool] = {"one_thread": False, "split_bridges": True}


@contextmanager
def _way(split: bool) -> Iterator[None]:
    """Switch the split off (round 2's behaviour) or leave it on."""
    split_from = ranker._SPLIT_LINKS_FROM
    if not split:
        ranker._SPLIT_LINKS_FROM = sys.maxsize
    try:
        yield
    finally:
        ranker._SPLIT_LINKS_FROM = split_from


def main(argv: Sequence[str]) -> dict[str, Any]:
    args = sb.SeededRun.from_argv(argv)
    seeded, questions, rounds, out = args.seeded, args.questions, args.rounds, args.out
    result = args.header()
    with sb._seeded_deployment(seeded) as k:
        k.process()

        def timed(question: str) -> float:
            began = time.perf_counter()
            sb.serve_bench_slice(k, question)
            return (time.perf_counter() - began) * 1000

        names = list(WAYS)
        for question in questions[:3]:  # warm-up: builds the views, loads the model
            for name in names:
                with _way(WAYS[name]):
                    timed(question)
        per_round: list[dict[str, float]] = []
        for _ in range(rounds):
            walls: dict[str, list[float]] = {name: [] for name in names}
            for i, question in enumerate(questions):
                for j in range(len(names)):  # each way goes first as often as the others
                    name = names[(i + j) % len(names)]
                    with _way(WAYS[name]):
                        walls[name].append(timed(question))
            k.reads.drain()
            row: dict[str, float] = {}
            for name in names:
                row[f"{name}_p50_ms"] = round(statistics.median(walls[name]), 2)
                ratios = [w / o for w, o in zip(walls[name], walls["one_thread"], strict=True)]
                row[f"{name}_median_ratio"] = round(statistics.median(ratios), 3)
            per_round.append(row)
    result["per_round"] = per_round
    for key in per_round[0]:
        result[key] = statistics.median(r[key] for r in per_round)
    return sb.write_result(out, result)


if __name__ == "__main__":
    main(sys.argv[1:])
