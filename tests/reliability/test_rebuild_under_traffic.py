"""``uprof projections rebuild`` beside a live ``uprof serve`` under steady captures.

An operator must be able to rebuild a live deployment's views. The rebuild first ran
extraction until the log had no capture left to extract: beside a server whose clients
keep capturing, that never happens, and each of its batches raced the server's own
worker (the position) and the server's captures (the subjects' versions), so it failed
with "extraction kept losing the race to concurrent captures" (exit 6) before emptying
anything, run after run. Now the rebuild replays the log up to the position it took at
its start and leaves the rest to the runners (decision 0108-rebuild-beside-live-traffic).

A real server captures for several client threads all through a real CLI rebuild (whose
extractor is slower than the server's, so that it loses the race every run); once
the traffic stops the views equal a clean rebuild and hold every acknowledged capture
once (SQLite and PostgreSQL).
"""

from __future__ import annotations

import os
import threading
from collections import Counter

import httpx
import pytest

from benchmarks.reliability import (
    PLANNER,
    Target,
    captured_ids,
    grant_all,
    interaction,
    kernel_on,
    make_settings,
)
from benchmarks.server_ready import stop_server
from tests.children import run_python
from tests.reliability.test_group_commit_crash import _start_server

SUBJECTS = [f"rebuild-live-{i}" for i in range(2)]
CLIENTS = 6
#: Captures in the views before the server starts: a reset with rows to delete (one
#: without them left no room for the deadlock with the server's runner).
#: On subjects of their own: the clients' subjects start without history, so their
#: captures come fast (on the seeded subjects they came too slowly to make extraction lose).
SEED = 300
SEEDED = [f"rebuild-seed-{i}" for i in range(3)]
#: Captures acknowledged before the rebuild starts (the server is under way).
WARM_UP = 30
REBUILD_TIMEOUT_S = 600  # a guard against a rebuild that never ends, not a measure

#: ``uprof projections rebuild`` with an extractor slower than the server's (a model: the
#: rules plus a pause), so that the server's worker extracts each capture first, as a
#: server with a fast extractor beside a CLI with a model did, run after run.
REBUILD = """
import sys, time
from uprof.adapters.extraction import RuleBasedExtractor

extract = RuleBasedExtractor.extract

def slow(self, capture):
    time.sleep(0.02)
    return extract(self, capture)

RuleBasedExtractor.extract = slow
from uprof.cli.main import app

sys.argv = ["uprof", "projections", sys.argv[1]]
app()
"""


def _cli_env(target: Target) -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(target.data_dir),
        "UPROF_EMBEDDER": "hashing",
        "UPROF_EXTRACTOR": "rules",
    }
    if target.database_url:
        env["UPROF_DATABASE_URL"] = target.database_url
    return env


@pytest.mark.parametrize(
    ("command", "seed"),
    # ``projections run`` needs no seed (no reset): the cost stays small.
    [("rebuild", SEED), ("run", 0)],
)
def test_a_rebuild_beside_a_live_server_under_captures(
    target: Target, command: str, seed: int
) -> None:
    """Also ``uprof projections run`` ("catch up now"), which ran extraction until idle
    and failed the same way (exit 6): now it stops where the log ended at its start."""
    from uprof.api import ApiKeyStore

    with kernel_on(target) as kernel:
        for subject in SUBJECTS:
            grant_all(kernel, subject)
        for subject in SEEDED:
            grant_all(kernel, subject)
        seeded = [
            kernel.capture(
                SEEDED[n % len(SEEDED)], interaction(f"I want to try seed marker {n}")
            ).capture_id
            for n in range(seed)
        ]
        kernel.process()
    keys = ApiKeyStore.open(make_settings(target))
    try:
        token = keys.create(PLANNER).token
    finally:
        keys.close()

    acked: list[str] = []
    failed: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    warm = threading.Event()

    def client(url: str, index: int) -> None:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        ) as http:
            n = 0
            while not stop.is_set():
                n += 1
                response = http.post(
                    "/v1/captures",
                    json={
                        "subject": SUBJECTS[(index + n) % len(SUBJECTS)],
                        "agent_id": "agent:one",
                        "user_input": f"I want to try rebuild marker {index}x{n}",
                        "occurred_at": "2025-02-01T10:00:00Z",
                        "purpose": "personalization",
                        "sharing": "shared",
                    },
                )
                with lock:
                    if response.status_code == 201:
                        acked.append(response.json()["capture_id"])
                        if len(acked) >= WARM_UP:
                            warm.set()
                    else:
                        failed.append(f"{response.status_code} {response.text[:300]}")

    log = target.data_dir.parent / "server.stderr"
    server, url = _start_server(target, log)
    threads = [threading.Thread(target=client, args=(url, i)) for i in range(CLIENTS)]
    try:
        for t in threads:
            t.start()
        assert warm.wait(300), f"the server answered no captures: {failed[-3:]}"
        with lock:
            before = len(acked)
        # The CLI forked from the suite's fork server: a process of its own (run_python).
        rebuild = run_python(REBUILD, command, env=_cli_env(target), timeout=REBUILD_TIMEOUT_S)
        with lock:
            during = len(acked) - before
    finally:
        stop.set()
        for t in threads:
            t.join(300)
        stopped = stop_server(server)
    said = log.read_text()[-3000:] if log.exists() else ""
    assert rebuild.returncode == 0, (rebuild.returncode, rebuild.stderr[-3000:], rebuild.stdout)
    assert during > 0  # the traffic went on all through the rebuild
    assert not failed, failed[:3]
    assert stopped is not None, f"the server did not stop within 60 s of SIGTERM: {said}"

    with kernel_on(target) as kernel:
        kernel.process()  # what the runners had left when the server stopped
        live = kernel.queries.table_digest()
        in_views = Counter(captured_ids(kernel, SUBJECTS + SEEDED))
        assert set(in_views) == {*acked, *seeded} and set(in_views.values()) == {1}
        kernel.rebuild()  # alone, with no traffic
        assert kernel.queries.table_digest() == live
