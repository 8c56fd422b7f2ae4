"""The key check asked under the event store's own write lock is bounded (bug VR).

0227-leftovers-of-0218-to-0223 (bug US) asks a write's key inside the save, once the
store's lock is held (SQLite's database write lock; PostgreSQL's ``LOCK TABLE ... IN
EXCLUSIVE MODE`` of the events table, taken early for it). Every write of every process
waits for that lock, erasures too. The check reads the key row when the request's copy
is older than ``KEY_CACHE_TTL_S`` (a save that waited): a key store that did not answer
then held the lock, and an erasure in another process waited for as long. The check now
has ``CHECK_UNDER_LOCK_WITHIN_S``; past it the save is rolled back (503, nothing
written) and the lock let go.

SQLite and PostgreSQL, a live server on loopback; the key read hangs inside the server
only when asked under the store's lock; the erasure is ``uprof erase subject`` in a
process of its own.
"""

from __future__ import annotations

import contextvars
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

import uprof.recorders
import uprof.recorders_postgres
from tests.api.conftest import PLANNER, LiveServer, bearer, grant
from tests.children import run_python
from uprof.api import ApiKeyStore
from uprof.kernel import Uprof
from uprof.settings import Settings

#: How long the erasure may take, its process's start included, while the save's check
#: hangs: the bound (2 s), a start (a few seconds) and a margin for a loaded machine.
ERASURE_BOUND_S = 45.0

_CLI = "import sys\nfrom uprof.cli.main import app\napp(sys.argv[1:])"


#: Set while the recorders ask the armed check under the store's lock (the context is
#: carried to wherever the check runs).
_UNDER_THE_LOCK: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "under_the_store_lock", default=False
)


def _marking_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Have the recorders' ``ask_under_the_store_lock`` mark its context first."""
    real = uprof.recorders.ask_under_the_store_lock

    def marked() -> None:
        token = _UNDER_THE_LOCK.set(True)
        try:
            real()
        finally:
            _UNDER_THE_LOCK.reset(token)

    monkeypatch.setattr(uprof.recorders, "ask_under_the_store_lock", marked)
    monkeypatch.setattr(uprof.recorders_postgres, "ask_under_the_store_lock", marked)


class _HangingUnderTheLock:
    """``ApiKeyStore.is_live`` that, once armed, does not answer when asked under the
    store's lock, until released."""

    def __init__(self, keys: ApiKeyStore) -> None:
        self._is_live = keys.is_live
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, key_id: str) -> bool:
        if self.armed.is_set() and _UNDER_THE_LOCK.get():
            self.entered.set()
            self.release.wait(120)
        return self._is_live(key_id)


@pytest.fixture
def hanging(keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[_HangingUnderTheLock]:
    stalled = _HangingUnderTheLock(keys)
    monkeypatch.setattr(keys, "is_live", stalled)
    _marking_the_lock(monkeypatch)
    try:
        yield stalled
    finally:
        stalled.release.set()


def _erase_in_another_process(settings: Settings, subject: str) -> subprocess.CompletedProcess[str]:
    cli = ["--data-dir", str(settings.data_dir), "--embedder", "hashing"]
    if settings.database_url:
        cli += ["--database-url", settings.database_url]
    return run_python(_CLI, *cli, "erase", "subject", "--subject", subject, timeout=ERASURE_BOUND_S)


def test_vr_a_hanging_key_check_under_the_store_lock_does_not_block_an_erasure(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    settings: Settings,
    hanging: _HangingUnderTheLock,
) -> None:
    """Bug VR: while a consent grant's key check hangs under the store's lock, an
    erasure of another subject by another process finishes; the grant answers 503 and
    writes nothing."""
    token = keys.create(PLANNER).token
    with httpx.Client(base_url=server.url, timeout=120) as http:
        grant(http, token, "alice")
        grant(http, token, "carol")
    answers: dict[str, httpx.Response] = {}

    def second_grant() -> None:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            answers["grant"] = http.post(
                "/v1/consents",
                headers=bearer(token),
                json={
                    "subject": "alice",
                    "categories": ["preference"],
                    "purposes": ["personalization"],
                    "collected_by": "consent-ui:test",
                },
            )

    hanging.armed.set()
    granting = threading.Thread(target=second_grant, daemon=True)
    granting.start()
    assert hanging.entered.wait(60), "the grant's save never asked its key"
    started = time.monotonic()
    erased: subprocess.CompletedProcess[str] | None = None
    try:
        erased = _erase_in_another_process(settings, "carol")
    except subprocess.TimeoutExpired:
        pass  # still waiting for the store's lock behind the hanging check
    took = time.monotonic() - started
    still_hanging = not hanging.release.is_set()
    hanging.release.set()
    granting.join(120)
    assert still_hanging
    assert erased is not None, f"the erasure waited {took:.1f} s and more for the lock"
    assert erased.returncode == 0, (erased.stdout + erased.stderr)[-800:]
    refused = answers["grant"]
    assert refused.status_code == 503, (refused.status_code, refused.text[-300:])
    assert len(kernel.profile("alice").consents) == 1  # the refused grant wrote nothing


def test_held_a_key_check_that_answers_under_the_store_lock_writes(
    server: LiveServer, kernel: Uprof, keys: ApiKeyStore, hanging: _HangingUnderTheLock
) -> None:
    """The guard: unarmed, the same wrapped check lets the grant be written (201)."""
    token = keys.create(PLANNER).token
    with httpx.Client(base_url=server.url, timeout=60) as http:
        grant(http, token, "alice")
        grant(http, token, "alice", categories=("preference",))
    assert len(kernel.profile("alice").consents) == 2
    assert not hanging.entered.is_set()


def test_held_a_key_store_down_under_the_store_lock_answers_503_and_lets_the_lock_go(
    server: LiveServer,
    kernel: Uprof,
    keys: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key check that raises an outage under the store's lock (the key store down):
    503, nothing written, and the lock is let go: the next grant is written."""
    from domain.errors import StoreUnavailableError

    token = keys.create(PLANNER).token
    real = keys.is_live
    _marking_the_lock(monkeypatch)

    def down(key_id: str) -> bool:
        if _UNDER_THE_LOCK.get():
            raise StoreUnavailableError("the key store did not answer")
        return real(key_id)

    with httpx.Client(base_url=server.url, timeout=60) as http:
        grant(http, token, "alice")
        monkeypatch.setattr(keys, "is_live", down)
        refused = http.post(
            "/v1/consents",
            headers=bearer(token),
            json={
                "subject": "alice",
                "categories": ["preference"],
                "purposes": ["personalization"],
                "collected_by": "consent-ui:test",
            },
        )
        assert refused.status_code == 503, (refused.status_code, refused.text[-300:])
        assert len(kernel.profile("alice").consents) == 1
        monkeypatch.setattr(keys, "is_live", real)
        grant(http, token, "alice", categories=("preference",))
    assert len(kernel.profile("alice").consents) == 2
