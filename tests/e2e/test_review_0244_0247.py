"""Review of 0244-review-of-0235-to-0242 and 0247-wrong-stores-at-the-start (decision
0248-review-of-0244-and-0247): their fixes attacked from outside, as a hostile or unlucky
operator runs the CLI (a process of its own, ``tests.children.CLI_SCRIPT``), on SQLite
and on a PostgreSQL database made for the test. Bugs XW to YA, and the attacks that held."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests import children
from tests.conftest import POSTGRES_ADMIN_URL, Backend
from tests.e2e.test_wrong_stores_at_the_start import _unwritable  # 0247's helper

#: docs/cli.md's exit codes: a refused folder, data folder or lock file (the outage
#: shares 1, but says "retry"); a bad setting; a place holding no deployment.
REFUSED = 1
BAD_SETTING = 2
NO_DEPLOYMENT = 8
#: A password no output may show (the server here trusts the loopback: any works).
SECRET = "s3cret-pw-0244"


def _env(place: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "UPROF_EMBEDDER": "hashing", **place}


def _run(env: dict[str, str], *args: str) -> Any:
    return children.run_python(children.CLI_SCRIPT, *args, env=env, timeout=300)


def _said(done: Any) -> str:
    """stdout and stderr as one line (the console wraps long lines)."""
    return " ".join((done.stdout + done.stderr).split())


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _postgres_only(backend: Backend) -> None:
    if backend.kind != "postgres":
        pytest.skip("a database URL is PostgreSQL's")


def _sqlite_deployment(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    data, keys = tmp_path / "data", tmp_path / "keys"
    env = _env({"UPROF_DATA_DIR": str(data), "UPROF_KEY_DIR": str(keys)})
    for setup in (["init"], ["apps", "create", "app:a"]):
        done = _run(env, *setup)
        assert done.returncode == 0, done.stderr[-600:]
    return env, data, keys


# --------------------------------- XW: a connection string that is not a URL, quoted


@pytest.mark.parametrize("given_as", ["UPROF_DATABASE_URL", "--database-url"])
def test_xw_a_keyword_connection_string_is_refused_without_quoting_its_password(
    tmp_path: Path, given_as: str
) -> None:
    """Bug XW. libpq takes a connection string in two forms: the URL, and keywords
    (``host=... user=... password=... dbname=...``, what ``psql "..."`` and many
    platforms' variables hold). Given the second, the settings refused it as "not a
    database URL" by quoting it: its password whole, on stderr. 0244's XI hid the
    password of every URL the CLI names; this one was never a URL. Refused, exit 2,
    naming the setting, quoting nothing of it."""
    keywords = f"host=127.0.0.1 port=5432 user=postgres password={SECRET} dbname=uprof"
    env = _env({"UPROF_DATA_DIR": str(tmp_path / "d")})
    args = ["apps", "list"]
    if given_as == "UPROF_DATABASE_URL":
        env["UPROF_DATABASE_URL"] = keywords
    else:
        args = ["--database-url", keywords, *args]
    done = _run(env, *args)
    said = _said(done)
    assert done.returncode == BAD_SETTING, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert "UPROF_DATABASE_URL" in said and "not a database URL" in said, said[-600:]
    assert SECRET not in "".join(said.split()), said[-600:]
    assert not (tmp_path / "d").exists()


# --------------------------- XX: `uprof restore` into a folder that holds a backup


def test_xx_a_restore_into_a_backup_folder_is_refused_and_leaves_that_backup_whole(
    tmp_path: Path,
) -> None:
    """Bug XX (0244's XK, through ``uprof restore``). XK refuses a backup's folder named
    as the data folder at every start, but ``uprof restore`` copies the backup's stores
    into the data folder before its start: ``restore --from B1`` with ``--data-dir B2``
    (another backup: the two folders mixed up) wrote B1's stores over B2's copies and a
    restore marker into B2, and only then met XK's refusal, "the backup is as it was".
    B2 no longer matched its manifest: a backup lost to a restore. Refused before
    anything is copied, exit 8; B2 is as it was and still restores."""
    env, _data, keys = _sqlite_deployment(tmp_path)
    first, second = tmp_path / "b1", tmp_path / "b2"
    for setup in (
        ["backup", "--to", str(first)],
        ["apps", "create", "app:b"],
        ["backup", "--to", str(second)],
    ):
        done = _run(env, *setup)
        assert done.returncode == 0, done.stderr[-600:]
    before = _files(second)
    mixed_up = _env({"UPROF_DATA_DIR": str(second), "UPROF_KEY_DIR": str(keys)})
    done = _run(mixed_up, "restore", "--from", str(first))
    said = _said(done)
    assert done.returncode == NO_DEPLOYMENT, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert "holds a uprof backup" in said, said[-600:]
    assert _files(second) == before
    restored = _run(env, "restore", "--from", str(second))
    assert restored.returncode == 0, restored.stderr[-600:]
    listed = _run(env, "apps", "list")
    assert listed.returncode == 0 and "app:b" in listed.stdout, listed.stderr[-600:]


# ------------------------------------------ XY: a key folder that cannot be written


KEY_FOLDER_CASES = ["folder and files", "folder", "keys.sqlite"]


@pytest.mark.parametrize("what", KEY_FOLDER_CASES)
@pytest.mark.parametrize("command", [["apps", "list"], ["apps", "create", "app:x"]], ids=" ".join)
def test_xy_a_sqlite_key_folder_that_cannot_be_written_is_refused_not_an_outage(
    tmp_path: Path, what: str, command: list[str]
) -> None:
    """Bug XY (0247's Left: XQ looked at the data folder only). SQLite's key store,
    ``keys.sqlite``, lives in the key folder. That folder made unwritable (immutable:
    the folder and its files, the folder alone, or the key store's file) was told as the
    outage: "the database did not answer (OperationalError)", "retry after a few
    seconds", exit 1. Waiting changes nothing. Refused as XQ refuses the data folder:
    exit 1, naming the key folder and what cannot be written, no "retry"; nothing there
    changed."""
    env, _data, keys = _sqlite_deployment(tmp_path)
    files = sorted(p for p in keys.iterdir() if p.is_file())
    paths = {
        "folder and files": [keys, *files],
        "folder": [keys],
        "keys.sqlite": [keys / "keys.sqlite"],
    }[what]
    before = _files(keys)
    with _unwritable(paths):
        done = _run(env, *command)
    said = _said(done)
    assert done.returncode == REFUSED, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert "did not answer" not in said and "retry" not in said.lower(), said[-600:]
    assert str(keys) in "".join(said.split()) and "cannot be written" in said, said[-600:]
    after = _files(keys)
    assert {name: after.get(name) for name in before} == before


def test_xy_a_key_folder_to_be_made_under_a_folder_that_cannot_be_written(
    empty_backend: Backend,
) -> None:
    """Bug XY, the key folder not there yet, on both backends: its parent cannot be
    written, so the start cannot make it. The start made the data folder (SQLite), then
    ended in a ``PermissionError`` traceback, exit 1. Refused as XQ refuses a data
    folder to be made there: exit 1, naming the folder, nothing made."""
    parent = empty_backend.data_dir / "locked"
    parent.mkdir()
    keys = parent / "keys"
    data = empty_backend.data_dir / "d"
    place = {"UPROF_DATA_DIR": str(data), "UPROF_KEY_DIR": str(keys)}
    if empty_backend.kind == "postgres":
        place["UPROF_DATABASE_URL"] = empty_backend.url
    with _unwritable([parent]):
        done = _run(_env(place), "init")
    said = _said(done)
    assert done.returncode == REFUSED, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert str(parent) in "".join(said.split()) and "cannot be written" in said, said[-600:]
    assert not keys.exists() and not data.exists()


# ------------------------------- XZ: `uprof restore` into a folder that cannot be written


@pytest.mark.parametrize("what", ["folder and files", "store files"])
def test_xz_a_restore_into_a_data_folder_that_cannot_be_written_is_refused(
    tmp_path: Path, what: str
) -> None:
    """Bug XZ (0247's XQ, through ``uprof restore``). XQ refuses a data folder that
    cannot be written at every start, but ``uprof restore`` takes the stores before its
    start: into such a folder it said "the database did not answer (OperationalError)",
    "retry after a few seconds", exit 1; where only the store files were unwritable it
    had written its marker first, and every start after refused "finish the restore
    first". Refused before anything is changed, exit 1, naming the folder; once the
    folder is writable again the restore runs."""
    env, data, _keys = _sqlite_deployment(tmp_path)
    backup = tmp_path / "b"
    done = _run(env, "backup", "--to", str(backup))
    assert done.returncode == 0, done.stderr[-600:]
    files = sorted(p for p in data.iterdir() if p.is_file())
    paths = (
        [data, *files]
        if what == "folder and files"
        else [p for p in files if p.suffix == ".sqlite"]
    )
    with _unwritable(paths):
        done = _run(env, "restore", "--from", str(backup))
    said = _said(done)
    assert done.returncode == REFUSED, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert "did not answer" not in said and "retry" not in said.lower(), said[-600:]
    assert str(data) in "".join(said.split()) and "cannot be written" in said, said[-600:]
    assert not (data / "RESTORE-IN-PROGRESS.json").exists()
    listed = _run(env, "apps", "list")
    assert listed.returncode == 0 and "app:a" in listed.stdout, listed.stderr[-600:]
    restored = _run(env, "restore", "--from", str(backup))
    assert restored.returncode == 0, restored.stderr[-600:]


# -------------------------- YA: the URL's query string, read by the engines alone


@pytest.fixture
def owner_role(empty_backend: Backend) -> Iterator[str]:
    """A login role made the owner of the test's database (so it may create tables in
    its public schema); the database and the role are dropped after."""
    _postgres_only(empty_backend)
    role = f"{empty_backend.pg_dbname}_owner"
    admin = sa.create_engine(
        POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
    )
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
            conn.execute(sa.text(f'ALTER DATABASE "{empty_backend.pg_dbname}" OWNER TO "{role}"'))
        yield role
    finally:
        with admin.connect() as conn:
            conn.execute(
                sa.text(f'DROP DATABASE IF EXISTS "{empty_backend.pg_dbname}" WITH (FORCE)')
            )
            conn.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


def _table_owners(url: str) -> dict[str, str]:
    probe = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with probe.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public'")
            )
            return {str(name): str(owner) for name, owner in rows}
    finally:
        probe.dispose()


def test_ya_a_user_in_the_urls_query_is_the_event_logs_user_too(
    empty_backend: Backend, owner_role: str
) -> None:
    """Bug YA. libpq and SQLAlchemy take the connection's parts from the URL's query
    string too (``?user=``, ``?host=/run/postgresql`` for a Unix socket, ``?port=``,
    ``?dbname=``, ``?password=``), the query winning; the event log's settings
    (``layout``) took only the parts before it. With ``?user=ROLE`` the views and keys
    were made by ROLE and the event log's tables by the user before the host: one
    deployment under two roles (0244's XN, through the query). Every store is now
    reached as the URL says, the query included."""
    given = sa.engine.make_url(empty_backend.url)
    url = given.update_query_dict({"user": owner_role}).render_as_string(hide_password=False)
    env = _env(
        {
            "UPROF_DATA_DIR": str(empty_backend.data_dir / "d"),
            "UPROF_DATABASE_URL": url,
        }
    )
    done = _run(env, "init")
    assert done.returncode == 0, _said(done)[-600:]
    owners = _table_owners(empty_backend.url)
    assert "profiles_events" in owners and "alembic_version" in owners, owners
    assert set(owners.values()) == {owner_role}, owners


def test_ya_a_unix_socket_in_the_urls_query_is_where_the_event_log_connects() -> None:
    """Bug YA, the Unix socket form (SQLAlchemy's documented one: no host before the
    path, ``?host=/run/postgresql``): the engines connected through the socket, the event
    log to 127.0.0.1:5432, which a server listening on its socket alone does not
    answer, and which may be another server. The event log's settings take the query's
    host and port."""
    from uprof.settings import Settings
    from uprof.storage import layout_for

    url = "postgresql+psycopg://app@/uprof?host=/run/postgresql&port=5433"
    env = layout_for(Settings(database_url=url, data_dir=Path("unused"))).eventsourcing_env
    assert (env["POSTGRES_HOST"], env["POSTGRES_PORT"]) == ("/run/postgresql", "5433")
    assert (env["POSTGRES_USER"], env["POSTGRES_DBNAME"]) == ("app", "uprof")


@pytest.mark.parametrize(
    "parameter",
    ["sslmode=disable", "sslmod=require", "application_name=x", f"PASSWORD={SECRET}"],
)
def test_ya_a_query_parameter_the_event_log_cannot_follow_is_refused_by_name(
    empty_backend: Backend, parameter: str
) -> None:
    """Bug YA: any other query parameter reached the engines' connections and not the
    event log's, which take only database, host, port, user and password:
    ``sslmode=...`` held for some connections of the deployment and not for the event
    log's (a security setting followed by half of them), and one libpq does not know
    (a typo, ``sslmod``; ``PASSWORD``: libpq's names are lower case) ended in psycopg's
    traceback ("invalid connection option"). Refused at the settings, exit 2, naming
    the parameter, not its value; nothing is made."""
    _postgres_only(empty_backend)
    name, _, value = parameter.partition("=")
    url = (
        sa.engine.make_url(empty_backend.url)
        .update_query_dict({name: value})
        .render_as_string(hide_password=False)
    )
    data = empty_backend.data_dir / "d"
    env = _env({"UPROF_DATA_DIR": str(data), "UPROF_DATABASE_URL": url})
    done = _run(env, "init")
    said = _said(done)
    assert done.returncode == BAD_SETTING, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert "UPROF_DATABASE_URL" in said and repr(name) in said, said[-600:]
    assert SECRET not in "".join(said.split())
    assert _table_owners(empty_backend.url) == {}
    assert not data.exists()


# ------------------- YB: `uprof restore` over another program's events.sqlite


def test_yb_a_restore_into_a_folder_holding_another_programs_store_is_refused(
    tmp_path: Path,
) -> None:
    """Bug YB (0247's XU, through ``uprof restore``). XU refuses a data folder whose
    ``events.sqlite`` is another program's database at every start, but ``uprof restore``
    copies before its start: ``restore --from B`` with ``--data-dir`` naming that
    program's folder wrote the backup's event log over its database, exit 0. Refused
    before anything is copied, exit 8, naming the file; it is as it was."""
    import sqlite3

    env, _data, keys = _sqlite_deployment(tmp_path)
    backup = tmp_path / "b"
    done = _run(env, "backup", "--to", str(backup))
    assert done.returncode == 0, done.stderr[-600:]
    other = tmp_path / "other"
    other.mkdir()
    conn = sqlite3.connect(other / "events.sqlite")
    try:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
        conn.execute("INSERT INTO orders (item) VALUES ('tea')")
        conn.commit()
    finally:
        conn.close()
    before = _files(other)
    place = _env({"UPROF_DATA_DIR": str(other), "UPROF_KEY_DIR": str(keys)})
    done = _run(place, "restore", "--from", str(backup))
    said = _said(done)
    assert done.returncode == NO_DEPLOYMENT, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert "another program" in said and "orders" in said, said[-600:]
    assert _files(other) == before


# ------------------------------------------------------------------------- Held


@pytest.mark.parametrize(
    "form",
    ["postgres://", "postgresql+psycopg2://", "percent-encoded, database missing"],
)
def test_held_no_url_form_shows_its_password(empty_backend: Backend, form: str) -> None:
    """Held (XI's edges). ``postgres://`` (libpq's other scheme) and
    ``postgresql+psycopg2://`` are refused naming the setting, exit 2; a percent-encoded
    password before the host is hidden in XC's refusal of a missing database. None of
    them shows the password, plain or encoded, and nothing is made."""
    _postgres_only(empty_backend)
    given = sa.engine.make_url(empty_backend.url)
    secret = SECRET + "@/x"  # percent-encoded in the URL
    encoded = given.set(password=secret).render_as_string(hide_password=False)
    scheme_free = encoded.split("://", 1)[1]
    url, expected = {
        "postgres://": ("postgres://" + scheme_free, BAD_SETTING),
        "postgresql+psycopg2://": ("postgresql+psycopg2://" + scheme_free, BAD_SETTING),
        "percent-encoded, database missing": (
            given.set(password=secret, database=f"{empty_backend.pg_dbname}_typo").render_as_string(
                hide_password=False
            ),
            NO_DEPLOYMENT,
        ),
    }[form]
    data = empty_backend.data_dir / "d"
    done = _run(_env({"UPROF_DATA_DIR": str(data), "UPROF_DATABASE_URL": url}), "apps", "list")
    said = "".join((done.stdout + done.stderr).split())
    assert done.returncode == expected, (done.returncode, said[-600:])
    assert "Traceback" not in said
    assert SECRET not in said and "s3cret" not in said, said[-600:]
    assert _table_owners(empty_backend.url) == {}
    assert not data.exists()


def test_held_a_backup_folder_named_through_a_link_is_refused_untouched(tmp_path: Path) -> None:
    """Held (XK's edge): the data folder named as a symbolic link to a backup's folder is
    refused as the folder itself is (the settings resolve the link first), exit 8, and
    the backup is as it was."""
    env, _data, keys = _sqlite_deployment(tmp_path)
    backup = tmp_path / "b"
    done = _run(env, "backup", "--to", str(backup))
    assert done.returncode == 0, done.stderr[-600:]
    before = _files(backup)
    link = tmp_path / "link"
    link.symlink_to(backup, target_is_directory=True)
    for command in (["apps", "list"], ["apps", "create", "app:z"]):
        done = _run(_env({"UPROF_DATA_DIR": str(link), "UPROF_KEY_DIR": str(keys)}), *command)
        said = _said(done)
        assert done.returncode == NO_DEPLOYMENT, (command, done.returncode, said[-600:])
        assert "holds a uprof backup" in said
    assert _files(backup) == before


@pytest.mark.parametrize("shape", ["zero bytes", "not SQLite"])
def test_held_an_empty_or_unreadable_events_file_alone(tmp_path: Path, shape: str) -> None:
    """Held (XO's and XU's edges): a data folder holding only an ``events.sqlite`` of
    zero bytes is no deployment to a reader (exit 8); one that is not SQLite at all is
    a damaged store (exit 7, naming the damage), to a reader and a creator alike. The
    file is as it was, and nothing is added to the data folder."""
    data, keys = tmp_path / "data", tmp_path / "keys"
    data.mkdir()
    content = b"" if shape == "zero bytes" else b"not a database " * 400
    (data / "events.sqlite").write_bytes(content)
    env = _env({"UPROF_DATA_DIR": str(data), "UPROF_KEY_DIR": str(keys)})
    commands = [["apps", "list"]] if shape == "zero bytes" else [["apps", "list"], ["init"]]
    for command in commands:
        done = _run(env, *command)
        said = _said(done)
        expected = NO_DEPLOYMENT if shape == "zero bytes" else 7
        assert done.returncode == expected, (command, done.returncode, said[-600:])
        assert "Traceback" not in said
        assert (data / "events.sqlite").read_bytes() == content
        assert sorted(p.name for p in data.iterdir()) == ["events.sqlite"]


@pytest.mark.parametrize("branch", ["events", "keys"])
def test_held_one_store_of_a_newer_release_among_current_ones(
    empty_backend: Backend, branch: str
) -> None:
    """Held (XP's edge): a newer release's revision in one store only (the event log's,
    or the key store's; SQLite keeps each in its own file, PostgreSQL all in one
    ``alembic_version``), the others at this release's head. A reader and ``init`` are
    refused naming that revision, no traceback, and the revision is still there."""
    data = empty_backend.data_dir / "data"
    keys = empty_backend.data_dir / "keys"
    place = {"UPROF_DATA_DIR": str(data), "UPROF_KEY_DIR": str(keys)}
    if empty_backend.kind == "postgres":
        place["UPROF_DATABASE_URL"] = empty_backend.url
    env = _env(place)
    made = _run(env, "init")
    assert made.returncode == 0, made.stderr[-600:]
    if empty_backend.kind == "postgres":
        url = empty_backend.url
    else:
        store = data / "events.sqlite" if branch == "events" else keys / "keys.sqlite"
        url = f"sqlite:///{store}"
    future = f"0999_{branch}_from_a_newer_uprof"
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            rows = [r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))]
            ours = next(r for r in rows if f"_{branch}" in r)
            conn.execute(
                sa.text("UPDATE alembic_version SET version_num = :f WHERE version_num = :v"),
                {"f": future, "v": ours},
            )
        for command in (["apps", "list"], ["init"]):
            done = _run(env, *command)
            said = _said(done)
            assert done.returncode == 1, (command, done.returncode, said[-600:])
            assert "Traceback" not in said
            assert future in said and "newer" in said, said[-600:]
        with engine.connect() as conn:
            after = {r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))}
        assert future in after and ours not in after
    finally:
        engine.dispose()
