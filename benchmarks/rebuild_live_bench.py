"""One round of decision 0108-rebuild-beside-live-traffic: ``uprof projections rebuild``
beside a live ``uprof serve`` whose clients capture steadily, on the code it runs from.

A fresh store (SQLite folder or PostgreSQL database) is given ``--seed`` captures, then
a real server is started and ``--clients`` threads capture through REST without pause
(two subjects, the rules extractor and the hashing embedder unless ``UPROF_EMBEDDER`` is
set) while a real CLI process rebuilds the views. Prints one JSON line: the rebuild's exit
status and wall time, the captures acknowledged while it ran, and the time of a rebuild
of the same store once the traffic stopped (for comparison).

    python benchmarks/rebuild_live_bench.py sqlite|postgres [--seed N] [--clients N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

from benchmarks.reliability import (
    PLANNER,
    Target,
    grant_all,
    interaction,
    kernel_on,
    make_settings,
    temp_target,
)
from benchmarks.server_ready import popen_serving, stop_server, wait_until_healthy

SUBJECTS = ["rebuild-bench-0", "rebuild-bench-1"]


def _env(target: Target) -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(target.data_dir),
        "UPROF_EMBEDDER": os.environ.get("UPROF_EMBEDDER", "hashing"),
        "UPROF_EXTRACTOR": "rules",
    }
    if target.database_url:
        env["UPROF_DATABASE_URL"] = target.database_url
    return env


def _rebuild(target: Target) -> tuple[int, float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "uprof.cli.main", "projections", "rebuild"],
        env=_env(target),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return done.returncode, time.perf_counter() - started, done.stderr.strip()[-1500:]


def run(kind: str, seed: int, clients: int) -> dict[str, Any]:
    from uprof.api import ApiKeyStore

    with temp_target(kind) as target:
        with kernel_on(target) as kernel:
            for subject in SUBJECTS:
                grant_all(kernel, subject)
            for n in range(seed):
                kernel.capture(SUBJECTS[n % 2], interaction(f"I want to try seed marker {n}"))
            kernel.process()
        keys = ApiKeyStore.open(make_settings(target))
        try:
            token = keys.create(PLANNER).token
        finally:
            keys.close()
        acked = [0]
        lock = threading.Lock()
        stop = threading.Event()

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
                            "subject": SUBJECTS[(index + n) % 2],
                            "agent_id": "agent:one",
                            "user_input": f"I want to try bench marker {index}x{n}",
                            "occurred_at": "2025-02-01T10:00:00Z",
                            "purpose": "personalization",
                            "sharing": "shared",
                        },
                    )
                    if response.status_code == 201:
                        with lock:
                            acked[0] += 1

        command = [sys.executable, "-m", "uprof.cli.main", "serve", "--log-level", "warning"]
        server, port = popen_serving(command, env=_env(target))
        url = f"http://127.0.0.1:{port}"
        threads = [threading.Thread(target=client, args=(url, i)) for i in range(clients)]
        try:
            wait_until_healthy(server, url, timeout_s=120)
            for t in threads:
                t.start()
            time.sleep(2)  # the traffic is under way
            with lock:
                before = acked[0]
            code, live_s, said = _rebuild(target)
            with lock:
                during = acked[0] - before
        finally:
            stop.set()
            for t in threads:
                t.join(300)
            stop_server(server)
        quiet_code, quiet_s, _ = _rebuild(target)
        return {
            "backend": kind,
            "seed_captures": seed,
            "clients": clients,
            "live_rebuild_exit": code,
            "live_rebuild_s": round(live_s, 2),
            "live_rebuild_stderr": said,
            "captures_acked_during": during,
            "quiet_rebuild_exit": quiet_code,
            "quiet_rebuild_s": round(quiet_s, 2),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend", choices=["sqlite", "postgres"])
    parser.add_argument("--seed", type=int, default=500)
    parser.add_argument("--clients", type=int, default=6)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.backend, args.seed, args.clients)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
