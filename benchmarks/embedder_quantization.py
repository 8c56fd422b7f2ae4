"""Would int8 weights make a stronger embedder cheap enough to serve? (decision 0083)

    python -m benchmarks.embedder_quantization [--models minilm,mpnet] [--queries 40]

all-mpnet-base-v2 beats all-MiniLM-L6-v2 on both retrieval benchmarks (decision 0049), but
embedding the question costs it ~60-80 ms per slice on one thread, which breaks the slice
latency goals. PyTorch's dynamic int8 quantization of the Linear layers is the usual way to
cut that. This measures, per installed model and quantization variant, on the SPEC's
PrefEval data read in place:

- the query embedding's p50 in ms (one thread, one question at a time, as a slice embeds;
  the variants take turns on every question, so load that varies during the run falls on
  all of them alike);
- the cosine of each quantized question vector to the float32 one (mean and minimum);
- top-5 hit rate of the user's own preference among it plus 50 distractors from other
  topics, and top-3 among it plus 200 (``random.Random(7)``), question vectors from the
  variant, preference vectors from float32 (``fp32 docs``: a store embedded before the
  switch) and from the variant itself (``own docs``: a store embedded with it throughout).

Variants: ``fp32``; ``int8-tensor`` (every Linear, per-tensor weight scales, PyTorch's
default); ``int8-channel`` (every Linear, per-channel weight scales); ``int8-no-ffn-out``
(per-channel, every Linear but each layer's feed-forward output projection, whose inputs
carry the large activation outliers that per-tensor activation scales cannot represent);
``int8-smooth-<alpha>`` (per-channel, every Linear, after SmoothQuant's rescaling of the
feed-forward output projections, calibrated on 300 LoCoMo dev turns read in place).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

from benchmarks.bench_common import DEFAULT_DATA_DIR
from benchmarks.prefeval import load_prefeval, user_events
from uprof.adapters.embeddings import SentenceEmbedder


def _linear_names(model: Any) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def _ffn_out_names(model: Any) -> list[str]:
    """A transformer layer's feed-forward output projection, "...layer.N.output.dense"
    (the attention block's own output projection sits under ".attention.")."""
    return [
        n for n in _linear_names(model) if n.endswith("output.dense") and ".attention." not in n
    ]


def input_maxima(model: Any, run: Callable[[], object]) -> dict[str, Any]:
    """Per input channel, the largest absolute input each feed-forward output projection
    sees while ``run`` embeds calibration text with ``model``."""
    modules = dict(model.named_modules())
    maxima: dict[str, Any] = {}

    def recorder(name: str) -> Callable[..., None]:
        def hook(_module: Any, inputs: tuple[Any, ...], _output: Any) -> None:
            x = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0)
            maxima[name] = x if name not in maxima else maxima[name].maximum(x)

        return hook

    hooks = [modules[n].register_forward_hook(recorder(n)) for n in _ffn_out_names(model)]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return maxima


def _smoothed_copy(model: Any, maxima: dict[str, Any], alpha: float) -> Any:
    """SmoothQuant's rescaling (Xiao et al., 2023) of each feed-forward output projection:
    input channel j is divided by s_j = max|x_j|^alpha / max|W_:,j|^(1-alpha) and the
    weights' column j multiplied by it, so the product is unchanged in exact arithmetic
    but the activation outliers move into the weights, which have per-channel scales."""
    smoothed = copy.deepcopy(model)
    modules = dict(smoothed.named_modules())
    for name, x_max in maxima.items():
        linear = modules[name]
        w = linear.weight.data
        scale = x_max.clamp(min=1e-5) ** alpha / w.abs().amax(0).clamp(min=1e-5) ** (1 - alpha)
        linear.weight.data = w * scale
        parent, attribute = name.rsplit(".", 1)
        setattr(modules[parent], attribute, _DivideInputs(linear, scale))
    return smoothed


class _DivideInputs(torch.nn.Module):  # type: ignore[misc]  # torch is untyped here
    """A Linear layer whose inputs are first divided, channel by channel, by ``scale``."""

    def __init__(self, linear: Any, scale: Any) -> None:
        super().__init__()
        self.register_buffer("inverse", 1.0 / scale)
        self.linear = linear

    def forward(self, x: Any) -> Any:
        return self.linear(x * self.inverse)


def _variants(model: Any, maxima: dict[str, Any] | None = None) -> dict[str, Callable[[], Any]]:
    """Each variant builds a quantized copy of ``model`` (the float32 model is untouched).
    ``maxima`` (from ``input_maxima``) adds the SmoothQuant variants."""
    names = _linear_names(model)
    ffn_out = set(_ffn_out_names(model))
    every = {torch.nn.Linear: per_channel_dynamic_qconfig}

    def build(spec: Any) -> Callable[[], Any]:
        return lambda: quantize_dynamic(model, spec, dtype=torch.qint8)

    variants = {
        "fp32": lambda: model,
        "int8-tensor": build({torch.nn.Linear}),
        "int8-channel": build(every),
        "int8-no-ffn-out": build(
            {name: per_channel_dynamic_qconfig for name in names if name not in ffn_out}
        ),
    }
    if maxima:
        smoothing = maxima

        def smoothed(alpha: float) -> Callable[[], Any]:
            return lambda: quantize_dynamic(
                _smoothed_copy(model, smoothing, alpha), every, dtype=torch.qint8
            )

        variants |= {f"int8-smooth-{alpha}": smoothed(alpha) for alpha in (0.7, 0.85)}
    return variants


