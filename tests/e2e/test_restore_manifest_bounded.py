"""``uprof restore --from`` reads the backup's manifest within a bound (bug OG, decision
0184's Left).

``read_manifest`` read ``manifest.json`` whole (``read_text``): ``is_file()`` kept FIFOs and
devices out, but a sparse regular file of any size was read to its end, all of it held
at once (a ``MemoryError`` traceback for a large one). The manifest is now read like
every file the CLI takes whole (``uprof.documents.read_at_most``): one over 16 MiB is
refused by its size, before a byte is read, exit 2 naming ``--from`` and the limit.
Nothing of the deployment is touched: the manifest is read before anything else.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from uprof.cli.context import STATE
from uprof.cli.main import app

LIMIT = 16 * 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def _backup_with_manifest_of(folder: Path, size: int) -> Path:
    backup = folder / "backup"
    backup.mkdir()
    with (backup / "manifest.json").open("wb") as f:  # sparse: costs no disk
        f.truncate(size)
    return backup


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data"
    monkeypatch.setenv("UPROF_DATA_DIR", str(data))
    monkeypatch.setenv("UPROF_EMBEDDER", "hashing")
    for name in ("data_dir", "key_dir", "database_url", "embedder"):
        monkeypatch.setattr(STATE, name, getattr(STATE, name))
    return data


def _said(result: object) -> str:
    return " ".join(result.output.replace("│", " ").split())  # type: ignore[attr-defined]


def test_a_manifest_over_the_limit_is_refused_by_its_size(deployment: Path, tmp_path: Path) -> None:
    """OG: 16 MiB + 1 is refused, exit 2, naming --from and the limit (on main: read
    whole, then refused as not JSON, the limit named nowhere)."""
    backup = _backup_with_manifest_of(tmp_path, LIMIT + 1)
    result = CliRunner().invoke(app, ["restore", "--from", str(backup)])
    said = _said(result)
    assert result.exit_code == 2, (result.exception, said)
    assert "--from" in said and str(LIMIT) in said, said
    assert not deployment.exists()


def test_a_manifest_at_the_limit_is_read(deployment: Path, tmp_path: Path) -> None:
    """Held, the edge: exactly 16 MiB is read, and refused as what it is (not JSON)."""
    backup = _backup_with_manifest_of(tmp_path, LIMIT)
    result = CliRunner().invoke(app, ["restore", "--from", str(backup)])
    said = _said(result)
    assert result.exit_code == 2 and "not JSON" in said and str(LIMIT) not in said, said


def test_a_huge_sparse_manifest_costs_no_memory(deployment: Path, tmp_path: Path) -> None:
    """OG: a sparse manifest of 8 GiB, the CLI in a process capped at 2 GiB of address
    space: refused, exit 2 (on main: ``MemoryError``, a traceback, exit 1)."""
    backup = _backup_with_manifest_of(tmp_path, 8 << 30)
    memory = 1 << 31
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
        from uprof.cli.main import app
        sys.argv = ["uprof", "restore", "--from", {str(backup)!r}]
        app()
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said[-800:]
    assert "MemoryError" not in said and str(LIMIT) in said, said[-800:]
