"""Group commit under SIGKILL (decision 0017): a ``uprof serve`` process takes captures
from several client threads and is killed at a random moment; after reopening, every
capture it answered 201 is in the log exactly once."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.reliability import PLANNER, Target, grant_all, kernel_on, make_settings
from benchmarks.server_ready import stop_server, wait_until_healthy
from tests.children import PythonChild, serving_child
from uprof.eventstore import CAPTURED_TOPIC

SUBJECTS = [f"gc-subject-{i}" for i in range(4)]
CLIENTS = 6


def _start_server(target: Target, log: Path | None = None) -> tuple[PythonChild, str]:
    """A ``uprof serve`` on the target's store, forked from the suite's fork server (a
    process of its own: its pid, socket, connections, SIGKILL; the same command and
    options); its stderr goes to ``log`` when given (so that a test can say why a server
    went away), else to a file of the child's own that ``communicate`` reads."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(target.data_dir),
        "UPROF_EMBEDDER": "hashing",
        "UPROF_EXTRACTOR": "rules",
    }
    if target.database_url:
        env["UPROF_DATABASE_URL"] = target.database_url
    proc, port = serving_child(["serve", "--log-level", "warning"], env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, url, timeout_s=120)
    except BaseException:
        stop_server(proc, timeout_s=0)  # killed and reaped, not left running
        raise
    return proc, url


def _stored_captures(kernel: Any) -> list[tuple[str, str]]:
    """(capture id, user input) of every capture event in the log, duplicates kept."""
    out: list[tuple[str, str]] = []
    position = 0
    while True:
        batch = kernel.app.notifications_after(position, 500, topics=[CAPTURED_TOPIC])
        if not batch:
            return out
        for notification in batch:
            event = kernel.app.decode(notification)
            out.append((event.capture_id, event.user_input))
        position = batch[-1].id


def _serve_and_kill(target: Target, token: str, rng: random.Random) -> tuple[dict[str, str], int]:
    """Serve, capture from CLIENTS threads, SIGKILL the server at a random moment after
    the first 201. Returns the captures answered 201 (marker -> capture id) and the
    server's exit status."""
    server, url = _start_server(target)
    acked: dict[str, str] = {}
    answered = threading.Event()
    stop = threading.Event()
    lock = threading.Lock()
    run = rng.randrange(1_000_000)

    def client(index: int) -> None:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as http:
            n = 0
            while not stop.is_set():
                marker = f"I want to try gc marker {run}x{index}x{n}"
                n += 1
                body = {
                    "subject": SUBJECTS[n % len(SUBJECTS)],
                    "agent_id": "agent:one",
                    "user_input": marker,
                    "occurred_at": "2025-02-01T10:00:00Z",
                    "purpose": "personalization",
                    "sharing": "shared",
                }
                try:
                    response = http.post("/v1/captures", json=body)
                except httpx.HTTPError:
                    return  # the server is gone: this request was never answered
                if response.status_code == 201:
                    with lock:
                        acked[marker] = response.json()["capture_id"]
                    answered.set()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        assert answered.wait(60), "no capture was answered before the kill"
        time.sleep(rng.uniform(0.3, 1.5))
        server.send_signal(signal.SIGKILL)
        server.wait(30)
    finally:
        stop.set()
        if server.poll() is None:
            server.kill()
        for t in threads:
            t.join(60)
    return acked, server.returncode


#: Kills per test: each lands at a random point of the writer's cycle.
ROUNDS = 2


def test_every_capture_answered_201_survives_sigkill_once(target: Target) -> None:
    from uprof.api import ApiKeyStore

    rng = random.Random(os.getpid())
    with kernel_on(target) as kernel:
        for subject in SUBJECTS:
            grant_all(kernel, subject)
    keys = ApiKeyStore.open(make_settings(target))
    try:
        token = keys.create(PLANNER).token
    finally:
        keys.close()

    acked: dict[str, str] = {}
    for _ in range(ROUNDS):
        answered, status = _serve_and_kill(target, token, rng)
        assert status == -signal.SIGKILL
        acked.update(answered)

    with kernel_on(target) as kernel:
        stored = _stored_captures(kernel)
        kernel.audit_log.verify_integrity()
    by_id = Counter(capture_id for capture_id, _ in stored)
    by_marker = Counter(text for _, text in stored)
    assert len(acked) >= CLIENTS, f"only {len(acked)} captures answered: the kill came too early"
    lost = [m for m, cid in acked.items() if by_id[cid] != 1]
    assert lost == [], f"{len(lost)} of {len(acked)} answered captures are not in the log once"
    assert [m for m in acked if by_marker[m] != 1] == []
    # Nothing was captured twice, answered or not (in flight at the kill: at most once).
    assert max(by_marker.values()) == 1
