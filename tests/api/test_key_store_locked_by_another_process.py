"""The key store locked by another process, for real: every write answers within the
bound and nothing is half-written (bug WK).

0231-review-of-0227 and 0232-review-of-0226-and-0231 bounded the key checks asked under
the write locks against a hang simulated inside the server. Here the lock is real and
held by a second process: PostgreSQL's ``LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE``
(what a migration, a ``VACUUM FULL`` or an operator's ``psql`` takes), SQLite's write
lock on the key store's own file (``BEGIN EXCLUSIVE`` on ``keys.sqlite``: an operator's
``sqlite3`` shell, a backup's copy). The server's read of the key row is aged past
``KEY_CACHE_TTL_S`` with the store's clock, so that the write must read the row.

On PostgreSQL a read of the locked table waited for the lock without end: at the
request's authentication (before any bound), every request of a key whose row had aged
held a server thread for as long as the lock was held. SQLite's key store is in WAL
mode: its readers do not wait for a writer, so the same writes are made.

SQLite and PostgreSQL, a live server on loopback; no sleep decides anything.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import CALENDAR, PLANNER, LiveServer, bearer, grant
from tests.api.test_store_lock_key_at_the_write import (
    _arrives_at_the_save,
    _lock_held_by_another_process,
)
from tests.children import streaming_child
from tests.conftest import Backend
from uprof.api import ApiKeyStore
from uprof.apikeys.store import KEY_CACHE_TTL_S
from uprof.kernel import Uprof
from uprof.settings import Settings

#: A check's bound (2 s), the key read's own (2 s), and a margin for a loaded machine.
ANSWERED_WITHIN_S = 15.0
WAIT_S = 60.0

#: Takes the key store's lock, says so, holds it until a line comes through the fifo,
#: then lets go (rolls back: it writes nothing).
KEY_STORE_HOLDER = r"""
import sys
go, kind, where = sys.argv[1:4]
if kind == "sqlite":
    import sqlite3
    conn = sqlite3.connect(where, isolation_level=None, timeout=60)
    conn.execute("BEGIN EXCLUSIVE")
else:
    import psycopg
    conn = psycopg.connect(where)
    conn.execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
print("held", flush=True)
with open(go) as fifo:
    fifo.readline()
conn.rollback()
conn.close()
print("released", flush=True)
"""

GRANT = {
    "subject": "alice",
    "categories": ["preference"],
    "purposes": ["personalization"],
    "collected_by": "consent-ui:test",
}


@contextmanager
def _key_store_locked(backend: Backend, settings: Settings) -> Iterator[Callable[[], None]]:
    """The key store's lock, held by a child process; yields ``go()``, which lets go."""
    if backend.kind == "sqlite":
        args = ("sqlite", str(settings.key_path / "keys.sqlite"))
    else:
        dsn = sa.engine.make_url(backend.url).set(drivername="postgresql")
        args = ("postgres", dsn.render_as_string(hide_password=False))
    with TemporaryDirectory() as folder:
        fifo = Path(folder) / "go"
        os.mkfifo(fifo)
        with streaming_child(KEY_STORE_HOLDER, str(fifo), *args) as child:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == "held", (line, child.stderr_so_far())
            released = []

            def go() -> None:
                if released:
                    return
                released.append(True)
                with open(fifo, "w") as sent:
                    sent.write("go\n")
                assert child.stdout is not None
                line = child.stdout.readline()
                assert line.strip() == "released", (line, child.stderr_so_far())

            try:
                yield go
            finally:
                go()


def _consents(kernel: Uprof) -> int:
    return len(kernel.profile("alice").consents)


def _timed(send: Callable[[], httpx.Response]) -> tuple[httpx.Response | None, float]:
    sent = time.monotonic()
    try:
        answer: httpx.Response | None = send()
    except httpx.TimeoutException:
        answer = None
    return answer, time.monotonic() - sent


def _all_or_nothing(answer: httpx.Response, added: int) -> None:
    """Written and 201, or refused as an outage (503, Retry-After) and nothing written."""
    assert (answer.status_code, added) in {(201, 1), (503, 0)}, (
        f"answered {answer.status_code} with {added} consent(s) added: {answer.text[-300:]}"
    )
    if answer.status_code == 503:
        assert answer.headers.get("Retry-After")


