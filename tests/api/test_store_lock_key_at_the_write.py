"""A write that waits for the event store's own write lock, held by another process, is
made only for a key that still stands once it holds the lock (SQLite and PostgreSQL, a
live server, the lock held by a real second process, the key revoked by ``uprof apps
revoke`` in a third).

0218-key-rechecked-at-the-write asked the key where a write gets its turn in the server
(the subject's writer turn, the capture writer's group), then saved; the save takes the
store's lock inside (SQLite's database write lock, waited for up to
``SQLITE_LOCK_TIMEOUT``, 30 s; PostgreSQL's ``LOCK TABLE ... IN EXCLUSIVE MODE`` of the
events table): a key revoked while the save waited there was not seen (its Left). The
holder here is another process with the lock, as a second server's save, a backup or an
operator's ``sqlite3`` shell holds it; the server's read of the key row is aged past
``KEY_CACHE_TTL_S`` and the server seen refusing the key on another request before the
holder lets go.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import (
    PLANNER,
    LiveServer,
    bearer,
    grant,
    interaction,
)
from tests.children import streaming_child
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.eventstore import CAPTURED_TOPIC
from uprof.kernel import Uprof
from uprof.settings import Settings

#: Takes the events store's write lock, says so, holds it until a line comes through the
#: fifo, then lets go (rolls back: it writes nothing).
HOLDER = r"""
import sys
go, kind, where, table = sys.argv[1:5]
if kind == "sqlite":
    import sqlite3
    conn = sqlite3.connect(where, isolation_level=None, timeout=60)
    conn.execute("BEGIN IMMEDIATE")
else:
    import psycopg
    conn = psycopg.connect(where)
    conn.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
print("held", flush=True)
with open(go) as fifo:
    fifo.readline()
conn.rollback()
conn.close()
print("released", flush=True)
"""

#: ``uprof apps revoke KEY_ID`` as the CLI runs it, paused once its stores are open and
#: before it revokes, until a line comes through the fifo (its start waits for the event
#: store's lock like any writer's, so it is started before the lock is taken).
PAUSED_REVOKE = r"""
import sys
from uprof.facade import Facade
go = sys.argv[1]
revoke = Facade.revoke_api_key
def paused(self, key_id):
    print("started", flush=True)
    with open(go) as fifo:
        fifo.readline()
    return revoke(self, key_id)
Facade.revoke_api_key = paused
from uprof.cli.main import app
app(sys.argv[2:])
"""

GRANT = {
    "subject": "alice",
    "categories": ["location"],
    "purposes": ["personalization"],
    "collected_by": "consent-ui:test",
}


def _holder_args(backend: Backend, kernel: Uprof) -> tuple[str, str, str]:
    recorder: Any = kernel.app.recorder
    if backend.kind == "sqlite":
        return "sqlite", str(kernel.settings.data_dir / "events.sqlite"), ""
    dsn = sa.engine.make_url(backend.url).set(drivername="postgresql")
    table = f'"{recorder.datastore.schema}"."{recorder.events_table_name}"'
    return "postgres", dsn.render_as_string(hide_password=False), table


@contextmanager
def _released_by_fifo(script: str, ready: str, done: str, *args: str) -> Iterator[Any]:
    """A child running ``script`` (its first argument a fifo), once it printed ``ready``;
    yields ``go()``, which lets it on and waits for its ``done`` line."""
    with TemporaryDirectory() as folder:
        fifo = Path(folder) / "go"
        os.mkfifo(fifo)
        with streaming_child(script, str(fifo), *args) as child:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == ready, (line, child.stderr_so_far())

            def go() -> None:
                with open(fifo, "w") as sent:
                    sent.write("go\n")
                assert child.stdout is not None
                line = child.stdout.readline()
                assert line.strip().startswith(done), (line, child.stderr_so_far())

            yield go


def _lock_held_by_another_process(backend: Backend, kernel: Uprof) -> Any:
    """The event store's write lock, held by a child process until ``go()``."""
    return _released_by_fifo(HOLDER, "held", "released", *_holder_args(backend, kernel))


def _cli_paused_before_revoking(settings: Settings, key_id: str) -> Any:
    """``uprof apps revoke key_id`` in a process of its own, started; ``go()`` revokes."""
    cli = ["--data-dir", str(settings.data_dir), "--embedder", "hashing"]
    if settings.database_url:
        cli += ["--database-url", settings.database_url]
    return _released_by_fifo(
        PAUSED_REVOKE, "started", f"key {key_id} revoked", *cli, "apps", "revoke", key_id
    )


