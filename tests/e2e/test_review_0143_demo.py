"""Review of 0143 (bug IH): ``uprof demo`` run from a deployment's shell.

The demo is a scratch deployment in its own folder (``--data-dir``, "where the demo keeps
its SQLite stores"), but it took every other setting from the environment: with
``UPROF_KEY_DIR`` set, as a deployment's shell has it, ``uprof demo --fresh`` deleted
*the deployment's* key folder (master key, data keys, audit key, erasure ledger: every
subject unreadable for good), and without ``--fresh`` the demo's log raised the key
folder's audit checkpoint note, so the deployment's next start was refused (bug HT's
check). With ``UPROF_DATABASE_URL`` set the demo wrote its subjects into the deployment's
database. Real processes: the CLI as an operator runs it, both backends.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Backend

_CLI = "from uprof.cli.main import app; app()"


def _uprof(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CLI, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[2],
    )


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.endswith(".lock")
    }


@pytest.mark.parametrize("fresh", [True, False])
def test_the_demo_leaves_the_deployment_of_its_shell_alone(
    backend: Backend, tmp_path: Path, fresh: bool
) -> None:
    live_data, live_keys = tmp_path / "live", tmp_path / "live.keys"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "UPROF_EMBEDDER": "hashing",
        "UPROF_DATA_DIR": str(live_data),
        "UPROF_KEY_DIR": str(live_keys),
    }
    if backend.kind == "postgres":
        env["UPROF_DATABASE_URL"] = backend.url
    else:
        env.pop("UPROF_DATABASE_URL", None)
    grant = ("consent", "grant", "--subject", "alice", "--app", "app:planner")
    done = _uprof(env, *grant, "--category", "*", "--purpose", "personalization")
    assert done.returncode == 0, done.stderr
    done = _uprof(env, "audit", "checkpoint", "--out", str(tmp_path / "checkpoint.txt"))
    assert done.returncode == 0, done.stderr
    keys_before = _digests(live_keys)

    demo = ["demo", "--data-dir", str(tmp_path / "demo")] + (["--fresh"] if fresh else [])
    done = _uprof(env, *demo)
    assert done.returncode == 0, done.stdout + done.stderr

    assert _digests(live_keys) == keys_before  # nothing of the deployment's keys changed
    done = _uprof(env, "subjects", "list")
    assert done.returncode == 0, done.stderr  # the deployment still starts
    assert "maya" not in done.stdout and "tomas" not in done.stdout  # the demo's subjects