def test_wk_a_write_whose_key_row_must_be_read_answers_within_the_bound(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug WK: another process holds the key store's lock; a request whose key row has
    aged (the server must read it to authenticate) is answered within the bound, and a
    grant is written or refused whole. Before, on PostgreSQL, both waited for the lock
    without end. Once the lock is let go, the next grant is written.

    SQLite: the read does not wait (WAL), so the read is answered 200; the grant waits
    for the lock all the same, since every save writes the stream heads into the key
    store's file (SQLite's busy wait, as for the event store's own lock): it is sent
    while the lock is held and answered once it is let go."""
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    planner = keys.create(PLANNER)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, planner.token)
    before = _consents(kernel)
    answers: list[tuple[httpx.Response | None, float]] = []
    with (
        _key_store_locked(backend, settings) as let_go,
        httpx.Client(base_url=server.url, timeout=ANSWERED_WITHIN_S * 2) as http,
    ):
        clock[0] += KEY_CACHE_TTL_S + 0.1  # the server's read of the row has aged
        read, read_took = _timed(
            lambda: http.post(
                "/v1/consents/list", headers=bearer(planner.token), json={"subject": "alice"}
            )
        )
        clock[0] += KEY_CACHE_TTL_S + 0.1  # aged again, for the grant
        sent = threading.Thread(
            target=lambda: answers.append(
                _timed(lambda: http.post("/v1/consents", headers=bearer(planner.token), json=GRANT))
            ),
            daemon=True,
        )
        sent.start()
        if backend.kind == "postgres":
            sent.join(ANSWERED_WITHIN_S)  # answered while the lock is still held
            held_all_along = sent.is_alive() or bool(answers)
        let_go()
        sent.join(ANSWERED_WITHIN_S * 2)
    assert read is not None, f"a read was not answered within {read_took:.1f} s"
    assert read_took < ANSWERED_WITHIN_S, f"a read was answered after {read_took:.1f} s"
    assert read.status_code == (503 if backend.kind == "postgres" else 200), read.text
    assert answers, "the grant never answered"
    answer, took = answers[0]
    assert answer is not None, f"the grant was not answered within {took:.1f} s"
    assert took < ANSWERED_WITHIN_S, f"the grant was answered after {took:.1f} s"
    if backend.kind == "postgres":
        assert held_all_along and answer.status_code == 503, answer.text
    else:
        assert answer.status_code == 201, answer.text  # written once the lock went
    _all_or_nothing(answer, _consents(kernel) - before)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, planner.token, categories=("location",))


def test_held_the_check_under_the_store_lock_reading_the_locked_key_store_is_bounded(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bounded check of 0231 against the real lock: a grant waits at its save for
    the event store's lock (held by a second process); meanwhile its key row ages and a
    third process locks the key store. Once the event store's lock is let go, the save
    asks its key under it, reading the locked key store: answered within the bound,
    written or refused whole, and the event store's lock let go (another app's grant,
    whose row is fresh, is written while the key store is still locked).

    PostgreSQL only: SQLite's key store is read without waiting for its writer (WAL;
    ``test_wk_*`` reads through that lock), and its saves write the key store's file."""
    if backend.kind != "postgres":
        pytest.skip("a read of SQLite's key store does not wait for its write lock")
    clock = [1000.0]
    monkeypatch.setattr(keys, "_monotonic", lambda: clock[0])
    planner = keys.create(PLANNER)
    calendar = keys.create(CALENDAR)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        grant(http, planner.token)
    before = _consents(kernel)
    answers: list[tuple[httpx.Response | None, float]] = []
    with (
        _lock_held_by_another_process(backend, kernel) as let_the_events_go,
        httpx.Client(base_url=server.url, timeout=WAIT_S) as http,
    ):
        released: list[bool] = []

        def release_events() -> None:
            if not released:
                released.append(True)
                let_the_events_go()

        arrived = _arrives_at_the_save(kernel, monkeypatch)
        sent = threading.Thread(
            target=lambda: answers.append(
                _timed(lambda: http.post("/v1/consents", headers=bearer(planner.token), json=GRANT))
            ),
            daemon=True,
        )
        sent.start()
        try:
            assert arrived.wait(WAIT_S), "the grant never reached the store's save"
            clock[0] += KEY_CACHE_TTL_S + 0.1  # the planner's row has aged
            # The calendar's row, read now: fresh for the grant below.
            shown = http.post(
                "/v1/consents/list", headers=bearer(calendar.token), json={"subject": "alice"}
            )
            assert shown.status_code in (200, 403, 404), shown.text
            with _key_store_locked(backend, settings) as let_go:
                released_at = time.monotonic()
                release_events()
                sent.join(ANSWERED_WITHIN_S * 2)
                took = time.monotonic() - released_at
                assert answers, f"the grant was not answered {took:.1f} s after its lock"
                other, other_took = _timed(
                    lambda: http.post(
                        "/v1/consents",
                        headers=bearer(calendar.token),
                        json={**GRANT, "purposes": ["scheduling"], "categories": ["schedule"]},
                    )
                )
                let_go()
        finally:
            release_events()
            sent.join(WAIT_S)
        monkeypatch.undo()
    answer, _ = answers[0]
    assert answer is not None
    assert took < ANSWERED_WITHIN_S, f"the grant was answered {took:.1f} s after its lock"
    added = sum(1 for c in kernel.profile("alice").consents if c.app_id == PLANNER)
    _all_or_nothing(answer, added - before)
    assert other is not None and other.status_code == 201, (other_took, other and other.text)