def calibration_texts(data_root: Path, n: int = 300) -> list[str]:
    """LoCoMo dev turns (read in place), a fixed sample: text the PrefEval check never sees."""
    conversations = json.loads((data_root / "locomo_dev.json").read_text(encoding="utf-8"))
    turns = [
        turn["text"]
        for conversation in conversations
        for key, session in conversation["conversation"].items()
        if key.startswith("session_") and isinstance(session, list)
        for turn in session
    ]
    random.Random(1).shuffle(turns)
    return turns[:n]


def interleaved_p50_ms(
    embedder: Any, models: dict[str, Any], questions: Sequence[str]
) -> dict[str, float]:
    """Each variant's median ms to embed one question, the variants taking turns on every
    question (in a rotating order) so that load coming and going during the run falls on
    all of them alike; timed one after the other, the first (float32) took the run's
    heaviest load (decision 0083). The first model of ``models`` is put back after."""
    names = list(models)
    times: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm each
        embedder._model = models[name]
        embedder.embed([questions[0]])
    for i, q in enumerate(questions):
        turn = i % len(names)
        for name in names[turn:] + names[:turn]:
            embedder._model = models[name]
            start = time.perf_counter()
            embedder.embed([q])
            times[name].append((time.perf_counter() - start) * 1000)
    embedder._model = models[names[0]]
    return {name: round(statistics.median(t), 1) for name, t in times.items()}


def _top_rate(
    question_vecs: np.ndarray, pref_vecs: np.ndarray, users: list[list[int]], top: int
) -> float:
    """Share of users whose own preference (row k of ``pref_vecs`` for user k) ranks among
    the ``top`` best of their candidates."""
    hits = 0
    for k, ids in enumerate(users):
        scores = pref_vecs[ids] @ question_vecs[k]
        rank = int((scores > scores[ids.index(k)]).sum())
        hits += rank < top
    return round(hits / len(users), 3)


def measure(
    model_key: str, n_queries: int, data: Path, only: Sequence[str] = ()
) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    items = load_prefeval(data / "prefeval" / "explicit_preference")
    rng = random.Random(7)
    index = {item.source_ref: k for k, item in enumerate(items)}
    users = [[index[e.source_ref] for e in user_events(u, items, 50, rng)] for u in items]
    users_200 = [[index[e.source_ref] for e in user_events(u, items, 200, rng)] for u in items]
    questions = [item.question for item in items]
    prefs = [f"- {item.preference}" for item in items]  # the SPEC's candidate line

    embedder = SentenceEmbedder.for_model(model_key, torch_threads=1)
    embedder.load()
    fp32_model = embedder._model
    fp32_q = embedder.embed(questions)
    fp32_p = embedder.embed(prefs)
    maxima = input_maxima(fp32_model, lambda: embedder.embed(calibration_texts(data)))
    rows = []
    models: dict[str, Any] = {"fp32": fp32_model}  # timed together at the end
    for name, build in _variants(fp32_model, maxima).items():
        if only and name not in only:
            continue
        with warnings.catch_warnings():  # PyTorch's deprecation notice for torch.ao
            warnings.simplefilter("ignore")
            embedder._model = models[name] = build()
        q = embedder.embed(questions)
        p = embedder.embed(prefs)
        cos = (q * fp32_q).sum(axis=1)
        rows.append(
            {
                "model": model_key,
                "variant": name,
                "cos_to_fp32_mean": round(float(cos.mean()), 4),
                "cos_to_fp32_min": round(float(cos.min()), 4),
                "top5_n50_fp32_docs": _top_rate(q, fp32_p, users, 5),
                "top5_n50_own_docs": _top_rate(q, p, users, 5),
                "top3_n200_fp32_docs": _top_rate(q, fp32_p, users_200, 3),
                "top3_n200_own_docs": _top_rate(q, p, users_200, 3),
            }
        )
    p50 = interleaved_p50_ms(embedder, models, questions[:n_queries])
    for row in rows:
        row["query_p50_ms"] = p50[str(row["variant"])]
        print(json.dumps(row), flush=True)
    embedder._model = fp32_model
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="minilm,mpnet", help="UPROF_EMBEDDER keys to measure")
    p.add_argument("--queries", type=int, default=40, help="questions timed per variant")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="the SPEC's data folder")
    p.add_argument("--variants", default="", help="comma-separated variant names (default all)")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = p.parse_args(argv)
    rows = []
    for key in args.models.split(","):
        only = [v for v in args.variants.split(",") if v]
        rows += measure(key.strip(), args.queries, args.data, only)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
