"""0238-shapes-under-running-processes's damages under a running ``uprof worker`` and
``uprof mcp --transport stdio`` (0238 drove them against ``uprof serve`` only; decision
0247-wrong-stores-at-the-start): the policy store's events table altered, and an event
table's column of another type, by hand while the process runs. Real processes, SQLite
and PostgreSQL."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from domain.errors import StoredDataDamagedError
from tests.api.mcp_messages import HELLO, rpc
from tests.by_hand import by_hand
from tests.children import CLI_SCRIPT, PythonChild
from tests.conftest import Backend
from tests.e2e.test_review_of_0224 import _recreated_with
from tests.e2e.test_shapes_under_running_processes import TRACEBACKS, _attack_policy
from tests.e2e.test_store_damage_servers import APP, _count_events
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, consented_settings, running, say
from uprof.settings import Settings

#: Bound on every wait for a condition (the machine is shared and loaded).
BOUND_S = 120.0
#: What a process logs, once, for stored data damaged.
DAMAGE_LINE = "stored data damaged"


def _env(settings: Settings, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(settings.data_dir),
        "UPROF_EMBEDDER": "hashing",
        "UPROF_EXTRACTOR": "rules",
        "UPROF_POLICY_REFRESH_S": "0",  # each check looks at the policy store
        **more,
    }
    if settings.database_url:
        env["UPROF_DATABASE_URL"] = settings.database_url
    return env


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {BOUND_S} s: {what}"
        time.sleep(0.2)


def _no_traceback(log: str) -> None:
    assert not any(line in log for line in TRACEBACKS), log[-3000:]


def _retype_event_column(backend: Backend, settings: Settings, *, back: bool = False) -> None:
    """The event log's table, a column of another type (or put back as uprof made it):
    SQLite's version column made again as TEXT (WQ), PostgreSQL's ``state`` altered to
    text (WR)."""
    if backend.kind == "sqlite":
        declared = "INTEGER" if back else "TEXT"
        _recreated_with(settings, "events.sqlite", "stored_events", "originator_version", declared)
        return
    statement = (
        "ALTER TABLE profiles_events ALTER COLUMN state TYPE bytea USING decode(state, 'hex')"
        if back
        else "ALTER TABLE profiles_events ALTER COLUMN state TYPE text USING encode(state, 'hex')"
    )
    by_hand(backend, settings, "events.sqlite", statement)


def _memories(settings: Settings, subject: str) -> list[str]:
    with running(settings, FakeClock()) as kernel:
        return [m.text for m in kernel.profile(subject).memories]


# ------------------------------------------------------------------ uprof worker


@contextmanager
def _worker(settings: Settings, stderr: Path) -> Iterator[PythonChild]:
    """``uprof worker``, forked from the suite's fork server (a process of its own)."""
    args = ["worker", "--log-level", "info"]
    child = PythonChild(CLI_SCRIPT, *args, env=_env(settings), stderr_to=stderr)
    try:
        yield child
    finally:
        child.terminate()
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _caught_up(kernel: Any) -> bool:
    """Whether the worker has extracted and projected everything, asked of ``kernel`` (a
    process started before the damage: a new start would refuse the damaged store)."""
    lag = kernel.lag()
    return bool(lag.extraction_pending == 0 and lag.projection_pending == 0)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_an_event_column_retyped_under_a_worker(backend: Backend, tmp_path: Path) -> None:
    """An event table's column of another type while ``uprof worker`` runs, then a new
    stream's first write by a process started before it (SQLite takes it into the
    retyped table, 0238's Left; PostgreSQL refuses it as damage, WR). What must hold:
    the worker tells the damage it meets in one line, no traceback per retry, runs on;
    once the table is put back, a worker extracts what comes, nothing of before lost."""
    settings = consented_settings(backend)
    log = tmp_path / "worker.stderr"
    with _worker(settings, log) as worker, running(settings, FakeClock()) as writer:
        consent(writer, "carol")
        writer.capture("alice", say("I like green tea"))
        _until(lambda: _caught_up(writer), "the worker extracts the first capture")
        before = _count_events(backend, settings)
        _retype_event_column(backend, settings)
        # A new stream's first write (dave's consent: no row of his to read first).
        # SQLite takes it into the retyped table (0238's Left); PostgreSQL's typed
        # statement refuses it as damage (WR).
        written = backend.kind == "sqlite"
        if written:
            consent(writer, "dave")
        else:
            with pytest.raises(StoredDataDamagedError):
                consent(writer, "dave")
        if written:
            # The worker reads dave's rows (a version stored as text) and tells it.
            _until(lambda: DAMAGE_LINE in log.read_text(), "the worker logs the damage")
            # Once, however many retries meet it (``log_store_damage``).
            assert log.read_text().count(DAMAGE_LINE) == 1, log.read_text()[-3000:]
        else:
            assert _count_events(backend, settings) == before
        assert worker.poll() is None, log.read_text()[-3000:]
        _no_traceback(log.read_text())
        _retype_event_column(backend, settings, back=True)
    with _worker(settings, tmp_path / "worker2.stderr"):
        with running(settings, FakeClock()) as writer:
            writer.capture("carol", say("I like jasmine tea", day=2))
            if written:  # dave's consent, read by the worker in damage, stands
                writer.capture("dave", say("I like oolong tea", day=2))
            _until(lambda: _caught_up(writer), "a worker extracts what waited")
    _no_traceback((tmp_path / "worker2.stderr").read_text())
    said = " ".join(_memories(settings, "carol")).lower()
    assert "jasmine" in said, said
    if written:
        assert "oolong" in " ".join(_memories(settings, "dave")).lower()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_policy_table_altered_under_a_worker(backend: Backend, tmp_path: Path) -> None:
    """The policy store's events table, its ``topic`` column renamed, while ``uprof
    worker`` runs, and a capture written by a process started before it (allowed by the
    head it reads, 0238's Left). What must hold: nothing extracted is committed with its
    items dropped, no traceback loop; once put back, the capture is extracted."""
    settings = consented_settings(backend)
    log = tmp_path / "worker.stderr"
    with _worker(settings, log) as worker, running(settings, FakeClock()) as writer:
        writer.capture("alice", say("I like green tea"))
        _until(lambda: _caught_up(writer), "the worker extracts the first capture")
        _attack_policy(backend, settings, "topic-renamed")
        writer.capture("alice", say("I like oolong tea", day=2))
        _until(
            lambda: DAMAGE_LINE in log.read_text() or _caught_up(writer),
            "the worker meets the capture",
        )
        assert worker.poll() is None, log.read_text()[-3000:]
        _no_traceback(log.read_text())
        by_hand(
            backend,
            settings,
            "policies.sqlite",
            f"ALTER TABLE {'stored_events' if backend.kind == 'sqlite' else 'policies_events'} "
            "RENAME COLUMN topic_by_hand TO topic",
        )
        _until(lambda: _caught_up(writer), "the worker extracts once the store is back")
        _no_traceback(log.read_text())
    said = " ".join(_memories(settings, "alice")).lower()
    assert "oolong" in said, said