def _arrives_at_the_save(kernel: Uprof, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set when a save of the profiles log starts (and goes on to wait for the lock)."""
    recorder: Any = kernel.app.recorder
    arrived = threading.Event()
    real = recorder.insert_events

    def insert_events(*args: Any, **kwargs: Any) -> Any:
        arrived.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(recorder, "insert_events", insert_events)
    return arrived


def _consents(kernel: Uprof) -> int:
    return len(kernel.profile("alice").consents)


def _while_the_lock_is_held(
    server: LiveServer,
    kernel: Uprof,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    request: Any,
    meanwhile: Any,
) -> httpx.Response:
    """Send ``request(http)`` while another process holds the store's lock; once it
    waits at the save, run ``meanwhile(http)``, then let the holder go."""
    answers: list[httpx.Response] = []
    with (
        _lock_held_by_another_process(backend, kernel) as release,
        httpx.Client(base_url=server.url, timeout=90) as http,
    ):
        arrived = _arrives_at_the_save(kernel, monkeypatch)
        sent = threading.Thread(target=lambda: answers.append(request(http)))
        sent.start()
        try:
            assert arrived.wait(60), "the write never reached the store's save"
            meanwhile(http)
        finally:
            release()
            sent.join(90)
        monkeypatch.undo()
    assert answers, "the write never answered"
    return answers[0]


def _revoked_elsewhere(revoke: Any, issued: Any, clock: list[float]) -> Any:
    def meanwhile(http: httpx.Client) -> None:
        revoke()
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
        refused = http.post(
            "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
        )
        assert refused.status_code == 401, refused.text  # revoked, as the server sees it

    return meanwhile


def _still_standing(issued: Any) -> Any:
    def meanwhile(http: httpx.Client) -> None:
        shown = http.post(
            "/v1/consents/list", headers=bearer(issued.token), json={"subject": "alice"}
        )
        assert shown.status_code == 200, shown.text

    return meanwhile


def test_us_a_consent_grant_waiting_for_the_stores_lock_is_refused_for_a_key_revoked_there(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug US: the grant passed its key check in its writer turn and waits in the save
    for the lock another process holds; the key is revoked and refused by the server
    meanwhile. Asked again once the lock is held: 401, no consent added."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        grant(http, issued.token)
    before = _consents(kernel)
    with _cli_paused_before_revoking(settings, issued.info.key_id) as revoke:
        answer = _while_the_lock_is_held(
            server,
            kernel,
            backend,
            monkeypatch,
            lambda http: http.post("/v1/consents", headers=bearer(issued.token), json=GRANT),
            _revoked_elsewhere(revoke, issued, clock),
        )
    assert answer.status_code == 401, answer.text
    assert _consents(kernel) == before


def test_us_a_capture_waiting_for_the_stores_lock_is_refused_for_a_key_revoked_there(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug US, the capture writer's road: the capture's group passed the key check in
    its turn and waits in the save for the lock; revoked meanwhile: 401, nothing of it
    written."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    issued = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        grant(http, issued.token)
    assert kernel.wait_until_caught_up(30)
    captured_before = kernel.app.max_notification_id()
    with _cli_paused_before_revoking(settings, issued.info.key_id) as revoke:
        answer = _while_the_lock_is_held(
            server,
            kernel,
            backend,
            monkeypatch,
            lambda http: http.post(
                "/v1/captures",
                headers=bearer(issued.token),
                json={"subject": "alice", **interaction("I live in Oslo")},
            ),
            _revoked_elsewhere(revoke, issued, clock),
        )
    assert answer.status_code == 401, answer.text
    written = kernel.app.notifications_after(captured_before, 100)
    assert [n for n in written if n.topic == CAPTURED_TOPIC] == []


def test_held_a_consent_grant_waiting_for_the_stores_lock_with_a_live_key_is_written(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard: the same wait for the lock, the key standing: the grant is written."""
    issued = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        grant(http, issued.token)
    before = _consents(kernel)
    answer = _while_the_lock_is_held(
        server,
        kernel,
        backend,
        monkeypatch,
        lambda http: http.post("/v1/consents", headers=bearer(issued.token), json=GRANT),
        _still_standing(issued),
    )
    assert answer.status_code == 201, answer.text
    assert _consents(kernel) == before + 1
