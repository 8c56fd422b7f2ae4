"""Stores that cannot be used, met at a start (decision 0247-wrong-stores-at-the-start):
a SQLite data folder that cannot be written, a PostgreSQL database that takes no
writes, a data or key folder whose path runs through a file. Each command runs as the
operator runs it, a process of its own (``tests.children.CLI_SCRIPT``); ``uprof serve``
too, whose start goes the same road (``uprof.bootstrap``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import POSTGRES_ADMIN_URL, Backend

#: The refusal's exit code: docs/cli.md's 1, "a refused key folder, data folder or lock
#: file" (the outage shares it, but its words say "retry"; these say what to change).
REFUSED = 1
#: A bad setting, naming it.
BAD_SETTING = 2


def _env(place: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "UPROF_EMBEDDER": "hashing", **place}


def _run(env: dict[str, str], *args: str) -> Any:
    return children.run_python(children.CLI_SCRIPT, *args, env=env, timeout=300)


def _flat(text: str) -> str:
    return " ".join(text.split())


@contextmanager
def _unwritable(paths: list[Path]) -> Iterator[None]:
    """``paths`` made unwritable for this process: as root (the workplace's user, whom
    ``chmod`` does not stop) immutable with ``chattr +i``, where the file system takes
    it (skipped where it does not: no other honest way is at hand); otherwise ``chmod
    a-w``. Put back at the end, so that the test's folder can be removed."""
    if os.geteuid() == 0:
        made = subprocess.run(
            ["chattr", "+i", *map(str, paths)], capture_output=True, text=True, check=False
        )
        if made.returncode != 0:
            subprocess.run(["chattr", "-i", *map(str, paths)], capture_output=True, check=False)
            pytest.skip(f"this file system takes no immutable flag: {made.stderr.strip()}")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", *map(str, paths)], check=True)
        return
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(modes[p] & ~0o222)
    try:
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def _sqlite_deployment(tmp_path: Path) -> tuple[dict[str, str], Path]:
    data, keys = tmp_path / "data", tmp_path / "keys"
    env = _env({"UPROF_DATA_DIR": str(data), "UPROF_KEY_DIR": str(keys)})
    made = _run(env, "init")
    assert made.returncode == 0, made.stderr[-600:]
    return env, data


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


#: What is made unwritable: the folder and its files (0244's case), the folder alone
#: (SQLite cannot make its journal there), the store files alone (``*.sqlite``; its lock
#: files unwritable too were refused on main already, naming the lock file).
WHAT = ["folder and files", "folder", "files"]
COMMANDS = {
    "apps list": ["apps", "list"],
    "apps create": ["apps", "create", "app:x"],
    "serve": ["serve", "--host", "127.0.0.1", "--port", "0", "--log-level", "warning"],
}


@pytest.mark.parametrize("what", WHAT)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_xq_a_data_folder_that_cannot_be_written_is_refused_not_an_outage(
    tmp_path: Path, what: str, command: str
) -> None:
    """Bug XQ. A SQLite deployment whose data folder, or its store files, cannot be
    written (immutable; a read-only mount; another user's mode) was told as the outage:
    "the database did not answer (OperationalError)", "retry after a few seconds", exit
    1. SQLite's "unable to open database file" is no server failing to answer: waiting
    changes nothing. Now a refusal naming the folder and what is wrong with it, the
    CLI's commands and ``uprof serve``'s start alike; nothing is changed there."""
    env, data = _sqlite_deployment(tmp_path)
    files = sorted(p for p in data.iterdir() if p.is_file())
    stores = [p for p in files if p.suffix == ".sqlite"]
    paths = {"folder and files": [data, *files], "folder": [data], "files": stores}[what]
    before = _contents(data)
    with _unwritable(paths):
        done = _run(env, *COMMANDS[command])
    flat = _flat(done.stderr)
    assert done.returncode == REFUSED, (done.returncode, flat[-600:])
    assert "Traceback" not in done.stderr
    assert "did not answer" not in flat and "retry" not in flat.lower(), flat[-600:]
    assert str(data) in "".join(done.stderr.split())
    assert "cannot be written" in flat
    # Every file there is as it was (a reader's look, read-only, may leave SQLite's
    # shared-memory file beside a WAL store where the folder can be written).
    after = _contents(data)
    assert {name: after.get(name) for name in before} == before


