"""The quantization variants that decision 0083 measured quantize the layers they name."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from benchmarks.embedder_quantization import _smoothed_copy, _top_rate, _variants, input_maxima


def _layer() -> torch.nn.Module:
    """A module tree with the names a BERT-class layer gives its Linear modules."""
    layer = torch.nn.Module()
    layer.attention = torch.nn.Module()
    layer.attention.output = torch.nn.Module()
    layer.attention.output.dense = torch.nn.Linear(4, 4)
    layer.intermediate = torch.nn.Module()
    layer.intermediate.dense = torch.nn.Linear(4, 8)
    layer.output = torch.nn.Module()
    layer.output.dense = torch.nn.Linear(8, 4)  # the feed-forward output projection
    return layer


def _quantized(model: torch.nn.Module) -> set[str]:
    return {name for name, module in model.named_modules() if isinstance(module, DynamicInt8Linear)}


def test_variants_quantize_what_they_name() -> None:
    model = torch.nn.Sequential(_layer(), _layer())
    every = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    ffn_out = {"0.output.dense", "1.output.dense"}
    with warnings.catch_warnings():  # PyTorch's deprecation notice for torch.ao
        warnings.simplefilter("ignore")
        variants = {name: build() for name, build in _variants(model).items()}
    assert variants["fp32"] is model
    assert _quantized(variants["int8-tensor"]) == every
    assert _quantized(variants["int8-channel"]) == every
    assert _quantized(variants["int8-no-ffn-out"]) == every - ffn_out
    # The float32 model is left as it was: a copy is quantized.
    assert _quantized(model) == set()


def test_top_rate_counts_the_users_own_row() -> None:
    prefs = np.eye(6, dtype=np.float32)
    questions = np.eye(6, dtype=np.float32)
    users = [[0, 1, 2, 3, 4, 5], [1, 0, 2, 3, 4, 5]]
    assert _top_rate(questions[:2], prefs, users, 5) == 1.0
    # A question pointing away from its own preference ranks it last of six.
    assert _top_rate(-questions[:2], prefs, users, 5) == 0.0


def test_smoothing_keeps_the_float_output_and_adds_its_variants() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(_layer())
    ffn = model[0]
    x = torch.randn(5, 8)
    x[:, 3] *= 50  # one outlier channel, as in all-mpnet-base-v2's feed-forward outputs
    maxima = input_maxima(model, lambda: ffn.output.dense(x))
    assert torch.equal(maxima["0.output.dense"], x.abs().amax(0))
    smoothed = _smoothed_copy(model, maxima, 0.85)
    assert torch.allclose(smoothed[0].output.dense(x), ffn.output.dense(x), atol=1e-4)
    assert ffn.output.dense.weight.shape == (4, 8)  # the original is left alone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        variants = {name: build() for name, build in _variants(model, maxima).items()}
    assert {"int8-smooth-0.7", "int8-smooth-0.85"} <= set(variants)
    assert "int8-smooth-0.85" not in _variants(model)


class _RecordingEmbedder:
    """Stands in for SentenceEmbedder: records which model embedded each text."""

    def __init__(self) -> None:
        self._model: str = ""
        self.calls: list[tuple[str, str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.extend((self._model, text) for text in texts)
        return np.zeros((len(texts), 2), dtype=np.float32)


def test_variants_are_timed_in_turn_on_every_question() -> None:
    """Timing each variant in a block of its own (float32 first) let load that came and
    went during the run fall on one variant: decision 0083's loaded run had float32
    MiniLM at 33.5 ms against 12.4 ms quiet, int8 per-tensor at 6.8 against 5.1, so its
    ratios favoured int8 (0.20 loaded, 0.41 quiet). The variants now take turns on every
    question, in a rotating order, so a burst of load falls on all of them alike."""
    from benchmarks.embedder_quantization import interleaved_p50_ms

    embedder = _RecordingEmbedder()
    questions = ["q0", "q1", "q2", "q3"]
    p50 = interleaved_p50_ms(embedder, {"fp32": "A", "int8": "B", "smooth": "C"}, questions)
    assert set(p50) == {"fp32", "int8", "smooth"}
    timed = embedder.calls[3:]  # after one warm-up call per variant
    assert [text for _, text in timed] == [q for q in questions for _ in range(3)]
    assert [model for model, _ in timed] == list("ABCBCACABABC")
    assert embedder._model == "A"  # the float32 model is put back
