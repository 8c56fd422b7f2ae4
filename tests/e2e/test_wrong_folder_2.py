"""What 0237-the-wrong-folder left (decision 0242-the-wrong-folder-2): a PostgreSQL URL
naming a database the server does not have, a wrong key folder beside a deployment's
data, and the two operator commands that still printed JSON. Each command runs as the
operator runs it, a process of its own."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import POSTGRES_ADMIN_URL, Backend

#: The exit code of a command sent where no deployment is (docs/cli.md's table).
NO_DEPLOYMENT = 8


def _env(place: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "UPROF_EMBEDDER": "hashing", **place}


def _run(env: dict[str, str], *args: str) -> Any:
    return children.run_python(children.CLI_SCRIPT, *args, env=env, timeout=300)


def _database_exists(name: str) -> bool:
    engine = sa.create_engine(POSTGRES_ADMIN_URL)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).first()
    finally:
        engine.dispose()
    return found is not None


# ---------------------------------------------- XC: a database the server does not have


@pytest.mark.parametrize("command", [["apps", "list"], ["init"], ["apps", "create", "app:x"]])
def test_xc_a_database_that_does_not_exist_is_no_deployment_not_an_outage(
    empty_backend: Backend, command: list[str]
) -> None:
    """Bug XC. A ``--database-url`` naming a database the server does not have (a typo'd
    name) was told as an outage: exit 1, "the database did not answer", retry later. The
    server answered, and its answer will not change by waiting: exit 8 now, naming the
    database and saying to create it or correct the name, for a command that reads and
    for those that start a deployment (``uprof init``, ``apps create``: uprof makes
    tables, never databases). Nothing is made: no database, no key folder; the URL's
    password is not shown."""
    if empty_backend.kind != "postgres":
        pytest.skip("a database on a server is PostgreSQL's")
    typo = f"{empty_backend.pg_dbname}_typo"
    # A password the refusal must not show (the server here trusts the loopback).
    url = sa.engine.make_url(empty_backend.url).set(database=typo, password="s3cret-pw")
    data = empty_backend.data_dir / "d"
    env = _env({"UPROF_DATA_DIR": str(data), "UPROF_DATABASE_URL": url.render_as_string(False)})
    done = _run(env, *command)
    flat = " ".join(done.stderr.split())
    assert done.returncode == NO_DEPLOYMENT, (done.returncode, flat[-400:])
    assert "Traceback" not in done.stderr
    assert typo in "".join(done.stderr.split())
    assert "does not exist" in flat
    assert "did not answer" not in flat and "retry" not in flat.lower()
    assert "s3cret-pw" not in done.stderr + done.stdout
    assert not _database_exists(typo)
    assert not data.with_name("d.keys").exists() and not data.exists()


def test_held_a_server_that_does_not_answer_is_still_an_outage(tmp_path: Path) -> None:
    """Held (XC's other side): a server that does not answer at all (nothing listens on
    the port) is still the outage, exit 1, whatever the command: the check that tells a
    missing database asks the server, and here no server answers."""
    url = sa.engine.make_url(POSTGRES_ADMIN_URL).set(port=9, database="uprof_anything")
    env = _env(
        {
            "UPROF_DATA_DIR": str(tmp_path / "d"),
            "UPROF_DATABASE_URL": url.render_as_string(False),
        }
    )
    for command in (["apps", "list"], ["init"]):
        done = _run(env, *command)
        flat = " ".join(done.stderr.split())
        assert done.returncode == 1, (command, done.returncode, flat[-400:])
        assert "did not answer" in flat, flat[-400:]
        assert "Traceback" not in done.stderr


# ------------------------------------------- XE: keys rotate and maintain in sentences


def _deployment_env(backend: Backend) -> dict[str, str]:
    place = {"UPROF_DATA_DIR": str(backend.data_dir / "data")}
    if backend.kind == "postgres":
        place["UPROF_DATABASE_URL"] = backend.url
    return _env(place)


def _said(env: dict[str, str], *args: str) -> str:
    done = _run(env, *args)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_xe_keys_rotate_and_maintain_say_what_they_did_in_words(backend: Backend) -> None:
    """Bug XE. ``uprof keys rotate`` and ``uprof maintain`` printed a JSON object where the
    CLI's convention is a sentence and ``--json`` for scripts (as 0237 made ``audit
    rotate-key``). Each says now what it did, with the same numbers; ``--json`` gives
    the object as before."""
    env = _deployment_env(backend)
    rotated = _said(env, "keys", "rotate")
    with pytest.raises(json.JSONDecodeError):
        json.loads(rotated)
    again = json.loads(_said(env, "keys", "rotate", "--json"))
    assert set(again) == {"epoch", "deks_rewrapped", "epochs_forgotten"}
    # The second rotation's epoch follows the first's, which the sentence named.
    assert rotated.startswith(f"data keys re-wrapped under KEK epoch {again['epoch'] - 1}: "), (
        rotated
    )
    assert "old KEK epoch" in rotated and "forgotten" in rotated, rotated

    ran = _said(env, "maintain")
    with pytest.raises(json.JSONDecodeError):
        json.loads(ran)
    assert ran.startswith("maintenance ran: 0 overdue intents expired, 0 memories archived"), ran
    assert "the views show" in ran, ran
    obj = json.loads(_said(env, "maintain", "--json"))
    assert obj == {"intents_expired": 0, "memories_archived": 0, "views_caught_up": 1}


# ------------------------------------ XD: a wrong key folder beside a deployment's data


@pytest.mark.parametrize("start", [["apps", "create", "app:planner"], ["init"]])
def test_xd_a_wrong_key_folder_beside_data_without_events_is_refused(
    empty_backend: Backend, start: list[str]
) -> None:
    """Bug XD. A deployment started by ``apps create`` (an API key, its audit entries, no
    captured event yet), then a command run with a wrong ``UPROF_KEY_DIR``: the start
    refused a key folder without a master key only when the event log held an event, so
    here it made new keys and answered: ``apps list`` said ``[]`` on SQLite (the key
    database is in the key folder) and the audit log went on under a new signing key.
    Now the audit log's entries count as the deployment's data too: exit 8, naming the
    key folder and the data's place, and nothing is made in the wrong folder; the right
    one still opens everything. ``uprof init`` alone writes an entry too (the seeded
    policy's), so a deployment it made is covered."""
    data = empty_backend.data_dir / "data"
    place = {"UPROF_DATA_DIR": str(data)}
    if empty_backend.kind == "postgres":
        place["UPROF_DATABASE_URL"] = empty_backend.url
    env = _env(place)
    made = _run(env, *start)
    assert made.returncode == 0, made.stderr
    wrong = empty_backend.data_dir / "elsewhere.keys"
    for command in (["apps", "list"], ["audit", "entries"], ["apps", "create", "app:other"]):
        done = _run({**env, "UPROF_KEY_DIR": str(wrong)}, *command)
        flat = "".join(done.stderr.split())
        assert done.returncode == NO_DEPLOYMENT, (command, done.returncode, done.stdout[-300:])
        assert "Traceback" not in done.stderr
        assert str(wrong) in flat, flat[-400:]
        named = empty_backend.pg_dbname if empty_backend.kind == "postgres" else str(data)
        assert named in flat, flat[-400:]
        assert not (wrong / "master.key").exists(), command
    listed = _run(env, "apps", "list")
    assert listed.returncode == 0, listed.stderr
    expected = ["app:planner"] if start[0] == "apps" else []
    assert [k["app_id"] for k in json.loads(listed.stdout)] == expected
