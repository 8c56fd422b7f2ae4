"""The house's import contracts (pyproject.toml ``[tool.importlinter]``) hold.

Imports point down (surfaces, uprof's services and adapters, then projections |
policies | audit, then domain; STYLE §1); surfaces reach the kernel only through
``uprof.facade``; the product never imports benchmarks/. A new import that breaks one
fails ``make test`` here, naming the import chain.
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout, result.stdout[-2000:]


def _layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layered,) = [c for c in contracts if c["type"] == "layers"]
    return [[m.strip() for m in re.split(r"[|:]", layer)] for layer in layered["layers"]]


def test_every_uprof_module_has_a_layer() -> None:
    """A new module under uprof/ must be placed in the layers contract, or it goes unchecked."""
    placed = {m for layer in _layers() for m in layer}
    modules = {
        f"uprof.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "uprof").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert modules - placed == set()
    assert [layer for layer in _layers() if layer[0] == "domain"] == [["domain"]]


def test_every_shipped_package_is_type_checked() -> None:
    """mypy (in ``make test``) checks every top-level package the wheel ships.

    benchmarks/ was left out once, and a call missing a newly required keyword argument
    passed the type check (only a slow test caught it).
    """
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = {p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]}
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert shipped == on_disk
    assert set(config["tool"]["mypy"]["packages"]) == shipped


def test_the_benchmarks_kernel_is_typed() -> None:
    """``open_kernel`` (every benchmark scenario's deployment) returned ``Any``, so mypy
    checked nothing the scenarios called on it: typing it surfaced 8 errors (a method
    assigned on an instance, a view-store method outside the port, an optional ledger
    used unchecked)."""
    from benchmarks.ledger_bench import ledger_of
    from benchmarks.reliability import kernel_on, open_kernel

    assert inspect.signature(open_kernel).return_annotation == "Uprof"
    assert inspect.signature(kernel_on).return_annotation == "Iterator[Uprof]"
    assert inspect.signature(ledger_of).return_annotation == "ErasureLedger"


# Each line: a module to add to a copy of the tree, what it imports, and the import chain
# lint-imports must then report (one case per contract).
BREACHES = [
    (
        "uprof/api/sneaky.py",
        "from uprof.services.erasure import ErasureService",
        "uprof.api.sneaky -> uprof.services.erasure",
    ),
    ("uprof/sneaky.py", "import benchmarks.report", "uprof.sneaky -> benchmarks.report"),
    (
        "uprof/services/sneaky.py",
        "from uprof.api.app import create_app",
        "uprof.services.sneaky -> uprof.api.app",
    ),
    (
        "projections/sneaky.py",
        "from uprof.settings import Settings",
        "projections.sneaky -> uprof.settings",
    ),
    ("policies/sneaky.py", "from audit.log import AuditLog", "policies.sneaky -> audit.log"),
    (
        "domain/sneaky.py",
        "from policies.rules import app_id_problem",
        "domain.sneaky -> policies.rules",
    ),
]


@pytest.mark.parametrize(("path", "source", "chain"), BREACHES, ids=[b[0] for b in BREACHES])
def test_each_contract_can_fail(tmp_path: Path, path: str, source: str, chain: str) -> None:
    """The contracts can fail: an import against each is reported, naming its chain."""
    copy = tmp_path / "tree"
    for package in ("uprof", "domain", "projections", "policies", "audit", "benchmarks"):
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    (copy / path).write_text(source + "\n", encoding="utf-8")
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--config", str(copy / "pyproject.toml")],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(copy), "PATH": ""},
    )
    assert result.returncode != 0
    assert chain in result.stdout
