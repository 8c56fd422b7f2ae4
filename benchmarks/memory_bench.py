"""Memory benchmark: does a long-running server's RSS stay flat as it serves more subjects?

Issue 14: server RSS after slicing 10,000 subjects (20 captures each) stays within 10%
of its RSS after 1,000. Every in-process cache is bounded (docs/decisions/0014), so once
the caches are full, serving more subjects must not grow the process.

1. **Seed** (this process, in-process kernel, hashing embedder, rule extractor):
   ``--subjects`` subjects, each with consent and ``--captures`` captured turns, then the
   whole pipeline (extraction and projections) runs to the end.
2. **Serve**: a real ``uprof serve`` subprocess on that data folder (background worker,
   API-key auth, metrics: what production runs), driven over REST from this process:
   one slice per subject, in subject order, ``--clients`` at a time.
3. **Measure** the server process's RSS (``VmRSS`` of /proc/<pid>/status) after every
   ``--every`` subjects sliced; the figure is RSS after all subjects over RSS after the
   first 1,000 (``--baseline-at``).

The hashing embedder keeps it about memory, not the model. Prints one JSON object.
Run: ``uprof bench memory`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from benchmarks.server_ready import popen_serving, wait_until_healthy

APP = "app:planner"
AGENT = "agent:bench"
PURPOSE = "personalization"
QUERY = "where do I live, what do I like and what are my plans?"
#: Turns cycled through, numbered per subject, so every subject has its own texts.
TURNS = (
    "I live in Town{s} near the river",
    "I like jazz number {s}{t} and long walks",
    "I want to visit country {s} next year",
    "I am allergic to nut{s}",
    "Yesterday I met friend{s}{t} at the market",
    "I prefer meetings in the morning, item {t}",
    "I want to learn instrument {s}",
    "My sister{s} lives abroad",
)


#: The server process: the CLI's entry point, run by this interpreter.
SERVE_CLI = "from uprof.cli.main import app; app()"


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def seed(data_dir: Path, subjects: int, captures: int, echo: Callable[[str], None]) -> float:
    """Create the subjects in process; returns seconds taken."""
    from domain.values import Interaction
    from uprof.bootstrap import bootstrap
    from uprof.settings import Settings

    began = time.perf_counter()
    kernel = bootstrap(Settings(data_dir=data_dir, embedder="hashing"))
    start = datetime(2025, 1, 1, 9, tzinfo=UTC)
    try:
        for s in range(subjects):
            subject = f"subject-{s}"
            kernel.grant_consent(subject, app_id=APP, categories=["*"], purposes=[PURPOSE])
            kernel.capture_many(
                subject,
                [
                    Interaction(
                        app_id=APP,
                        agent_id=AGENT,
                        user_input=TURNS[t % len(TURNS)].format(s=s, t=t),
                        occurred_at=start + timedelta(hours=t),
                        sharing="shared",
                        purpose=PURPOSE,
                        session_id=f"session-{s}-{t // 5}",
                    )
                    for t in range(captures)
                ],
            )
            if (s + 1) % 500 == 0:
                kernel.process()
                echo(f"seeded {s + 1}/{subjects} subjects ({time.perf_counter() - began:.0f} s)")
        kernel.process()
    finally:
        kernel.close()
    return time.perf_counter() - began


def _api_key(data_dir: Path) -> str:
    from uprof.api import ApiKeyStore
    from uprof.settings import Settings

    keys = ApiKeyStore.open(Settings(data_dir=data_dir, embedder="hashing"))
    try:
        return keys.create(APP).token
    finally:
        keys.close()


def start_server(
    data_dir: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``uprof serve`` in its own process; returns it once /healthz answers."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "UPROF_DATA_DIR": str(data_dir),
        "UPROF_EMBEDDER": "hashing",
        **(extra_env or {}),
    }
    process, port = popen_serving(
        [sys.executable, "-c", SERVE_CLI, "serve", "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url, timeout_s=120, poll_s=0.2)
    except RuntimeError:
        process.terminate()
        raise
    return process, url


def slice_all(
    url: str,
    key: str,
    pid: int,
    subjects: int,
    clients: int,
    every: int,
    echo: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Slice each subject once, in order; sample the server's RSS every ``every`` subjects.

    Clients take subjects from one counter; at each checkpoint every client waits until
    all subjects before it are answered, so a sample sees exactly that many subjects.
    """
    samples: list[dict[str, Any]] = []
    lock = threading.Lock()
    done = threading.Condition(lock)
    state = {"next": 0, "answered": 0, "errors": 0}
    began = time.perf_counter()

    def client() -> None:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as http:
            while True:
                with lock:
                    n = state["next"]
                    if n >= subjects:
                        return
                    # Do not run past a checkpoint before it is sampled.
                    while n // every > len(samples):
                        done.wait()
                    state["next"] = n + 1
                body = {
                    "subject": f"subject-{n}",
                    "query": QUERY,
                    "budget_tokens": 512,
                    "purpose": PURPOSE,
                    "agent_id": AGENT,
                }
                response = http.post("/v1/slices", json=body)
                with lock:
                    if response.status_code != 200:
                        state["errors"] += 1
                    state["answered"] += 1
                    if state["answered"] % every == 0:
                        sample = {
                            "subjects_sliced": state["answered"],
                            **rss_kib(pid),
                            "seconds": round(time.perf_counter() - began, 1),
                        }
                        samples.append(sample)
                        echo(f"sliced {state['answered']}: RSS {sample['VmRSS'] / 1024:.1f} MiB")
                        done.notify_all()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if state["errors"]:
        raise RuntimeError(f"{state['errors']} slices failed")
    return samples


