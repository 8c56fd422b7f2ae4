"""Fit the learned fusion's weights on one half of a replay recording (round 10).

For every question of the chosen half, the hand fusion ranks the memories as the service
does (``ranker.hand_relevance``); its best ``pool_size`` memories plus every gold memory
make the question's pool. Each pool memory gets ``ranker.LEARNED_FEATURES``, and a label:
LoCoMo, a memory holding one of the question's evidence turns (``evidence`` and the
audited set); PrefEval, the user's own preference against its distractors (N = 50 and
200, the harness's draws). Three L2-regularised logistic models (scikit-learn, C = 1 on
standardised features) are fit, their weights mapped back to the raw features:

* ``ltr-pointwise``: each pool memory a sample; per question the positives and the
  negatives each carry half of the question's weight;
* ``ltr-pairwise``: each (positive, negative) pair of a question a sample, its feature
  difference in both directions; the pairs of a question share its weight;
* ``ltr-share``: the hand fusion kept, only its lexical share learned from
  ``ranker.SHARE_FEATURES``: pairwise over ``dense`` and ``feature_j * (lexical - dense)``
  (and the speaker, recency and heat terms), the share being ``theta / alpha``.

Each question weighs the same within its benchmark, and the two benchmarks weigh the same
(PrefEval's N = 50 and N = 200 draws half each). Both halves are fit in one run (the
cross-fit), so how far the weights move between halves is printed beside them.

Usage::

    python -m benchmarks.learned_fusion --inputs /tmp/replay.pkl --out /tmp/weights.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import locomo, prefeval
from benchmarks.bench_common import DEFAULT_DATA_DIR
from benchmarks.retrieval_replay import (
    PREF_NOW,
    _counter,
    _index,
    half_of,
    load_inputs,
    pref_users,
    service_options,
    user_subject,
)
from uprof.retrieval import MemoryIndex
from uprof.retrieval.ranker import (
    LEARNED_FEATURES,
    SHARE_FEATURES,
    analyse_query,
    hand_relevance,
    learned_features,
    share_features,
)
from uprof.retrieval.slices import SliceOptions

#: L2 strength of every fit (scikit-learn's C, on standardised features), set before fitting.
C = 1.0
PREF_NS = (50, 200)


@dataclass
class Pool:
    """One question's pool: features, labels, share-model columns, and its weight."""

    benchmark: str  # "locomo" or "prefeval:<N>"
    case: str
    features: np.ndarray  # (pool, LEARNED_FEATURES)
    share: np.ndarray  # (pool, share-model columns)
    labels: np.ndarray  # bool


def _pool(
    benchmark: str,
    case: str,
    index: MemoryIndex,
    text: str,
    query_vector: Any,
    now: Any,
    gold: set[str],
    options: SliceOptions,
) -> Pool | None:
    query = analyse_query(text)
    signals, relevance, bridged = hand_relevance(index, query, query_vector, now, options)
    labels = np.asarray([bool(gold & set(c.source_refs)) for c in index.candidates])
    if not labels.any():
        return None
    size = min(options.pool_size, len(relevance))
    top = np.argpartition(-relevance, size - 1)[:size]
    rows = np.union1d(top, np.flatnonzero(labels))
    features = learned_features(index, signals, relevance, bridged)[rows]
    q = share_features(signals.coverage, query, bool(signals.speaker.any()))
    diff = (signals.lexical - signals.dense)[rows]
    share = np.column_stack(
        [
            signals.dense[rows],
            *(q[j] * diff for j in range(len(q))),
            signals.speaker[rows].astype(float),
            signals.recency[rows],
            signals.heat[rows],
        ]
    )
    return Pool(benchmark, case, features, share, labels[rows])


def collect(inputs: dict[str, Any], data: Path, options: SliceOptions, progress: Any) -> list[Pool]:
    counter = _counter()
    pools: list[Pool] = []
    start = time.perf_counter()
    for conv in locomo.load_locomo(data / "locomo_dev.json"):
        index: MemoryIndex | None = None
        for q in conv.questions:
            got = inputs["locomo"][(conv.sample_id, q.qa_index)]
            if index is None:
                index = _index(got.memories, got.memory_vectors, counter)
            gold = set(q.evidence) | set(q.audited or ())
            pool = _pool(
                "locomo", conv.sample_id, index, got.query, got.query_vector, got.now, gold, options
            )
            if pool is not None:
                pools.append(pool)
    progress(f"locomo pools: {time.perf_counter() - start:.0f}s")
    items = prefeval.load_prefeval(data / "prefeval" / "explicit_preference")
    for n in PREF_NS:
        start = time.perf_counter()
        for user, events in pref_users(items, n):
            subject = user_subject(events, inputs["prefeval"], counter)
            asked = inputs["prefeval"][user.source_ref]
            pool = _pool(
                f"prefeval:{n}",
                user.topic,
                subject[0],
                user.question,
                asked.query_vector,
                PREF_NOW,
                {user.source_ref},
                options,
            )
            if pool is not None:
                pools.append(pool)
        progress(f"prefeval N={n} pools: {time.perf_counter() - start:.0f}s")
    return pools


def _question_weights(pools: Sequence[Pool]) -> list[float]:
    """Each question's weight: equal within its benchmark, LoCoMo = PrefEval, N=50 = N=200."""
    share = {"locomo": 0.5, **{f"prefeval:{n}": 0.5 / len(PREF_NS) for n in PREF_NS}}
    counts: dict[str, int] = {}
    for p in pools:
        counts[p.benchmark] = counts.get(p.benchmark, 0) + 1
    return [share[p.benchmark] / counts[p.benchmark] for p in pools]


