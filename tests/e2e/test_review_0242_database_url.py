"""Review of 0237-the-wrong-folder and 0242-the-wrong-folder-2 (decision
0244-review-of-0235-to-0242): the database URL as an operator writes it. Each command
runs as the operator runs it, a process of its own, against a PostgreSQL database made
for the test (SQLite has no URL: these cases are PostgreSQL's)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import Backend

#: The exit code of a command sent where no deployment is (docs/cli.md's table).
NO_DEPLOYMENT = 8
#: A password the CLI must never show (the server here trusts the loopback, so any works).
SECRET = "s3cret-in-query"


def _env(place: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "UPROF_EMBEDDER": "hashing", **place}


def _run(env: dict[str, str], *args: str) -> Any:
    return children.run_python(children.CLI_SCRIPT, *args, env=env, timeout=300)


def _postgres_only(backend: Backend) -> None:
    if backend.kind != "postgres":
        pytest.skip("a database URL is PostgreSQL's")


# ------------------------------------------ XI: a password in the URL's query string


@pytest.mark.parametrize("situation", ["database missing", "database empty", "init"])
def test_xi_a_password_in_the_urls_query_is_never_shown(
    empty_backend: Backend, situation: str
) -> None:
    """Bug XI. libpq (and so psycopg and SQLAlchemy) takes the password in the URL's
    query string as well as before the host (``...?password=...``). The CLI names the
    place it was sent to with "the password hidden" (0237's WM refusal, 0242's XC
    refusal, `uprof init`'s own sentence), but hid only the one before the host: the
    query's password was printed whole, to stderr or stdout."""
    _postgres_only(empty_backend)
    given = sa.engine.make_url(empty_backend.url)
    if situation == "database missing":
        given = given.set(database=f"{empty_backend.pg_dbname}_typo")
    url = given.update_query_dict({"password": SECRET}).render_as_string(hide_password=False)
    data = empty_backend.data_dir / "d"
    env = _env({"UPROF_DATA_DIR": str(data), "UPROF_DATABASE_URL": url})
    command = ["init"] if situation == "init" else ["apps", "list"]
    done = _run(env, *command)
    said = done.stdout + done.stderr
    expected = 0 if situation == "init" else NO_DEPLOYMENT
    assert done.returncode == expected, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert given.database in "".join(said.split())  # the place is still named
    assert SECRET not in "".join(said.split()), said[-600:]  # the console wraps lines


# ------------------------------------------- XJ: postgresql:// without a driver named


@pytest.mark.parametrize("command", [["apps", "list"], ["init"]])
def test_xj_a_plain_postgresql_url_is_used_not_a_traceback(
    empty_backend: Backend, command: list[str]
) -> None:
    """Bug XJ. The settings accept ``postgresql://`` (libpq's own form, what psql and
    pg_dump take), but SQLAlchemy reads it as the psycopg2 driver, which uprof does not
    ship: every command that opened the stores ended in a traceback (``ModuleNotFoundError:
    No module named 'psycopg2'``, exit 1), a reader too before it could say that no
    deployment is there. uprof talks to PostgreSQL through psycopg 3 only: the URL is
    used through it."""
    _postgres_only(empty_backend)
    given = sa.engine.make_url(empty_backend.url).set(drivername="postgresql", password=SECRET)
    plain = given.render_as_string(hide_password=False)
    assert plain.startswith("postgresql://")
    data = empty_backend.data_dir / "d"
    env = _env({"UPROF_DATA_DIR": str(data), "UPROF_DATABASE_URL": plain})
    done = _run(env, *command)
    said = done.stdout + done.stderr
    assert "Traceback" not in said, said[-800:]
    assert SECRET not in "".join(said.split())
    if command == ["init"]:
        assert done.returncode == 0, said[-600:]
        listed = _run(env, "apps", "list")
        assert listed.returncode == 0, (listed.stdout + listed.stderr)[-600:]
    else:
        assert done.returncode == NO_DEPLOYMENT, (done.returncode, said[-600:])


# ---------------------------------------- XK: a backup folder named as the data folder


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["apps", "list"], id="reader with the deployment's key folder"),
        pytest.param(["apps", "list"], id="reader with no key folder"),
        pytest.param(["apps", "create", "app:z"], id="creator with the deployment's key folder"),
    ],
)
def test_xk_a_backup_folder_named_as_the_data_folder_is_refused_untouched(
    tmp_path: Path, command: list[str], request: pytest.FixtureRequest
) -> None:
    """Bug XK. ``uprof backup --to B`` writes the stores' files and a signed manifest of
    their checksums into B. A command sent with ``--data-dir B`` (the backup's folder
    taken for the deployment's: the same files are there) found "a deployment" there
    (0237's check: ``views.sqlite`` is a file) and opened it: the start switched the
    copies to WAL (their headers rewritten), a reader's audit entry went in, lock files
    were added, and ``uprof restore --from B`` then refused the backup ("events.sqlite is
    missing or does not match its checksum"). Even a start refused for its key folder
    (0242's XD, exit 8, "nothing was made") had rewritten them first. A folder holding a
    uprof backup's manifest is no deployment: refused before anything opens it, exit 8,
    saying so, the backup left as it was and still restorable. SQLite's: a PostgreSQL
    backup is a dump file, not a store anything opens."""
    data, backup = tmp_path / "d", tmp_path / "b"
    env = _env({"UPROF_DATA_DIR": str(data)})
    for setup in (["init"], ["apps", "create", "app:a"], ["backup", "--to", str(backup)]):
        done = _run(env, *setup)
        assert done.returncode == 0, done.stderr[-600:]
    before = _files(backup)
    place = {"UPROF_DATA_DIR": str(backup)}
    if "no key folder" not in request.node.callspec.id:
        place["UPROF_KEY_DIR"] = str(data.with_name("d.keys"))
    done = _run(_env(place), *command)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == NO_DEPLOYMENT, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert "backup" in said and "restore" in said, said[-600:]
    assert _files(backup) == before  # nothing opened, nothing added
    assert not backup.with_name("b.keys").exists()
    restored = _run(env, "restore", "--from", str(backup))
    assert restored.returncode == 0, restored.stderr[-600:]


