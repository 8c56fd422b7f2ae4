"""A command run where no deployment is: a typo'd ``--data-dir``, the wrong working
directory, a missing ``UPROF_DATA_DIR``, a ``--database-url`` naming a database without
uprof's tables (decision 0237-the-wrong-folder).

Until then every command made a new, empty deployment there and answered about it: an
auditor's ``uprof audit residue`` said "residue: 0", ``apps list`` "[]", ``backup`` wrote
a backup of nothing, ``audit rotate-key`` rotated a key no one uses: a check that cannot
fail, told as a pass. A command that reads or changes an existing deployment now refuses
such a place, naming it and how to make one, exit 8, and leaves it as it was; the
commands that start a deployment (``uprof init``, ``serve``, ``apps create``, ...) still
make one. Each command runs as the operator runs it, a process of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer

from tests import children
from tests.conftest import Backend
from uprof.cli.main import app

#: The exit code of a command run where no deployment is (docs/cli.md's table).
NO_DEPLOYMENT = 8

#: Every command that reads or changes an existing deployment, with arguments enough to
#: reach its stores (files it names are made by ``_needs``).
READS: dict[str, list[str]] = {
    "apps list": ["apps", "list"],
    "apps revoke": ["apps", "revoke", "k1"],
    "audit checkpoint": ["audit", "checkpoint", "--out", "{tmp}/note"],
    "audit entries": ["audit", "entries"],
    "audit export": ["audit", "export", "--out", "{tmp}/trail.jsonl"],
    "audit keys": ["audit", "keys", "--out", "{tmp}/keys.json"],
    "audit prove": ["audit", "prove", "--old-size", "1", "--out", "{tmp}/proof.json"],
    "audit public-key": ["audit", "public-key", "--out", "{tmp}/audit.pem"],
    "audit receipts": ["audit", "receipts"],
    "audit residue": ["audit", "residue", "--term", "alice"],
    "audit rotate-key": ["audit", "rotate-key"],
    "audit rotation-proof": ["audit", "rotation-proof", "{tmp}/given", "--out", "{tmp}/rp"],
    "backup": ["backup", "--to", "{tmp}/backup"],
    "consent list": ["consent", "list", "--subject", "alice"],
    "consent withdraw": ["consent", "withdraw", "--subject", "alice", "--consent", "c1"],
    "erase event": ["erase", "event", "--subject", "alice", "--capture", "c1"],
    "erase item": ["erase", "item", "--subject", "alice", "--item", "i1"],
    "erase settle-host": ["erase", "settle-host", "gone-host", "--yes"],
    "erase subject": ["erase", "subject", "--subject", "alice"],
    "export-subject": ["export-subject", "--subject", "alice", "--out", "{tmp}/alice.json"],
    "import": ["import", "{tmp}/given", "--dry-run"],
    "keys move-out": ["keys", "move-out"],
    "keys rotate": ["keys", "rotate"],
    "maintain": ["maintain"],
    "policy history": ["policy", "history"],
    "policy show": ["policy", "show"],
    "profile evidence": ["profile", "evidence", "--subject", "alice", "--item", "i1"],
    "profile memories": ["profile", "memories", "--subject", "alice"],
    "profile show": ["profile", "show", "--subject", "alice"],
    "projections lag": ["projections", "lag"],
    "projections rebuild": ["projections", "rebuild"],
    "projections run": ["projections", "run"],
    "quarantine list": ["quarantine", "list"],
    "quarantine retry": ["quarantine", "retry", "--all"],
    "slice": ["slice", "trip", "--app", "app:x", "--agent", "agent:a", "--purpose", "p"],
    "subjects list": ["subjects", "list"],
    "subjects recreate": ["subjects", "recreate", "--subject", "alice"],
}

#: The commands that start a deployment where there is none: their work is its first data.
#: (``import`` without ``--dry-run`` is one; its dry run, which writes nothing, is above.)
CREATES = {
    "init",
    "serve",
    "worker",
    "mcp",
    "apps create",
    "consent grant",
    "capture",
    "policy grant",
    "policy revoke",
    "restore",
    "demo",  # a deployment of its own, in its own folder
}

#: Commands that open no deployment: offline verifiers, the extractor's and the models'
#: checks, the benchmarks (each makes its own stores).
OFFLINE = {
    "audit verify",
    "audit verify-proof",
    "audit verify-receipt",
    "extractor check",
    "models fetch",
    "models verify",
}


def _leaves(group: Any, path: tuple[str, ...] = ()) -> Iterator[str]:
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            yield from _leaves(command, (*path, name))
        else:
            yield " ".join((*path, name))


def test_every_command_is_known_to_read_or_to_create() -> None:
    """The lists above are the CLI: a command added later is classified here, and so
    tested below (``bench`` makes its own stores)."""
    leaves = {c for c in _leaves(typer.main.get_command(app)) if not c.startswith("bench ")}
    known = set(READS) | CREATES | OFFLINE
    assert leaves == known, (sorted(leaves - known), sorted(known - leaves))


def _env(place: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "UPROF_EMBEDDER": "hashing", **place}


def _needs(tmp: Path) -> None:
    """The files the commands above name (each exists, so click lets the command run)."""
    (tmp / "given").write_text('{"subject": "alice"}\n', encoding="utf-8")


def _run(args: list[str], env: dict[str, str], tmp: Path) -> Any:
    argv = [a.replace("{tmp}", str(tmp)) for a in args]
    return children.run_python(children.CLI_SCRIPT, *argv, env=env, timeout=300)


def _run_all(commands: dict[str, list[str]], env: dict[str, str], tmp: Path) -> dict[str, Any]:
    # Three at a time: each is a short process; the machine is shared.
    with ThreadPoolExecutor(3) as pool:
        done = {name: pool.submit(_run, args, env, tmp) for name, args in commands.items()}
        return {name: future.result() for name, future in done.items()}


def _wrong_place(backend: Backend) -> tuple[dict[str, str], str, list[Path]]:
    """Where the commands are sent (env), the text naming it, and the folders that must
    not appear."""
    data = backend.data_dir / "typo"
    env = {"UPROF_DATA_DIR": str(data)}
    if backend.kind == "sqlite":
        return env, str(data), [data, data.with_name("typo.keys")]
    env["UPROF_DATABASE_URL"] = backend.url
    return env, backend.pg_dbname, [data.with_name("typo.keys")]


def _tables(backend: Backend) -> list[str]:
    engine = sa.create_engine(backend.url)
    try:
        with engine.connect() as conn:
            return sorted(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_wm_a_command_of_a_deployment_refuses_a_place_that_holds_none(
    empty_backend: Backend,
) -> None:
    """Bug WM. Every command of READS, sent where no deployment is, made one and answered
    about it (exit 0 for most: "residue: 0", "[]", a backup written); each now exits 8
    naming the place and how to make a deployment, and nothing is made there."""
    tmp = empty_backend.data_dir / "files"
    tmp.mkdir()
    _needs(tmp)
    place, named, folders = _wrong_place(empty_backend)
    results = _run_all(READS, _env(place), tmp)
    wrong = {}
    for name, done in results.items():
        flat = " ".join(done.stderr.split())
        if (
            done.returncode != NO_DEPLOYMENT
            or "Traceback" in done.stderr
            or named not in "".join(done.stderr.split())
            or "uprof init" not in flat
        ):
            wrong[name] = (done.returncode, flat[-300:])
    assert wrong == {}
    assert [f for f in folders if f.exists()] == []
    if empty_backend.kind == "postgres":
        assert _tables(empty_backend) == []
    assert not (tmp / "backup").exists()


def test_wm_the_refusal_names_the_url_without_its_password(empty_backend: Backend) -> None:
    """Bug WM, PostgreSQL: the URL is named as the user gave it, its password hidden."""
    if empty_backend.kind != "postgres":
        pytest.skip("a URL is PostgreSQL's")
    url = sa.engine.make_url(empty_backend.url).set(password="s3cret-pw")
    env = _env(
        {
            "UPROF_DATA_DIR": str(empty_backend.data_dir / "d"),
            "UPROF_DATABASE_URL": url.render_as_string(hide_password=False),
        }
    )
    done = _run(["audit", "residue", "--term", "alice"], env, empty_backend.data_dir)
    assert done.returncode == NO_DEPLOYMENT, done.stderr
    assert "s3cret-pw" not in done.stderr + done.stdout
    assert url.render_as_string(hide_password=True) in "".join(done.stderr.split())


def test_wm_init_makes_the_deployment_the_commands_then_read(empty_backend: Backend) -> None:
    """Bug WM's way out, as the refusal says: ``uprof init`` makes a deployment where
    there is none and says where; then the same commands answer about it, and ``init``
    again says it found one and changes nothing."""
    tmp = empty_backend.data_dir / "files"
    tmp.mkdir()
    place, named, _ = _wrong_place(empty_backend)
    env = _env(place)
    made = _run(["init"], env, tmp)
    assert made.returncode == 0, made.stderr
    assert "made a new uprof deployment" in " ".join(made.stdout.split()), made.stdout
    assert named in "".join(made.stdout.split())
    listed = _run(["apps", "list"], env, tmp)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    again = _run(["init"], env, tmp)
    assert again.returncode == 0, again.stderr
    assert "found a uprof deployment" in " ".join(again.stdout.split()), again.stdout


def test_held_apps_create_still_starts_a_deployment(empty_backend: Backend) -> None:
    """Held: README's first command, ``apps create`` in a new folder, makes the deployment
    and its key, as before; ``apps list`` then lists the key."""
    tmp = empty_backend.data_dir / "files"
    tmp.mkdir()
    place, _, _ = _wrong_place(empty_backend)
    env = _env(place)
    made = _run(["apps", "create", "app:planner"], env, tmp)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip().splitlines()[-1].startswith("upk_")
    listed = _run(["apps", "list"], env, tmp)
    assert [k["app_id"] for k in json.loads(listed.stdout)] == ["app:planner"]


def test_wm_import_dry_run_refuses_and_an_import_still_creates(empty_backend: Backend) -> None:
    """Bug WM: ``import --dry-run`` writes nothing by its own words; where no deployment
    is, it made one (and refused every record: no consent). It refuses the place now;
    an import that writes starts one as before (its records then fail: no consent)."""
    tmp = empty_backend.data_dir / "files"
    tmp.mkdir()
    _needs(tmp)
    place, _, folders = _wrong_place(empty_backend)
    env = _env(place)
    dry = _run(["import", "{tmp}/given", "--dry-run"], env, tmp)
    assert dry.returncode == NO_DEPLOYMENT, dry.stderr
    assert [f for f in folders if f.exists()] == []
    real = _run(["import", "{tmp}/given", "--app", "app:x"], env, tmp)
    assert real.returncode == 1, real.stderr
    assert "failed line 1" in real.stderr
    assert _run(["projections", "lag"], env, tmp).returncode == 0


def test_held_offline_verifiers_open_no_deployment(tmp_path: Path) -> None:
    """Held: ``audit verify``, ``verify-receipt`` and ``verify-proof`` read only the files
    handed to them: run anywhere, they make no data or key folder (a bad file is refused,
    exit 1, as before)."""
    data = tmp_path / "nowhere"
    env = _env({"UPROF_DATA_DIR": str(data)})
    (tmp_path / "given").write_text("{}\n", encoding="utf-8")
    (tmp_path / "k.pem").write_text("not a key\n", encoding="utf-8")
    runs = {
        "verify": ["audit", "verify", "{tmp}/given", "--public-key", "{tmp}/k.pem"],
        "receipt": ["audit", "verify-receipt", "{tmp}/given", "--public-key", "{tmp}/k.pem"],
        "proof": [
            "audit",
            "verify-proof",
            "{tmp}/given",
            "--public-key",
            "{tmp}/k.pem",
            "--trusted-checkpoint",
            "{tmp}/given",
        ],
    }
    results = _run_all(runs, env, tmp_path)
    assert {n: r.returncode for n, r in results.items()} == dict.fromkeys(runs, 1)
    assert all("Traceback" not in r.stderr for r in results.values())
    assert not data.exists() and not data.with_name("nowhere.keys").exists()