def test_xq_a_database_that_takes_no_writes_is_refused_by_name(empty_backend: Backend) -> None:
    """Bug XQ, PostgreSQL's form. SQLite's case has no PostgreSQL twin (the files are the
    server's, and a server that cannot write its files does not answer: the outage it
    is told as); its equivalent is a database that takes no writes: a standby, or one
    set ``default_transaction_read_only``. The start ended in a traceback
    (``InternalError: cannot execute CREATE TYPE in a read-only transaction``). Now a
    refusal naming the database and why, exit 1, for a reader and a creator."""
    if empty_backend.kind != "postgres":
        pytest.skip("a database that takes no writes is PostgreSQL's")
    env = _env(
        {
            "UPROF_DATABASE_URL": empty_backend.url,
            "UPROF_KEY_DIR": str(empty_backend.data_dir / "keys"),
        }
    )
    made = _run(env, "init")
    assert made.returncode == 0, made.stderr[-600:]
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f'ALTER DATABASE "{empty_backend.pg_dbname}" SET default_transaction_read_only = on'
            )
    finally:
        admin.dispose()
    for command in (["apps", "list"], ["apps", "create", "app:x"]):
        done = _run(env, *command)
        flat = _flat(done.stderr)
        assert done.returncode == REFUSED, (command, done.returncode, flat[-600:])
        assert "Traceback" not in done.stderr, flat[-600:]
        assert empty_backend.pg_dbname in flat
        assert "takes no writes" in flat and "retry" not in flat.lower()


@pytest.mark.parametrize("folder", ["UPROF_DATA_DIR", "UPROF_KEY_DIR"])
@pytest.mark.parametrize("command", [["apps", "list"], ["init"]])
def test_xr_a_folder_whose_path_runs_through_a_file_is_a_bad_setting(
    tmp_path: Path, folder: str, command: list[str]
) -> None:
    """Bug XR. A data folder or key folder named under a file (``FILE/data``: a typo, a
    file where a folder was meant) ended every command in a traceback
    (``NotADirectoryError`` out of the settings' walk of the path), exit 1. Now the
    setting is refused by name, exit 2, saying which part of the path is a file;
    nothing is made."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder\n")
    place = {"UPROF_DATA_DIR": str(tmp_path / "data"), "UPROF_KEY_DIR": str(tmp_path / "keys")}
    place[folder] = str(a_file / "inside")
    done = _run(_env(place), *command)
    flat = _flat(done.stderr)
    assert done.returncode == BAD_SETTING, (done.returncode, flat[-600:])
    assert "Traceback" not in done.stderr
    assert folder in flat
    assert "is a file" in flat and str(a_file) in "".join(done.stderr.split())
    assert a_file.read_text() == "not a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def _another_programs_events_file(folder: Path) -> Path:
    """``folder/events.sqlite``, another program's SQLite database (its own table, rows)."""
    import sqlite3

    folder.mkdir()
    path = folder / "events.sqlite"
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
        conn.executemany("INSERT INTO orders (item) VALUES (?)", [("tea",), ("cups",)])
        conn.commit()
    finally:
        conn.close()
    return path


@pytest.mark.parametrize(
    "command", [["init"], ["apps", "create", "app:x"], COMMANDS["serve"]], ids=" ".join
)
def test_xu_creating_refuses_a_store_file_of_another_program(
    tmp_path: Path, command: list[str]
) -> None:
    """Bug XU (0244's Left, after XO). A data folder holding only another program's
    ``events.sqlite`` (its own tables, none of uprof's): a command that makes a
    deployment (``init``, ``apps create``, ``serve``) made one there, writing uprof's
    tables into that program's database (and switching it to WAL), then answered exit
    0. Now refused, exit 8 as the other wrong places, naming the file and its tables;
    the file is as it was and nothing is made, in the data folder or the key folder."""
    data, keys = tmp_path / "data", tmp_path / "keys"
    foreign = _another_programs_events_file(data)
    before = foreign.read_bytes()
    done = _run(_env({"UPROF_DATA_DIR": str(data), "UPROF_KEY_DIR": str(keys)}), *command)
    flat = _flat(done.stderr)
    assert done.returncode == 8, (done.returncode, flat[-600:])
    assert "Traceback" not in done.stderr
    assert "events.sqlite" in flat and "orders" in flat and "another program" in flat
    assert foreign.read_bytes() == before
    assert sorted(p.name for p in data.iterdir()) == ["events.sqlite"]
    assert not keys.exists()
