"""Would int8 weights make a stronger embedder cheap enough to serve? (decision 0083)

    python -m benchmarks.embedder_quantization [--models minilm,mpnet] [--queries 40]

all-mpnet-base-v2 beats all-MiniLM-L6-v2 on both retrieval benchmarks (decision 0049), but
embedding the question costs it ~60-80 ms per slice on one thread, which breaks the slice
latency goals. PyTorch's dynamic int8 quantization of the Linear layers is the usual way to
cut that. This measures, per installed model and quantization variant, on the SPEC's
PrefEval data read in place:

- the query embedding's p50 in ms (one thread, one question at a time, as a slice embeds);
- the cosine of each quantized question vector to the float32 one (mean and minimum);
- top-5 hit rate of the user's own preference among it plus 50 distractors from other
  topics (``random.Random(7)``), question vectors from the variant, preference vectors from
  float32 (``fp32 docs``: a store embedded before the switch) and from the variant itself
  (``own docs``: a store embedded with it throughout).

Variants: ``fp32``; ``int8-tensor`` (every Linear, per-tensor weight scales, PyTorch's
default); ``int8-channel`` (every Linear, per-channel weight scales); ``int8-no-ffn-out``
(per-channel, every Linear but each layer's feed-forward output projection, whose inputs
carry the large activation outliers that per-tensor activation scales cannot represent).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_common import DEFAULT_DATA_DIR
from benchmarks.prefeval import load_prefeval, user_events
from uprof.adapters.embeddings import SentenceEmbedder

DATA = DEFAULT_DATA_DIR / "prefeval"


def _linear_names(model: Any) -> list[str]:
    import torch

    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def _variants(model: Any) -> dict[str, Callable[[], Any]]:
    """Each variant builds a quantized copy of ``model`` (the float32 model is untouched)."""
    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    names = _linear_names(model)
    # A transformer layer's feed-forward output projection: "...layer.N.output.dense";
    # the attention block's own output projection sits under ".attention.".
    ffn_out = {n for n in names if n.endswith("output.dense") and ".attention." not in n}

    def build(spec: Any) -> Callable[[], Any]:
        return lambda: quantize_dynamic(model, spec, dtype=torch.qint8)

    return {
        "fp32": lambda: model,
        "int8-tensor": build({torch.nn.Linear}),
        "int8-channel": build({torch.nn.Linear: per_channel_dynamic_qconfig}),
        "int8-no-ffn-out": build(
            {name: per_channel_dynamic_qconfig for name in names if name not in ffn_out}
        ),
    }


def _p50_ms(embedder: SentenceEmbedder, questions: Sequence[str]) -> float:
    embedder.embed([questions[0]])  # warm
    times = []
    for q in questions:
        start = time.perf_counter()
        embedder.embed([q])
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 1)


def _top5_rate(question_vecs: np.ndarray, pref_vecs: np.ndarray, users: list[list[int]]) -> float:
    hits = 0
    for k, ids in enumerate(users):
        scores = pref_vecs[ids] @ question_vecs[k]
        rank = int((scores > scores[ids.index(k)]).sum())
        hits += rank < 5
    return round(hits / len(users), 3)


def measure(model_key: str, n_queries: int, data: Path) -> list[dict[str, Any]]:
    import torch

    torch.set_num_threads(1)
    items = load_prefeval(data / "explicit_preference")
    rng = random.Random(7)
    index = {item.source_ref: k for k, item in enumerate(items)}
    users = [[index[e.source_ref] for e in user_events(u, items, 50, rng)] for u in items]
    questions = [item.question for item in items]
    prefs = [f"- {item.preference}" for item in items]  # the SPEC's candidate line

    embedder = SentenceEmbedder.for_model(model_key, torch_threads=1)
    embedder.load()
    fp32_model = embedder._model
    fp32_q = embedder.embed(questions)
    fp32_p = embedder.embed(prefs)
    rows = []
    for name, build in _variants(fp32_model).items():
        with warnings.catch_warnings():  # PyTorch's deprecation notice for torch.ao
            warnings.simplefilter("ignore")
            embedder._model = build()
        q = embedder.embed(questions)
        p = embedder.embed(prefs)
        cos = (q * fp32_q).sum(axis=1)
        rows.append(
            {
                "model": model_key,
                "variant": name,
                "query_p50_ms": _p50_ms(embedder, questions[:n_queries]),
                "cos_to_fp32_mean": round(float(cos.mean()), 4),
                "cos_to_fp32_min": round(float(cos.min()), 4),
                "top5_fp32_docs": _top5_rate(q, fp32_p, users),
                "top5_own_docs": _top5_rate(q, p, users),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    embedder._model = fp32_model
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="minilm,mpnet", help="UPROF_EMBEDDER keys to measure")
    p.add_argument("--queries", type=int, default=40, help="questions timed per variant")
    p.add_argument("--data", type=Path, default=DATA, help="PrefEval folder (read in place)")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = p.parse_args(argv)
    rows = []
    for key in args.models.split(","):
        rows += measure(key.strip(), args.queries, args.data)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