def _logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, intercept: bool) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=C, fit_intercept=intercept, max_iter=2000)
    model.fit(x, y, sample_weight=w * len(w) / w.sum())  # mean weight 1: C keeps its meaning
    coef: np.ndarray = model.coef_[0]
    return coef


def _logistic_towards_hand(x: np.ndarray, y: np.ndarray, w: np.ndarray, c: float = C) -> np.ndarray:
    """Logistic regression, no intercept, whose L2 penalty spares the hand relevance's
    weight (feature 0): the prior is the hand ranking, not an empty score, so a feature
    earns weight only where it corrects the hand fusion. scipy's L-BFGS on the same
    objective scikit-learn minimises (mean sample weight 1, penalty |theta|^2 / 2C)."""
    from scipy.optimize import minimize

    w = w * len(w) / w.sum()
    penalised = np.ones(x.shape[1])
    penalised[LEARNED_FEATURES.index("relevance")] = 0.0

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = x @ theta
        value = float(w @ (np.logaddexp(0.0, z) - y * z)) + float((penalised * theta) @ theta) / (
            2 * C
        )
        grad = x.T @ (w * (1.0 / (1.0 + np.exp(-z)) - y)) + penalised * theta / c
        return value, grad

    got = minimize(loss, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B")
    coef: np.ndarray = got.x
    return coef


def _pairs(pools: Sequence[Pool], column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (positive - negative) difference of each question, both ways, with weights."""
    diffs: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    for pool, qw in zip(pools, _question_weights(pools), strict=True):
        x = getattr(pool, column)
        pos, neg = x[pool.labels], x[~pool.labels]
        d = (pos[:, None, :] - neg[None, :, :]).reshape(-1, x.shape[1])
        diffs.append(d)
        weights.append(np.full(len(d), qw / len(d)))
    x_all = np.concatenate(diffs)
    w_all = np.concatenate(weights)
    return (
        np.concatenate([x_all, -x_all]),
        np.concatenate([np.ones(len(x_all)), np.zeros(len(x_all))]),
        np.concatenate([w_all, w_all]),
    )


def fit(pools: Sequence[Pool]) -> dict[str, Any]:
    """The three models' weights on raw features (and standardised, for comparison)."""
    x = np.concatenate([p.features for p in pools])
    spread = x.std(axis=0)
    spread[spread <= 1e-12] = 1.0
    y = np.concatenate([p.labels for p in pools]).astype(float)
    w = np.concatenate(
        [
            np.where(p.labels, 0.5 * qw / p.labels.sum(), 0.5 * qw / max((~p.labels).sum(), 1))
            for p, qw in zip(pools, _question_weights(pools), strict=True)
        ]
    )
    pointwise = _logistic((x - x.mean(axis=0)) / spread, y, w, intercept=True)
    px, py, pw = _pairs(pools, "features")
    pairwise = _logistic(px / spread, py, pw, intercept=False)
    towards = _logistic_towards_hand(px / spread, py, pw)
    towards_strong = _logistic_towards_hand(px / spread, py, pw, c=0.1)
    sx, sy, sw = _pairs(pools, "share")
    share_coef = _logistic(sx, sy, sw, intercept=False)
    alpha = float(share_coef[0])
    theta = share_coef[1 : 1 + len(SHARE_FEATURES)]
    return {
        "questions": len(pools),
        # Spread of the hand relevance and of the pairwise score over the pools, so the two
        # can be mixed on one scale (the replay's ltr-pairwise-half).
        "relevance_sd": float(spread[LEARNED_FEATURES.index("relevance")]),
        "pairwise_sd": float((x @ (pairwise / spread)).std()),
        "ltr-pointwise": {
            "standardised": pointwise.tolist(),
            "raw": (pointwise / spread).tolist(),
        },
        "ltr-pairwise": {"standardised": pairwise.tolist(), "raw": (pairwise / spread).tolist()},
        # Second pass (named from the tune table only): the pairwise model shrunk towards
        # the hand ranking instead of towards zero.
        "ltr-pairwise-hand": {"standardised": towards.tolist(), "raw": (towards / spread).tolist()},
        "ltr-pairwise-hand-c0.1": {
            "standardised": towards_strong.tolist(),
            "raw": (towards_strong / spread).tolist(),
        },
        "ltr-share": {
            "coef": share_coef.tolist(),
            "alpha": alpha,
            "raw": (theta / alpha).tolist() if alpha > 0 else [],
        },
    }


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    u, v = np.asarray(a), np.asarray(b)
    return float(u @ v / max(np.linalg.norm(u) * np.linalg.norm(v), 1e-12))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--inputs", type=Path, required=True, help="written by retrieval_replay")
    parser.add_argument("--out", type=Path, required=True, help="weights of both fits (JSON)")
    args = parser.parse_args(argv)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    pools = collect(load_inputs(args.inputs), args.data, service_options(), progress)
    report: dict[str, Any] = {"features": LEARNED_FEATURES, "share_features": SHARE_FEATURES}
    for half in ("tune", "check"):
        report[half] = fit([p for p in pools if half_of(p.case) == half])
    for model in ("ltr-pointwise", "ltr-pairwise", "ltr-pairwise-hand", "ltr-pairwise-hand-c0.1"):
        report[f"{model} cosine tune/check"] = _cosine(
            report["tune"][model]["standardised"], report["check"][model]["standardised"]
        )
    args.out.write_text(json.dumps(report, indent=1))
    for half in ("tune", "check"):
        for model in (
            "ltr-pointwise",
            "ltr-pairwise",
            "ltr-pairwise-hand",
            "ltr-pairwise-hand-c0.1",
            "ltr-share",
        ):
            raw = report[half][model]["raw"]
            print(f"{half} {model}: " + " ".join(f"{v:+.4f}" for v in raw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
