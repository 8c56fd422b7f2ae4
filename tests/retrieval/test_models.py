"""Fetching a model that no package installs: verified file by file, installed whole or not
at all, never at run time (decision 0049)."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from domain.errors import ModelUnavailableError
from uprof.adapters.embeddings import SentenceEmbedder
from uprof.adapters.models import (
    MODELS,
    MPNET,
    ModelSpec,
    default_models_dir,
    fetch,
    installed_folder,
    verify,
)

FILES = {"config.json": b'{"hidden_size": 8}', "sub/vocab.txt": b"a\nb\nc\n"}


def spec_for(files: dict[str, bytes]) -> ModelSpec:
    return ModelSpec(
        key="tiny",
        name="tiny-model",
        dimension=8,
        parts=(("tiny-part-001==1", "0" * 64), ("tiny-part-002==1", "0" * 64)),
        files={name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    )


def split_zip_wheels(
    into: Path, files: dict[str, bytes], extra: dict[str, bytes] | None = None
) -> list[Path]:
    """Two wheels carrying a zip of the model folder cut in two, as the mpnet parts do."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in {**files, **(extra or {})}.items():
            archive.writestr(name if name.startswith("..") else f"tiny-model/{name}", data)
    whole = buffer.getvalue()
    halves = [whole[: len(whole) // 2], whole[len(whole) // 2 :]]
    wheels = []
    for i, half in enumerate(halves, start=1):
        wheel = into / f"tiny_part_{i:03d}-1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as whl:
            whl.writestr(f"tiny-part_{i:03d}/__init__.py", b"")
            whl.writestr(f"tiny-part_{i:03d}/input/tiny-model.zip.{i:03d}", half)
        wheels.append(wheel)
    return wheels


class Downloads:
    def __init__(self, files: dict[str, bytes], extra: dict[str, bytes] | None = None) -> None:
        self.files = files
        self.extra = extra
        self.calls = 0

    def __call__(self, spec: ModelSpec, into: Path) -> list[Path]:
        self.calls += 1
        return split_zip_wheels(into, self.files, self.extra)


def test_a_fetched_model_is_joined_verified_and_installed_once(tmp_path: Path) -> None:
    spec = spec_for(FILES)
    download = Downloads(FILES)
    folder = fetch(spec, tmp_path, download)
    assert folder == tmp_path / "tiny-model"
    assert {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} == set(
        FILES
    )
    assert verify(spec, folder) == []
    assert installed_folder(spec, tmp_path) == folder
    fetch(spec, tmp_path, download)  # verified copy in place: nothing is downloaded again
    assert download.calls == 1
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-model"]  # no work folder left


def test_a_download_that_differs_from_the_pinned_hashes_installs_nothing(
    tmp_path: Path,
) -> None:
    spec = spec_for(FILES)
    tampered = {**FILES, "sub/vocab.txt": b"a\nb\nX\n"}
    with pytest.raises(ModelUnavailableError, match=r"sub/vocab.txt: SHA-256 differs"):
        fetch(spec, tmp_path, Downloads(tampered))
    assert list(tmp_path.iterdir()) == []


def test_a_download_missing_a_pinned_file_installs_nothing(tmp_path: Path) -> None:
    spec = spec_for(FILES)
    with pytest.raises(ModelUnavailableError, match=r"config\.json is not in the archive"):
        fetch(spec, tmp_path, Downloads({"sub/vocab.txt": FILES["sub/vocab.txt"]}))
    assert list(tmp_path.iterdir()) == []


def test_only_the_pinned_files_leave_the_archive(tmp_path: Path) -> None:
    spec = spec_for(FILES)
    extra = {"desktop.ini": b"[x]", "../escaped.txt": b"outside", "run.py": b"print(1)"}
    folder = fetch(spec, tmp_path / "models", Downloads(FILES, extra))
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == ["config.json", "vocab.txt"]
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "models" / "escaped.txt").exists()


def test_an_installed_copy_that_was_changed_is_reported_and_replaced(tmp_path: Path) -> None:
    spec = spec_for(FILES)
    download = Downloads(FILES)
    folder = fetch(spec, tmp_path, download)
    (folder / "config.json").write_bytes(b"{}")
    assert verify(spec, folder) == ["config.json: SHA-256 differs from the pinned upstream hash"]
    fetch(spec, tmp_path, download)
    assert download.calls == 2
    assert verify(spec, folder) == []


def test_an_embedder_whose_model_is_not_installed_is_refused_naming_the_command(
    tmp_path: Path,
) -> None:
    with pytest.raises(ModelUnavailableError, match="uprof models fetch mpnet"):
        SentenceEmbedder.for_model("mpnet", models_dir=tmp_path)


def test_the_mpnet_pins_name_every_file_the_model_needs() -> None:
    assert MODELS["mpnet"] is MPNET
    assert len(MPNET.parts) == 5
    assert {"model.safetensors", "config.json", "modules.json", "tokenizer.json"} <= set(
        MPNET.files
    )
    assert not any(name.endswith((".bin", ".pkl", ".py")) for name in MPNET.files)  # no pickle
    assert all(len(sha) == 64 for sha in MPNET.files.values())


@pytest.mark.model
def test_the_installed_mpnet_verifies_and_embeds_768_unit_dimensions() -> None:
    """`make setup` runs `uprof models fetch mpnet`; this is that copy."""
    folder = installed_folder(MPNET, default_models_dir())
    assert verify(MPNET, folder) == []
    embedder = SentenceEmbedder.for_model("mpnet", torch_threads=1)
    vectors = embedder.embed(
        ["I am vegan", "Can you suggest a plant-based dinner?", "The train was late again"]
    )
    assert vectors.shape == (3, 768) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    one = embedder.embed(["I am vegan"])  # the single-text path gives encode's vector
    assert np.allclose(one[0], vectors[0], atol=1e-6)


def test_models_verify_exits_1_naming_a_changed_file(tmp_path: Path) -> None:
    folder = tmp_path / MPNET.name
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "uprof.cli.main", "models", "verify", "mpnet"),
            *("--models-dir", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    assert result.returncode == 1
    assert "config.json: SHA-256 differs" in result.stderr
    assert "model.safetensors: missing" in result.stderr


def test_models_fetch_refuses_a_name_that_is_not_fetched() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "uprof.cli.main", "models", "fetch", "minilm"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "name: 'minilm' is not a model to fetch" in result.stderr
