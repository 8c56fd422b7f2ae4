"""Bug WE (0236-review-of-0232): ``pipeline_unmoved_s`` of a ``serve --no-worker`` server
with no ``uprof worker`` running said 0 after any write that is no capture.

0232-review-of-0226-and-0231's WA counted the pending work as moved whenever the log
position less what is pending moved. A consent grant, or an erasure in another process,
moves the log position and leaves the captures pending to extract as they were: the
count started again at 0 while nothing at all had been done. Real processes (``uprof
serve --no-worker``, ``uprof erase subject``), SQLite and PostgreSQL.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import httpx

from benchmarks.server_ready import stop_server, wait_until_healthy
from tests import children
from tests.children import PythonChild
from tests.conftest import Backend
from tests.e2e.test_user_walk import _base, _env, _readyz_until
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel
from uprof.settings import Settings

#: A generous bound for every wait on an observable condition.
WAIT_S = 120.0

#: How long the pending work has to have been seen unmoved before the other writes.
STALLED_S = 1.5


def _unmoved(body: dict[str, Any]) -> float:
    return float(body.get("pipeline_unmoved_s") or 0.0)


def _grant(http: httpx.Client, subject: str) -> None:
    answer = http.post(
        "/v1/consents",
        json={
            "subject": subject,
            "categories": ["*"],
            "purposes": ["personalization"],
            "collected_by": "consent-ui:test",
        },
    )
    assert answer.status_code == 201, answer.text


def test_we_writes_that_are_no_capture_do_not_reset_the_unmoved_count(
    backend: Backend, tmp_path: Path
) -> None:
    """A capture waits with no worker; once readiness says it has not moved for a while,
    a consent grant of another subject is written. Nothing was extracted or projected:
    the count goes on. Held: the erasure of another subject by ``uprof erase subject``,
    a process of its own, runs the pipeline to the log's end, and readiness says 0."""
    created = _uprof(backend, _env(), "apps", "create", "app:planner")
    assert created.returncode == 0, created.stderr
    token = next(w for w in created.stdout.split() if w.startswith("upk_"))
    server, port = _serving(backend, _env(), tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(server, url)
        with httpx.Client(
            base_url=url, timeout=WAIT_S, headers={"Authorization": f"Bearer {token}"}
        ) as http:
            _grant(http, "alice")
            _grant(http, "bob")
            captured = http.post(
                "/v1/captures",
                json={
                    "subject": "alice",
                    "agent_id": "agent:one",
                    "user_input": "I live in Lisbon",
                    "occurred_at": "2025-01-01T09:00:00Z",
                    "sharing": "shared",
                    "purpose": "personalization",
                },
            )
            assert captured.status_code == 201, captured.text
            stalled = _readyz_until(url, lambda b: _unmoved(b) >= STALLED_S, WAIT_S)
            assert _unmoved(stalled) >= STALLED_S, stalled
            _grant(http, "carol")
            after_grant = httpx.get(f"{url}/readyz", timeout=WAIT_S).json()
        assert after_grant["log_position"] > stalled["log_position"], (stalled, after_grant)
        assert after_grant["extraction_pending"] == stalled["extraction_pending"] >= 1
        assert _unmoved(after_grant) >= _unmoved(stalled), (
            f"a consent grant reset the unmoved count with no worker running: "
            f"{stalled} then {after_grant}"
        )
        erased = _uprof(backend, _env(), "erase", "subject", "--subject", "bob")
        assert erased.returncode == 0, erased.stderr[-2000:]
        after_erasure = httpx.get(f"{url}/readyz", timeout=WAIT_S).json()
    finally:
        stop_server(server)
    # The erasure's process ran the pipeline up to the log's end itself (a CLI command
    # waits for the views): work done by another process, which readiness counts.
    assert after_erasure["log_position"] > after_grant["log_position"], after_erasure
    assert after_erasure["extraction_pending"] == after_erasure["projection_pending"] == 0
    assert _unmoved(after_erasure) == 0.0, after_erasure


def _uprof(backend: Backend, env: dict[str, str], *args: str) -> CompletedProcess[str]:
    """``uprof <args>`` on the test's deployment, a process of its own forked from the
    tests' fork server (the project imported once), as ``subprocess.run`` answers."""
    return children.run_python(children.CLI_SCRIPT, *_base(backend), *args, env=env, timeout=WAIT_S)


def _serving(backend: Backend, env: dict[str, str], folder: Path) -> tuple[PythonChild, int]:
    """``uprof serve --no-worker`` on the test's deployment, forked as ``_uprof``; its
    stderr in ``folder``."""
    args = [*_base(backend), "serve", "--no-worker", "--host", "127.0.0.1"]
    return children.serving_child(args, env, folder / "serve.stderr")


def _worker(backend: Backend, partition: int) -> PythonChild:
    """``uprof worker --partitions 2 --partition K``, once it says it is ready (forked as
    ``_uprof``)."""
    worker = PythonChild(
        children.CLI_SCRIPT,
        *_base(backend),
        *["worker", "--partitions", "2", "--partition", str(partition)],
        env=_env(UPROF_WORKER_PARTITIONS="2"),
        stream_stdout=True,
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()  # the ready line; a dead worker ends the read
    assert line.startswith("uprof worker ready"), (line, worker.poll())
    return worker


def _stopped(worker: PythonChild) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    if worker.stdout is not None:
        worker.stdout.close()


def _until(condition: Callable[[], bool], within_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)  # a poll's pause, not a proof: the condition decides
    return True


def test_wg_a_partitions_dead_worker_is_not_hidden_by_the_live_one(
    backend: Backend, tmp_path: Path
) -> None:
    """Bug WG: two partitions, each with its ``uprof worker``; partition 1's is killed
    -9. Captures of both partitions' subjects: partition 0's are done, partition 1's
    wait. Once readiness says they have not moved for a while, a consent is written and
    the live worker projects it: the count goes on (on main it started again at 0)."""
    env = _env(UPROF_WORKER_PARTITIONS="2")
    created = _uprof(backend, env, "apps", "create", "app:planner")
    assert created.returncode == 0, created.stderr
    token = next(w for w in created.stdout.split() if w.startswith("upk_"))
    server, port = _serving(backend, env, tmp_path)
    url = f"http://127.0.0.1:{port}"
    dead = _worker(backend, 1)
    dead.kill()  # kill -9
    dead.wait(WAIT_S)
    live = _worker(backend, 0)
    observer = build_kernel(
        Settings(
            data_dir=backend.data_dir / "data",
            database_url=backend.url if backend.kind == "postgres" else None,
            embedder="hashing",
            worker_partitions=2,
            background_workers=True,
            run_worker=False,
        ),
        FakeClock(),
    )
    try:
        wait_until_healthy(server, url)
        with httpx.Client(
            base_url=url, timeout=WAIT_S, headers={"Authorization": f"Bearer {token}"}
        ) as http:
            partitions: set[int] = set()
            for n in range(64):
                _grant(http, f"subject-{n}")
                stream = observer.stream_of(f"subject-{n}")
                partition = observer.extraction._partitioning.of(stream)
                if partition in partitions:
                    continue
                partitions.add(partition)
                captured = http.post(
                    "/v1/captures",
                    json={
                        "subject": f"subject-{n}",
                        "agent_id": "agent:one",
                        "user_input": f"I live in town {n}",
                        "occurred_at": "2025-01-01T09:00:00Z",
                        "sharing": "shared",
                        "purpose": "personalization",
                    },
                )
                assert captured.status_code == 201, captured.text
                if len(partitions) == 2:
                    break
            assert partitions == {0, 1}, partitions
            stalled = _readyz_until(url, lambda b: _unmoved(b) >= STALLED_S, WAIT_S)
            assert _unmoved(stalled) >= STALLED_S, stalled
            assert stalled["extraction_pending"] >= 1, stalled  # partition 1's capture
            _grant(http, "zed")
            head = observer.app.max_notification_id()
            assert _until(lambda: observer.projections.partition_position(0) >= head), (
                "the live worker did not project the consent"
            )
            after = httpx.get(f"{url}/readyz", timeout=WAIT_S).json()
    finally:
        observer.close()
        _stopped(live)
        _stopped(dead)
        stop_server(server)
    assert after["extraction_pending"] >= 1, after
    assert _unmoved(after) >= _unmoved(stalled), (
        f"the live partition's work reset the count while partition 1's capture waited "
        f"with no worker: {stalled} then {after}"
    )
