"""Stores damaged under a running ``uprof serve`` (real processes, loopback), met by its
requests: the caller gets 500 ``stored_data_damaged`` with the operator's hint, never
500 ``internal`` nor a 403 or 503 an agent reads as "no" or "retry"; the server logs the
damage once with what to do, and no traceback; nothing is written once it is seen
(0214-store-damage-in-servers, bugs SG-SI).

SG: a SQLite store file replaced under the server, met by a connection the server opens
after (its pool grows under a burst of requests): 500 ``internal`` and a traceback per
request on main (``database_down`` re-raised the driver's ``DatabaseError``).
SH: a table of the wrong shape (a column renamed by hand) in the view or event store:
SQLite's ``no such column`` / PostgreSQL's ``UndefinedColumn`` answered 500 ``internal``.
SI: the policy table of the wrong shape under a running server: every policy check
denied as the store "unreadable", answered 503 ``policy_store_unavailable`` ("retry in
5 s"), which waiting never mends.
SK-SM: the data folder held to the key folder's rule, ``keys move-out``'s key folder
checked, ``--port 0``'s start line naming the real port (real CLI processes).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from benchmarks.server_ready import stop_server, wait_until_healthy
from tests.by_hand import by_hand
from tests.children import served_from_fork
from tests.conftest import Backend
from tests.kernel.conftest import consented_settings
from tests.policies.conftest import on_the_policy_table
from uprof.settings import Settings

APP = "app:planner"
CONSENTS = ("/v1/consents/list", {"subject": "alice"})
CAPTURE = (
    "/v1/captures",
    {
        "subject": "alice",
        "agent_id": "agent:one",
        "user_input": "I like green tea",
        "agent_response": "noted",
        "occurred_at": "2026-11-30T09:30:00Z",
        "session_id": "s-1",
        "purpose": "personalization",
    },
)
#: Bursts of 120 requests SG sends at most before it says no new connection met the file.
MAX_BURSTS = 20
#: Where each store's tables are by hand: SQLite's file, PostgreSQL's events table name.
EVENTS_TABLE = {"sqlite": "stored_events", "postgres": "profiles_events"}


@dataclass
class Served:
    url: str
    headers: dict[str, str]
    settings: Settings
    stderr: Path

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, headers=self.headers, timeout=120)

    def log(self) -> str:
        return self.stderr.read_text(encoding="utf-8", errors="replace")


@pytest.fixture
def served(backend: Backend, tmp_path: Path) -> Iterator[Served]:
    """``uprof serve`` on a deployment where alice consented to ``APP``, its stderr kept."""
    from tests.kernel.conftest import APP as KERNEL_APP
    from uprof.api import ApiKeyStore

    assert KERNEL_APP == APP
    settings = consented_settings(backend)
    keys = ApiKeyStore.open(settings)
    try:
        token = keys.create(APP).token
    finally:
        keys.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(settings.data_dir),
        "UPROF_EMBEDDER": "hashing",
        "UPROF_EXTRACTOR": "rules",
        "UPROF_POLICY_REFRESH_S": "0",  # each check reads the policy store (SI)
    }
    if settings.database_url:
        env["UPROF_DATABASE_URL"] = settings.database_url
    stderr = tmp_path / "serve.stderr"
    # Forked from the tests' fork server (the project imported once): a process of its
    # own all the same, its start the command's; held past the test's body, stopped here.
    with served_from_fork(env, stderr) as url:
        served = Served(url, {"Authorization": f"Bearer {token}"}, settings, stderr)
        assert served.post(*CONSENTS).status_code == 200
        yield served


def _count_events(backend: Backend, settings: Settings) -> int:
    table = EVENTS_TABLE[backend.kind]
    if backend.kind == "sqlite":
        conn = sqlite3.connect(settings.data_dir / "events.sqlite")
        try:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        finally:
            conn.close()
    engine = sa.create_engine(backend.url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def _damaged(answer: httpx.Response) -> None:
    """The answer to stored data found damaged: 500 ``stored_data_damaged``, the operator's
    hint, and no driver text (no statement, no column, no row)."""
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert error["code"] == "stored_data_damaged", error
    assert "uprof restore" in error["hint"], error
    assert "SELECT" not in answer.text and "INSERT" not in answer.text, error


#: What the server logs for a request's failure it did not answer as a refusal, or for a
#: capture group's: a traceback where the damage's one line belongs.
_UNHANDLED = ("unhandled error", "Exception in ASGI application", "capture group failed")


def _logged_once(served: Served, words: str) -> None:
    """The damage logged once (with the operator's hint), no request's traceback. The
    pipeline thread may log one of its own first on PostgreSQL (a prepared statement's
    plan after the schema changed, "cached plan must not change result type")."""
    log = served.log()
    assert not any(line in log for line in _UNHANDLED), log[:3000]
    assert log.count(words) == 1, log[-3000:]
    assert log.count("uprof restore") >= 1, log[-3000:]


def test_sh_a_view_table_of_the_wrong_shape_is_stored_data_damaged(
    backend: Backend, served: Served
) -> None:
    """Bug SH (views): the consents' table with a column renamed by hand."""
    by_hand(backend, served.settings, "views.sqlite", _RENAMED_APP_ID)
    for _ in range(3):
        _damaged(served.post(*CONSENTS))
    _logged_once(served, "a table of the stores is not of the shape")


_RENAMED_APP_ID = "ALTER TABLE consents RENAME COLUMN app_id TO app_id_by_hand"


def test_sh_an_event_table_of_the_wrong_shape_refuses_the_capture_and_writes_nothing(
    backend: Backend, served: Served
) -> None:
    """Bug SH (events): the event table with a column renamed by hand; a capture is
    refused as damage and nothing is written."""
    table = EVENTS_TABLE[backend.kind]
    before = _count_events(backend, served.settings)
    by_hand(
        backend,
        served.settings,
        "events.sqlite",
        f"ALTER TABLE {table} RENAME COLUMN originator_version TO v2",
    )
    for _ in range(2):
        _damaged(served.post(*CAPTURE))
    by_hand(
        backend,
        served.settings,
        "events.sqlite",
        f"ALTER TABLE {table} RENAME COLUMN v2 TO originator_version",
    )
    assert _count_events(backend, served.settings) == before
    _logged_once(served, "a table of the stores is not of the shape")


def test_si_a_policy_table_of_the_wrong_shape_under_a_server_is_damage_not_an_outage(
    backend: Backend, served: Served
) -> None:
    """Bug SI: the policy's event table dropped and made again by hand while the server
    runs; each policy-checked route answers the damage, not 503 "retry", not 403."""
    on_the_policy_table(
        backend,
        served.settings,
        "DROP TABLE {table}",
        "CREATE TABLE {table} (id INTEGER PRIMARY KEY, note TEXT)",
    )
    for path, body in (CAPTURE, ("/v1/slices", _SLICE)):
        _damaged(served.post(path, body))
    _logged_once(served, "is not of the shape uprof made")


_SLICE = {
    "subject": "alice",
    "query": "tea?",
    "budget_tokens": 256,
    "purpose": "personalization",
    "agent_id": "agent:one",
}


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sg_a_store_file_replaced_under_a_server_met_by_a_new_connection(
    backend: Backend, served: Served
) -> None:
    """Bug SG: views.sqlite replaced by text (renamed over it, as a copy gone wrong does)
    while the server runs. The connections it holds keep the old file; a burst of
    requests makes its pool open new ones, which meet the text. Every answer is either
    the old file's (200) or the damage's; at least one met the new file.

    Whether a burst grows the pool depends on how many of its requests overlap, which a
    loaded machine can shrink to none (a clean-clone CI met nothing in one burst of 120,
    where a quiet run meets 15-20): bursts are sent until one is met, up to
    ``MAX_BURSTS``, each answer checked."""
    views = served.settings.data_dir / "views.sqlite"
    text = views.with_name("views.sqlite.by-hand")
    text.write_text("not a database\n" * 512, encoding="utf-8")
    text.replace(views)
    met: list[httpx.Response] = []
    with ThreadPoolExecutor(40) as pool:
        for _ in range(MAX_BURSTS):
            answers = list(pool.map(lambda _: served.post(*CONSENTS), range(120)))
            met = [a for a in answers if a.status_code != 200]
            if met:
                break
    assert met, f"no request of {MAX_BURSTS} bursts met the replaced file"
    for answer in met:
        _damaged(answer)
    assert views.read_text(encoding="utf-8") == "not a database\n" * 512  # nothing written
    _logged_once(served, "is not a database or is damaged")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sm_serve_on_port_0_names_the_port_it_listens_on(backend: Backend) -> None:
    """Bug SM (0209-cli-truths's Left): ``--port 0`` printed ``:0``; the line now names the
    port the system picked, and the server answers there."""
    settings = consented_settings(backend)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(settings.data_dir),
        "UPROF_EMBEDDER": "hashing",
    }
    command = [sys.executable, "-m", "uprof.cli.main", "serve", "--port", "0"]
    command += ["--log-level", "warning"]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("uprof API on http://127.0.0.1:"), line
        port = int(line.split("http://127.0.0.1:", 1)[1].split()[0])
        assert port != 0, line
        wait_until_healthy(process, f"http://127.0.0.1:{port}", timeout_s=120)
    finally:
        stop_server(process)


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env |= {"HF_HUB_OFFLINE": "1", "UPROF_EMBEDDER": "hashing", "COLUMNS": "400"}
    command = [sys.executable, "-m", "uprof.cli.main", "--data-dir", str(data_dir), *args]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_sk_a_data_folder_another_user_could_replace_is_refused(tmp_path: Path) -> None:
    """Bug SK: a data folder under a folder every user may write (no sticky bit): whoever
    renames it away and puts a folder of theirs in its place gets what the deployment
    writes next (events, views) in their files. The start refuses it, as the key folder's
    (0203-review-of-0199-and-0201's QD), and creates no store. With the key folder
    beside it (the default) the key folder's rule refused it already; not elsewhere."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    data = shared / "data"
    # Its key folder elsewhere (UPROF_KEY_DIR): beside it, the key folder's own rule
    # refused the start already.
    keys = ["--key-dir", str(tmp_path / "keys")]
    # A command that makes a deployment (0237-the-wrong-folder: one that only reads makes
    # none anywhere, and says so first).
    done = _cli(data, *keys, "init")
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said
    assert f"refused the data folder {data}" in said and "writable by other users" in said
    assert "Traceback" not in said
    assert not (data / "events.sqlite").exists()
    shared.chmod(0o755)  # the rule's other side: a folder only its owner writes is kept
    kept = _cli(data, *keys, "init")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert (data / "events.sqlite").exists()


def test_sl_keys_move_out_checks_the_folders_above_the_key_folder(tmp_path: Path) -> None:
    """Bug SL (0209-cli-truths's Left): ``keys move-out`` made the key folder with mkdir
    and moved the secrets into it whatever the folders above it were."""
    data = tmp_path / "data"
    data.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    keys = shared / "keys"
    made = _cli(data, "init")  # a deployment to move the keys of (0237-the-wrong-folder)
    assert made.returncode == 0, made.stdout + made.stderr
    done = _cli(data, "--key-dir", str(keys), "keys", "move-out")
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said
    assert f"refused the key folder {keys}" in said, said