# -------------------------------- XL: the wrong key folder a refused start had made


def test_xl_a_start_refused_for_its_key_folder_leaves_no_key_folder(
    empty_backend: Backend,
) -> None:
    """Bug XL. 0242's XD refuses a key folder without a master key beside a deployment's
    data (exit 8), saying "nothing was made in the folder named"; on SQLite the start had
    made that folder (empty, mode 0700) before it looked, and left it: a typo'd
    ``--key-dir`` left a folder at the typo. A folder this start made is taken away
    again when it refuses; one that was there before is left as it was."""
    data = empty_backend.data_dir / "data"
    place = {"UPROF_DATA_DIR": str(data)}
    if empty_backend.kind == "postgres":
        place["UPROF_DATABASE_URL"] = empty_backend.url
    env = _env(place)
    made = _run(env, "init")
    assert made.returncode == 0, made.stderr[-600:]
    wrong = empty_backend.data_dir / "typo" / "elsewhere.keys"
    done = _run({**env, "UPROF_KEY_DIR": str(wrong)}, "apps", "list")
    said = " ".join(done.stderr.split())
    assert done.returncode == NO_DEPLOYMENT, (done.returncode, said[-600:])
    assert "nothing was made" in said
    assert not wrong.exists(), sorted(p.name for p in wrong.iterdir())
    assert not wrong.parent.exists()  # nor the folder above it, made for it
    there = empty_backend.data_dir / "there.keys"
    there.mkdir(mode=0o700)
    done = _run({**env, "UPROF_KEY_DIR": str(there)}, "apps", "list")
    assert done.returncode == NO_DEPLOYMENT, done.stderr[-600:]
    assert there.is_dir() and not any(there.iterdir())  # its own folder, left as it was


# ------------------------------------ XN: a URL that leaves the database or user out


@pytest.fixture
def role_of_its_own(empty_backend: Backend) -> Iterator[str]:
    """A login role with a database of its own name (libpq's default database), made for
    the test and dropped after; the server trusts the loopback."""
    _postgres_only(empty_backend)
    role = f"{empty_backend.pg_dbname}_role"
    admin = sa.create_engine(
        sa.engine.make_url(empty_backend.url).set(database="postgres"),
        isolation_level="AUTOCOMMIT",
        poolclass=sa.pool.NullPool,
    )
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
            conn.execute(sa.text(f'CREATE DATABASE "{role}" OWNER "{role}"'))
        yield role
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{role}" WITH (FORCE)'))
            conn.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


@pytest.mark.parametrize("left_out", ["database", "user"])
def test_xn_a_url_that_leaves_the_database_or_user_out_is_refused_naming_the_field(
    empty_backend: Backend, role_of_its_own: str, left_out: str
) -> None:
    """Bug XN. A PostgreSQL URL is read twice: SQLAlchemy's engines (views, keys, the
    start's checks) hand it to libpq, which fills a database left out with the user's
    name and a user left out with the system user's; the event log's settings
    (``layout``) filled both with ``postgres``. A URL naming no database, for a role
    whose own database exists: the views went into that database and the event log into
    ``postgres``, where PostgreSQL 15 refuses the role: a traceback ("permission denied
    for schema public", exit 1); a role allowed there would have split the deployment
    over two databases. The URL must name both: exit 2 naming ``database_url``."""
    given = sa.engine.make_url(empty_backend.url)
    # ``URL.set`` keeps a part given None: ``_replace`` leaves it out.
    if left_out == "database":
        url = given._replace(username=role_of_its_own, database=None)
    else:
        url = given._replace(username=None, database=role_of_its_own)
    assert (url.database if left_out == "database" else url.username) is None
    env = _env(
        {
            "UPROF_DATA_DIR": str(empty_backend.data_dir / "d"),
            "UPROF_DATABASE_URL": url.render_as_string(hide_password=False),
        }
    )
    done = _run(env, "init")
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert "database_url" in said.lower() and left_out in said, said[-600:]
    probe = sa.create_engine(given.set(database=role_of_its_own), poolclass=sa.pool.NullPool)
    try:
        with probe.connect() as conn:  # nothing was made in the role's own database
            assert sa.inspect(conn).get_table_names() == []
    finally:
        probe.dispose()


