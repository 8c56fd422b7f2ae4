"""The house's import contracts (pyproject.toml ``[tool.importlinter]``) hold.

Surfaces (REST, MCP, web, CLI, SDK) reach the kernel only through ``uprof.facade``;
the domain depends on nothing of the service. A new import that breaks either fails
``make test`` here, naming the import chain.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_a_surface_importing_a_service_breaks_the_contract(tmp_path: Path) -> None:
    """The contract can fail: a surface module that imports a service is reported."""
    import shutil

    copy = tmp_path / "tree"
    for package in ("uprof", "domain", "projections", "policies", "audit", "benchmarks"):
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    (copy / "uprof" / "api" / "sneaky.py").write_text(
        "from uprof.services.erasure import ErasureService\n", encoding="utf-8"
    )
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
    assert "uprof.api.sneaky -> uprof.services.erasure" in result.stdout