#: Written into a data folder once seeding finished, with the sizes it was seeded with.
SEEDED_MARK = "memory-bench-seeded.json"


def _seed_once(data_dir: Path, subjects: int, captures: int, echo: Callable[[str], None]) -> float:
    """Seed ``data_dir`` unless an earlier run seeded it with the same sizes (0 s then)."""
    mark = data_dir / SEEDED_MARK
    sizes = {"subjects": subjects, "captures": captures}
    if mark.exists():
        if json.loads(mark.read_text(encoding="utf-8")) != sizes:
            raise ValueError(f"{data_dir} was seeded with other sizes: {mark.read_text()}")
        echo(f"reusing the seeded folder {data_dir}")
        return 0.0
    seconds = seed(data_dir, subjects, captures, echo)
    mark.write_text(json.dumps(sizes), encoding="utf-8")
    return seconds


def main(
    out: Path | None,
    subjects: int = 10_000,
    captures: int = 20,
    clients: int = 4,
    every: int = 1_000,
    baseline_at: int = 1_000,
    echo: Callable[[str], None] = print,
    data_dir: Path | None = None,
    server_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Seed (or reuse ``data_dir``), serve, slice every subject, report RSS.

    ``data_dir`` keeps the seeded folder (its keys beside it, ``<dir>.keys``) so that
    several serving runs, e.g. with different ``server_env``, compare on the same data:
    each run serves a fresh copy of it (the slices record reads, which would otherwise
    make every run's data differ from the last).
    """
    if subjects % every or baseline_at % every or baseline_at > subjects:
        raise ValueError("subjects and baseline_at must be multiples of every, baseline ≤ subjects")
    with tempfile.TemporaryDirectory(prefix="uprof-memory-bench-") as tmp:
        # The data folder sits inside the temporary one so its key folder (a sibling,
        # ``<data>.keys``) goes with it.
        folder = Path(tmp) / "data"
        if data_dir is None:
            folder.mkdir()
            seed_s = _seed_once(folder, subjects, captures, echo)
        else:
            data_dir.mkdir(parents=True, exist_ok=True)
            seed_s = _seed_once(data_dir, subjects, captures, echo)
            # Closed SQLite files (nothing has them open), so a file copy is consistent.
            shutil.copytree(data_dir, folder)
            shutil.copytree(data_dir.with_name(data_dir.name + ".keys"), Path(tmp) / "data.keys")
        key = _api_key(folder)
        server, url = start_server(folder, server_env)
        try:
            started = rss_kib(server.pid)
            samples = slice_all(url, key, server.pid, subjects, clients, every, echo)
        finally:
            server.terminate()
            server.wait(60)
    by_count = {s["subjects_sliced"]: s for s in samples}
    base, last = by_count[baseline_at]["VmRSS"], samples[-1]["VmRSS"]
    result = {
        "benchmark": "memory",
        "backend": "sqlite",
        "embedder": "hashing",
        "server": "uprof serve subprocess, driven over REST",
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "subjects": subjects,
        "captures_per_subject": captures,
        "clients": clients,
        "server_env": server_env or {},
        "seed_seconds": round(seed_s, 1),
        "rss_at_start_mib": round(started["VmRSS"] / 1024, 1),
        f"rss_after_{baseline_at}_mib": round(base / 1024, 1),
        f"rss_after_{subjects}_mib": round(last / 1024, 1),
        "ratio": round(last / base, 3),
        "target_ratio": 1.10,
        "peak_rss_mib": round(samples[-1]["VmHWM"] / 1024, 1),
        "samples": samples,
    }
    text = json.dumps(result, indent=2)
    echo(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_bench", description=__doc__)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--captures", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--every", type=int, default=1_000)
    parser.add_argument("--baseline-at", type=int, default=1_000)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--data-dir", type=Path, help="seed here once and reuse it in later runs (kept)"
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the server process (repeatable)",
    )
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.server_env)
    main(
        args.out,
        args.subjects,
        args.captures,
        args.clients,
        args.every,
        args.baseline_at,
        data_dir=args.data_dir,
        server_env=env,
    )