# ------------------------------------------------------------ uprof mcp (stdio)


class _Mcp:
    """A ``uprof mcp --transport stdio`` child: JSON-RPC a line each way."""

    def __init__(self, settings: Settings, token: str, stderr: Path) -> None:
        self.stderr = stderr
        # Forked from the suite's fork server (a process of its own), its stdin a pipe.
        self.child = PythonChild(
            CLI_SCRIPT,
            *["mcp", "--transport", "stdio"],
            env=_env(settings, UPROF_API_KEY=token),
            stream_stdout=True,
            stdin_pipe=True,
            stderr_to=stderr,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        stdout = self.child.stdout
        assert stdout is not None
        threading.Thread(target=lambda: [self._lines.put(x) for x in stdout], daemon=True).start()
        self._id = 1
        self._send(json.dumps(HELLO).encode())
        assert self._answer()["id"] == 1
        self._send(rpc("notifications/initialized").encode())

    def _send(self, line: bytes) -> None:
        assert self.child.stdin is not None
        self.child.stdin.write(line + b"\n")
        self.child.stdin.flush()

    def _answer(self) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(self._lines.get(timeout=BOUND_S))
        return answer

    def call(self, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """(whether the tool answered an error, its JSON)."""
        self._id += 1
        params = {"name": tool, "arguments": arguments}
        self._send(
            json.dumps(
                {"jsonrpc": "2.0", "id": self._id, "method": "tools/call", "params": params}
            ).encode()
        )
        answer = self._answer()
        assert answer.get("id") == self._id, answer
        result = answer["result"]
        text = result["content"][0]["text"]
        return bool(result.get("isError")), json.loads(text)

    def close(self) -> None:
        if self.child.stdin is not None:
            self.child.stdin.close()
        try:
            self.child.wait(60)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()
        if self.child.stdout is not None:
            self.child.stdout.close()


def _capture(n: int, text: str) -> dict[str, Any]:
    return {
        "subject": "alice",
        "agent_id": "agent:one",
        "user_input": text,
        "occurred_at": f"2026-11-30T09:{n:02d}:00+00:00",
        "idempotency_key": f"m-{n}",
    }


SLICE = {
    "subject": "alice",
    "query": "tea?",
    "budget_tokens": 256,
    "purpose": "personalization",
    "agent_id": "agent:one",
}


def _damaged(error: bool, body: dict[str, Any]) -> None:
    assert error, body
    assert body["error"]["code"] == "stored_data_damaged", body
    assert "uprof restore" in body["error"]["hint"], body


@contextmanager
def _mcp(settings: Settings, tmp_path: Path) -> Iterator[_Mcp]:
    from uprof.api import ApiKeyStore

    keys = ApiKeyStore.open(settings)
    try:
        token = keys.create(APP).token
    finally:
        keys.close()
    mcp = _Mcp(settings, token, tmp_path / "mcp.stderr")
    try:
        yield mcp
    finally:
        mcp.close()


def _settled(settings: Settings) -> None:
    """Wait until the process's own pipeline has extracted and projected what is there
    (asked before any damage: a start after it would refuse the store)."""
    with running(settings, FakeClock()) as kernel:
        _until(lambda: _caught_up(kernel), "the pipeline catches up")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_an_event_column_retyped_under_mcp_stdio(backend: Backend, tmp_path: Path) -> None:
    """An event table's column of another type (SQLite's version column made again as
    TEXT, PostgreSQL's ``state`` altered to text) while ``uprof mcp --transport stdio``
    runs. What must hold: every tool call after it answers ``stored_data_damaged`` with
    the operator's hint (never a traceback, never "retry"), and nothing is written."""
    settings = consented_settings(backend)
    with _mcp(settings, tmp_path) as mcp:
        error, body = mcp.call("capture", _capture(1, "I like green tea"))
        assert not error, body
        _settled(settings)
        before = _count_events(backend, settings)
        _retype_event_column(backend, settings)
        _damaged(*mcp.call("capture", _capture(2, "I like oolong tea")))
        _damaged(*mcp.call("profile_slice", SLICE))
        _damaged(*mcp.call("capture", _capture(3, "I like jasmine tea")))
        assert _count_events(backend, settings) == before
        _no_traceback(mcp.stderr.read_text())
        assert mcp.child.poll() is None, mcp.stderr.read_text()[-3000:]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_policy_table_altered_under_mcp_stdio(backend: Backend, tmp_path: Path) -> None:
    """The policy store's ``topic`` column renamed while ``uprof mcp --transport stdio``
    runs. Not told: every check reads the store's head only, which a renamed column does
    not move, and no MCP tool loads the policy (0238's Left; 0247-wrong-stores-at-the-
    start's Left). What holds: no traceback, the process runs on, and what it said it
    captured is kept with its items: once the table is put back, a new start reads
    both captures' items."""
    settings = consented_settings(backend)
    with _mcp(settings, tmp_path) as mcp:
        error, body = mcp.call("capture", _capture(1, "I like green tea"))
        assert not error, body
        _settled(settings)
        _attack_policy(backend, settings, "topic-renamed")
        error, body = mcp.call("capture", _capture(2, "I like oolong tea"))
        assert not error, body  # allowed by the head: the Left above
        _no_traceback(mcp.stderr.read_text())
        table = "stored_events" if backend.kind == "sqlite" else "policies_events"
        by_hand(
            backend,
            settings,
            "policies.sqlite",
            f"ALTER TABLE {table} RENAME COLUMN topic_by_hand TO topic",
        )
        error, body = mcp.call("capture", _capture(3, "I like mint tea"))
        assert not error, body
        _settled(settings)
        _no_traceback(mcp.stderr.read_text())
        assert mcp.child.poll() is None, mcp.stderr.read_text()[-3000:]
    said = " ".join(_memories(settings, "alice")).lower()
    assert "oolong" in said and "mint" in said, said
