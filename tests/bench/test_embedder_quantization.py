"""The quantization variants that decision 0083 measured quantize the layers they name."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from benchmarks.embedder_quantization import _top5_rate, _variants


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


def test_top5_rate_counts_the_users_own_row() -> None:
    prefs = np.eye(6, dtype=np.float32)
    questions = np.eye(6, dtype=np.float32)
    users = [[0, 1, 2, 3, 4, 5], [1, 0, 2, 3, 4, 5]]
    assert _top5_rate(questions[:2], prefs, users) == 1.0
    # A question pointing away from its own preference ranks it last of six.
    assert _top5_rate(-questions[:2], prefs, users) == 0.0
