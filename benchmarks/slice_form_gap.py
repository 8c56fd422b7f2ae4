"""Where uprof's PrefEval slice loses to plain dense top-k: ranking, overhead lines, or packing.

Decision 0049 found uprof with mpnet behind plain mpnet top-k at N=200, B=128, and no
ranking knob that closed the gap. This tool splits the gap into steps, user by user, over
a replay recording (``benchmarks.retrieval_replay --record``), so each step's cost is a
count of users rather than a guess:

1. **dense top-k**: memories by the query's cosine, one ``- <text>`` line each, first-fit
   in rank order (the SPEC's top-k, over the recorded vectors);
2. **uprof ranking**: the same lines and packing over uprof's memory ranking
   (``rank_memories``: fusion, neighbour flow, bridges), so only the order differs;
3. **uprof lines and headers**: as 2 with uprof's own memory lines (no ``- ``) and the
   section and day lines a memories-only slice pays;
4. **uprof slice**: ``build_slice`` itself (profile lines, marginal relevance, the legend).

A user is a hit when the preference's memory is packed (1-3) or when the harness scores
the slice a hit (4). Step 1 minus 2 is the ranking's cost, 2 minus 3 the slice's line form's,
3 minus 4 what profile lines and marginal-relevance packing cost or gain.

Usage::

    python -m benchmarks.slice_form_gap --inputs /tmp/replay-mpnet.pkl --n 200 --budget 128
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import prefeval
from benchmarks.bench_common import DEFAULT_DATA_DIR, count_tokens
from benchmarks.retrieval_replay import (
    PREF_NOW,
    _bench_slice,
    _counter,
    half_of,
    load_inputs,
    pref_users,
    prefeval_slice,
    service_options,
    user_subject,
)
from domain.values import Layer
from uprof.retrieval import ranker, render

STEPS = ("dense_topk", "uprof_ranking", "uprof_lines_headers", "uprof_slice")


def first_fit(order: Sequence[int], costs: Sequence[int], budget: int) -> set[int]:
    """Rows taken in rank order while they fit (each cost includes its newline)."""
    spent, taken = 0, set()
    for row in order:
        if spent + costs[row] <= budget:
            taken.add(row)
            spent += costs[row]
    return taken


def user_steps(
    user: prefeval.PrefItem,
    events: Sequence[prefeval.PrefItem],
    inputs: Any,
    counter: Any,
    budget: int,
) -> dict[str, bool]:
    """Hit or miss of one user at each step."""
    subject = user_subject(events, inputs, counter)
    index = subject[0]
    asked = inputs[user.source_ref]
    options = service_options()
    own = {i for i, m in enumerate(index.candidates) if user.source_ref in m.source_refs}
    # Steps 1-2 pay the SPEC's baseline line (``- <preference>``), step 3 uprof's own
    # memory line; each cost includes its newline, and the last line has none after it:
    # one token of slack, as the rendered text has.
    spec_costs = [counter.count(f"- {m.text}") + 1 for m in index.candidates]
    own_costs = np.asarray(index.line_costs).tolist()
    room = budget + 1
    cosines = np.asarray(index.vectors) @ np.asarray(asked.query_vector, dtype=np.float32)
    dense_order = np.argsort(-cosines, kind="stable").tolist()
    ranking = ranker.rank_memories(
        index, ranker.analyse_query(user.question), asked.query_vector, PREF_NOW, options
    )
    headers = render.SECTION_HEADERS[Layer.MEMORY] + "\n" + index.day_headers[0]
    packed = prefeval_slice(user, subject, asked, budget, options, counter)
    ranked = ranking.rows.tolist()
    headers_cost = counter.count(headers) + 1
    return {
        "dense_topk": bool(own & first_fit(dense_order, spec_costs, room)),
        "uprof_ranking": bool(own & first_fit(ranked, spec_costs, room)),
        "uprof_lines_headers": bool(own & first_fit(ranked, own_costs, room - headers_cost)),
        "uprof_slice": prefeval.is_hit(_bench_slice(packed), user)
        and count_tokens(packed.text) <= budget,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=Path, required=True, help="a --record file")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--n", type=int, default=200, help="distractors per user")
    parser.add_argument("--budget", type=int, default=128)
    args = parser.parse_args(argv)
    inputs = load_inputs(args.inputs)["prefeval"]
    items = prefeval.load_prefeval(args.data / "prefeval" / "explicit_preference")
    counter = _counter()
    hits: dict[str, Counter[str]] = {"tune": Counter(), "check": Counter()}
    users: Counter[str] = Counter()
    for user, events in pref_users(items, args.n):
        half = half_of(user.topic)
        users[half] += 1
        for step, hit in user_steps(user, events, inputs, counter, args.budget).items():
            hits[half][step] += hit
    print(f"N={args.n}, B={args.budget}: users hit at each step (share)")
    for half in ("tune", "check"):
        cells = [f"{s} {hits[half][s]} ({hits[half][s] / users[half]:.3f})" for s in STEPS]
        print(f"{half:5s} of {users[half]}: " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