# ------------------------------ XO: another program's SQLite file in the data folder


def test_xo_another_programs_sqlite_file_in_the_folder_is_no_deployment(tmp_path: Path) -> None:
    """Bug XO. 0237's check found "a deployment" in a data folder as soon as one of
    ``views.sqlite``, ``events.sqlite``, ``policies.sqlite`` was a file. A folder holding
    another program's ``events.sqlite`` (its own tables, its own rows) was taken for one:
    a reader (``apps list``) made a new deployment there (uprof's tables written into
    the other program's database, ``views.sqlite``, ``policies.sqlite``, a key folder with
    new keys) and answered ``[]``, exit 0: WM again, through a file of another format. A
    file is a deployment's when it holds one of uprof's tables (as PostgreSQL's check
    asks of the database), or cannot be read as SQLite at all (damage, which the start
    names, exit 7); read without writing. SQLite's: PostgreSQL's check reads the tables
    already (0237)."""
    folder = tmp_path / "d"
    folder.mkdir()
    other = sqlite3.connect(folder / "events.sqlite")
    other.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
    other.execute("INSERT INTO orders VALUES (1, 42)")
    other.commit()
    other.close()
    before = _files(folder)
    done = _run(_env({"UPROF_DATA_DIR": str(folder)}), "apps", "list")
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == NO_DEPLOYMENT, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert _files(folder) == before  # the other program's file as it was, nothing added
    assert not folder.with_name("d.keys").exists()


def test_held_a_damaged_store_file_still_reaches_the_starts_damage_check(tmp_path: Path) -> None:
    """Held beside XO: a store file that is no SQLite database at all (overwritten,
    truncated) is still the deployment's, damaged: exit 7 as before, not "no deployment"
    (exit 8), which would send its operator to make a new one."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "views.sqlite").write_bytes(b"not a database, overwritten by hand\n" * 40)
    done = _run(_env({"UPROF_DATA_DIR": str(folder)}), "apps", "list")
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 7, (done.returncode, said[-600:])
    assert "Traceback" not in said


# ------------------------------------------- XP: a deployment a newer uprof has upgraded


FUTURE_REVISION = "0999_from_a_newer_uprof"


def test_xp_a_deployment_a_newer_release_upgraded_is_refused_not_a_traceback(
    empty_backend: Backend,
) -> None:
    """Bug XP. A deployment whose stores a newer uprof has migrated (an older CLI run on
    it, a release rolled back) is "a deployment of another format": 0237's check finds
    it, and the start's migration met a revision this release does not have: a
    traceback, alembic's ``CommandError: Can't locate revision identified by ...``, exit
    1. ``uprof restore`` has refused such a backup by name since bug JI; the start now
    says the same, naming the store and the revision, and changes nothing."""
    data = empty_backend.data_dir / "data"
    place = {"UPROF_DATA_DIR": str(data)}
    if empty_backend.kind == "postgres":
        place["UPROF_DATABASE_URL"] = empty_backend.url
    env = _env(place)
    made = _run(env, "init")
    assert made.returncode == 0, made.stderr[-600:]
    views_url = (
        empty_backend.url
        if empty_backend.kind == "postgres"
        else f"sqlite:///{data / 'views.sqlite'}"
    )
    engine = sa.create_engine(views_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            rows = [r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))]
            views = next(r for r in rows if "views" in r)
            conn.execute(
                sa.text("UPDATE alembic_version SET version_num = :f WHERE version_num = :v"),
                {"f": FUTURE_REVISION, "v": views},
            )
        done = _run(env, "apps", "list")
        said = " ".join((done.stdout + done.stderr).split())
        assert "Traceback" not in said, said[-800:]
        assert done.returncode != 0, said[-600:]
        assert FUTURE_REVISION in said and "newer" in said, said[-600:]
        with engine.connect() as conn:  # nothing was changed
            after = {r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))}
        assert FUTURE_REVISION in after and views not in after
    finally:
        engine.dispose()
