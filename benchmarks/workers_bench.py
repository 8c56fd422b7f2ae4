"""Exactly-once extraction and projection with many worker processes (issue 14).

Real processes on one database: ``uprof worker`` processes (and, in the stress run,
``uprof serve`` processes with their built-in worker) race on the same log while
captures arrive; some are SIGKILLed at random and restarted. When they have caught
up they are stopped with SIGTERM (each must exit 0) and the log and views are checked:

- **duplicate**: a capture cited by more than one ``MemoryRecorded`` event in the log.
  The rules extractor proposes exactly one memory per capture whose text is not small
  talk, citing only that capture, and every text sent here is of that kind; so a
  capture extracted twice has two, one extracted never has none (**missing**).
- **view duplicates / missing**: the same count over the memories view (rows whose
  evidence is the capture), and captures in the log against rows of the captures view.
- **rebuild equals live**: the views equal a clean replay of the log.
- **lost**: a capture acknowledged to a client (a capture id returned) not in the log.

Scenarios (``uprof bench reliability workers``; ``tests/reliability/test_workers.py``
runs small versions):

- ``race``: W workers, all running every partition, captures arriving meanwhile.
- ``kill``: the same with random SIGKILLs and restarts of the workers.
- ``stress``: 2 servers (built-in worker) + 3 workers, 8 REST clients, random
  SIGKILLs of workers, repeated ``runs`` times on fresh databases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.reliability import (
    PLANNER,
    REPO,
    Target,
    converges,
    grant_all,
    interaction,
    line_within,
    make_settings,
    open_kernel,
    temp_target,
)
from benchmarks.server_ready import popen_serving, wait_until_healthy

DEFAULT_OUT = REPO / "docs" / "bench" / "workers.json"
CLI = ["-c", "from uprof.cli.main import app; app()"]
#: ``uprof worker`` without importing the rest of the CLI (see uprof/cli/worker.py).
WORKER_CLI = ["-m", "uprof.cli.worker"]
#: How long a child may take to say it is ready (a worker's line, a server's /healthz).
START_TIMEOUT_S = 300.0

#: How a worker's process is started from its command line (``[python, "-m" | "-c", ...,
#: *args]``) and environment: ``subprocess.Popen`` of a fresh interpreter when None. The
#: test suite passes one that forks the same command from its fork server
#: (``tests.children.forked_popen``): a process of its own all the same, without paying a
#: fresh interpreter's imports at every start and restart. What it returns is used as a
#: ``Popen`` in text mode: ``stdout`` a pipe read line by line, ``poll``, ``send_signal``,
#: ``kill``, ``communicate`` (stdout, stderr), ``returncode`` and ``pid``.
Launch = Callable[[list[str], dict[str, str]], Any]


def _env(target: Target, partitions: int) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "UPROF_WORKER_PARTITIONS": str(partitions),
        "UPROF_EXTRACTOR": "rules",
        "UPROF_EMBEDDER": "hashing",
        "UPROF_DATA_DIR": str(target.data_dir),
    }
    env.pop("UPROF_DATABASE_URL", None)
    if target.database_url:
        env["UPROF_DATABASE_URL"] = target.database_url
    return env


@dataclass
class Child:
    """A worker or server process, restartable with the same arguments."""

    args: list[str]
    env: dict[str, str]
    ready: str  # a stdout line prefix (worker) or "http" (server: /healthz answers)
    port: int = 0
    entry: list[str] = field(default_factory=lambda: list(CLI))
    proc: Any = None  # a ``subprocess.Popen[str]``, or what ``launch`` returned
    #: Whether the running process has been seen ready (a restart may be killed before).
    seen_ready: bool = False
    starts: int = 0
    kills: int = 0
    log: list[str] = field(default_factory=list)
    #: Seconds the child may take to be ready (None: ``START_TIMEOUT_S``).
    start_timeout_s: float | None = None
    #: How a worker (not a server) is started: ``Launch``; None: a fresh interpreter.
    launch: Launch | None = None

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        command = [sys.executable, *self.entry, *self.args]
        options: dict[str, Any] = {
            "cwd": REPO,
            "env": self.env,
            "stdout": subprocess.PIPE,
            "stderr": subprocess.PIPE,
            "text": True,
        }
        if self.ready == "http":  # a server: on a socket of its own, a new port each start
            self.proc, self.port = popen_serving(command, **options)
        elif self.launch is not None:
            self.proc = self.launch(command, self.env)
        else:
            self.proc = subprocess.Popen(command, **options)
        self.starts += 1
        self.seen_ready = False

    def wait_ready(self) -> None:
        assert self.proc is not None
        if self.seen_ready:
            return
        self.seen_ready = True
        if self.ready == "http":
            proc = self.proc

            def exited() -> str:
                stderr = proc.stderr.read() if proc.stderr is not None else ""
                return f"server exited: {stderr[-3000:]}"

            wait_until_healthy(proc, self.url, timeout_s=START_TIMEOUT_S, exited=exited)
            return
        assert self.proc.stdout is not None
        timeout_s = START_TIMEOUT_S if self.start_timeout_s is None else self.start_timeout_s
        proc = self.proc

        def stacks_then_kill() -> None:
            # Hung before its ready line: a worker writes its threads' stacks on SIGUSR1
            # (registered before its start-up opens the stores).
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            proc.kill()

        line = line_within(proc.stdout, timeout_s, stacks_then_kill)
        if line is not None and line.startswith(self.ready):
            return
        proc.kill()
        _, err = proc.communicate()
        said = f"not ready within {timeout_s:.0f} s" if line is None else repr(line)
        raise RuntimeError(f"worker did not start: {said} {err[-3000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sigkill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate()
        self.kills += 1

    def kill_if_running(self) -> None:
        """SIGKILL the process if it is still running, and reap it (not counted as a kill)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def sigterm(self, timeout_s: float = 60.0) -> int:
        """Stop gracefully; returns the exit code (a worker exits 0; uvicorn re-raises the
        SIGTERM it handled once it has shut down, so a server's graceful exit is -15)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        else:
            self.log.append((out or "")[-500:] + (err or "")[-8000:])
            return int(self.proc.returncode)
        if self.ready != "http":  # a worker writes its threads' stacks on SIGUSR1
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
        self.proc.kill()
        out, err = self.proc.communicate()
        self.log.append("did not stop within the timeout")
        self.log.append((out or "")[-500:] + (err or "")[-8000:])
        return int(self.proc.returncode)


@contextmanager
def killed_on_failure(children: Sequence[Child]) -> Iterator[None]:
    """On any exception, SIGKILL and reap every child still running, then re-raise.

    A worker runs until it is sent SIGTERM (``finish`` does that): a scenario that fails
    before then would otherwise leave its workers polling the store (a dropped or reused
    test database) for as long as the machine runs, each holding a core's share.
    """
    try:
        yield
    except BaseException:
        for child in children:
            child.kill_if_running()
        raise


def worker_child(
    target: Target, partitions: int, partition: int | None, launch: Launch | None = None
) -> Child:
    args = ["--partitions", str(partitions), "--idle-poll", "0.02", "--log-level", "warning"]
    if partition is not None:
        args += ["--partition", str(partition)]
    env = _env(target, partitions)
    return Child(args, env, ready="uprof worker ready", entry=WORKER_CLI, launch=launch)


def server_child(target: Target, partitions: int) -> Child:
    args = ["serve", "--log-level", "warning"]
    return Child(args, _env(target, partitions), ready="http")


# ------------------------------------------------------------------------- checks


def derived_counts(kernel: Any) -> dict[str, int]:
    """Duplicate and missing extractions in the log and in the views (module docstring)."""
    import sqlalchemy as sa

    from domain.profile import SubjectProfile as P
    from projections.profile import tables as t

    app = kernel.app
    captures: set[str] = set()
    memories: Counter[str] = Counter()
    position = 0
    while True:
        page = app.notifications_after(position, 500)
        if not page:
            break
        for n in page:
            event = app.decode(n)
            if isinstance(event, P.InteractionCaptured):
                captures.add(event.capture_id)
            elif isinstance(event, P.MemoryRecorded):
                memories.update(event.evidence)
        position = page[-1].id
    with kernel.views_engine.connect() as conn:
        view_memories: Counter[str] = Counter()
        for (evidence,) in conn.execute(sa.select(t.memories.c.evidence)):
            view_memories.update(json.loads(evidence))
        view_captures = Counter(r[0] for r in conn.execute(sa.select(t.captures.c.capture_id)))
    return {
        "captures": len(captures),
        "memories": sum(memories.values()),
        "duplicate": sum(1 for c in captures if memories[c] > 1),
        "missing": sum(1 for c in captures if memories[c] == 0),
        "view_duplicate": sum(1 for c in captures if view_memories[c] > 1),
        "view_missing": sum(1 for c in captures if view_memories[c] == 0),
        "view_captures_missing": sum(1 for c in captures if view_captures[c] == 0),
        "view_captures_duplicate": sum(1 for c, k in view_captures.items() if k > 1),
        "log_position": app.max_notification_id(),
    }


def wait_caught_up(kernel: Any, timeout_s: float) -> bool:
    """Poll (bounded) until every partition's extraction and projection reached the head."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if kernel.lag().caught_up:
            return True
        time.sleep(0.1)
    return False


def finish(
    target: Target,
    partitions: int,
    children: Sequence[Child],
    acked: Sequence[str],
    *,
    catch_up_s: float,
) -> dict[str, Any]:
    """Let the children catch up, stop them with SIGTERM, then check log and views.

    Nothing is processed by this process before the counts are taken: what the
    children left undone shows as missing.
    """
    kernel = open_kernel(target, worker_partitions=partitions)
    try:
        t0 = time.perf_counter()
        caught_up = wait_caught_up(kernel, catch_up_s)
        t1 = time.perf_counter()
        exit_codes = [c.sigterm() for c in children]
        figures_t = {"catch_up_s": round(t1 - t0, 1), "stop_s": round(time.perf_counter() - t1, 1)}
        figures: dict[str, Any] = derived_counts(kernel)
        figures.update(figures_t)
        logged = _logged_capture_ids(kernel)
        figures["lost"] = sum(1 for a in acked if a not in logged)
        figures["acked"] = len(acked)
        figures["caught_up"] = caught_up
        figures["graceful_exits"] = sum(
            1
            for child, code in zip(children, exit_codes, strict=True)
            if code == 0 or (child.ready == "http" and code == -signal.SIGTERM)
        )
        figures["children"] = len(children)
        figures["exit_codes"] = exit_codes
        # What a child that did not stop gracefully wrote last (its stacks, if it hung).
        figures["stop_logs"] = "\n".join(
            f"child {i} exit {code}: " + " | ".join(child.log[-2:])
            for i, (child, code) in enumerate(zip(children, exit_codes, strict=True))
            if code != 0 and not (child.ready == "http" and code == -signal.SIGTERM)
        )
        figures["sigkills"] = sum(c.kills for c in children)
        figures["rebuild_equals_live"] = converges(kernel)
    finally:
        kernel.close()
    figures["ok"] = (
        figures["duplicate"] == 0
        and figures["missing"] == 0
        and figures["view_duplicate"] == 0
        and figures["view_missing"] == 0
        and figures["view_captures_missing"] == 0
        and figures["view_captures_duplicate"] == 0
        and figures["lost"] == 0
        and figures["caught_up"]
        and figures["graceful_exits"] == figures["children"]
        and figures["rebuild_equals_live"]
    )
    return figures


def _logged_capture_ids(kernel: Any) -> set[str]:
    from domain.profile import SubjectProfile as P
    from uprof.eventstore import CAPTURED_TOPIC

    out: set[str] = set()
    position = 0
    while page := kernel.app.notifications_after(position, 500, topics=(CAPTURED_TOPIC,)):
        for n in page:
            event = kernel.app.decode(n)
            if isinstance(event, P.InteractionCaptured):
                out.add(event.capture_id)
        position = page[-1].id
    return out


SUBJECTS = [f"worker-subject-{i}" for i in range(12)]


def _seed(target: Target, partitions: int, subjects: Sequence[str]) -> None:
    """Create the stores, keys and consents before any child starts (they share them)."""
    with_kernel = open_kernel(target, worker_partitions=partitions)
    try:
        for s in subjects:
            grant_all(with_kernel, s)
    finally:
        with_kernel.close()


def _capture_for(
    target: Target, partitions: int, seconds: float, seed: int, stop: threading.Event | None = None
) -> list[str]:
    """Capture in this process (1 to 3 per call, random subjects) for ``seconds``."""
    rng = random.Random(seed)
    acked: list[str] = []
    kernel = open_kernel(target, worker_partitions=partitions)
    try:
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            batch = [
                interaction(f"I want to visit the place number {seed}x{n + k} next spring")
                for k in range(rng.choice([1, 1, 2, 3]))
            ]
            n += len(batch)
            acked.extend(a.capture_id for a in kernel.capture_many(rng.choice(SUBJECTS), batch))
            time.sleep(rng.uniform(0, 0.01))
    finally:
        kernel.close()
    return acked


def layout_children(
    target: Target, partitions: int, spec: Sequence[int | None], launch: Launch | None = None
) -> list[Child]:
    return [worker_child(target, partitions, k, launch) for k in spec]


def start_all(children: Sequence[Child]) -> None:
    """Start the children side by side (start-up, not the run, dominates on a busy machine);
    if one does not start, none is left running."""
    with killed_on_failure(children):
        for child in children:
            child.spawn()
        for child in children:
            child.wait_ready()


def race_scenario(
    target: Target,
    *,
    partitions: int = 1,
    spec: Sequence[int | None] = (None, None, None),
    seconds: float = 3.0,
    kills: int = 0,
    seed: int = 7,
    catch_up_s: float = 120.0,
    max_seconds: float = 180.0,
    launch: Launch | None = None,
) -> dict[str, Any]:
    """Workers (``spec``: the partition each runs, None: all) race while captures arrive
    for ``seconds``; with ``kills``, a random worker is SIGKILLed and restarted every
    0.1-0.6 s, and captures go on until that many kills happened (at most max_seconds).
    ``launch``: how each worker's process starts (``Launch``)."""
    rng = random.Random(seed)
    _seed(target, partitions, SUBJECTS)
    # A backlog first, so that every worker starts on the same unprocessed range.
    acked = _capture_for(target, partitions, seconds / 3, seed)
    children = layout_children(target, partitions, spec, launch)
    start_all(children)
    done = threading.Event()
    killer_errors: list[str] = []

    def killer() -> None:
        while not done.wait(rng.uniform(0.1, 0.6)):
            victim = rng.choice(children)
            try:
                victim.sigkill()
                victim.spawn()
                if rng.random() < 0.5:
                    victim.wait_ready()  # so that a later kill finds it mid-batch
            except Exception as e:  # a restart that failed is a finding, not a crash here
                killer_errors.append(f"{type(e).__name__}: {e}"[:300])

    thread = threading.Thread(target=killer) if kills else None
    with killed_on_failure(children):  # until finish() has stopped them
        if thread is not None:
            thread.start()
        try:
            began = time.monotonic()
            round_ = 1
            while True:
                acked += _capture_for(target, partitions, seconds, seed + round_)
                round_ += 1
                killed = sum(c.kills for c in children)
                if killed >= kills or time.monotonic() - began > max_seconds:
                    break
        finally:
            done.set()
            if thread is not None:
                thread.join()
        for child in children:
            child.wait_ready()
        figures = finish(target, partitions, children, acked, catch_up_s=catch_up_s)
    figures.update(
        backend=target.kind,
        partitions=partitions,
        workers=[("all" if k is None else k) for k in spec],
        restart_errors=killer_errors,
    )
    figures["ok"] = figures["ok"] and not killer_errors
    return figures


# ---------------------------------------------------------------- stress (REST)


async def _rest_load(
    urls: Sequence[str], key: str, clients: int, seconds: float, seed: int
) -> tuple[list[str], Counter[int]]:
    import httpx

    acked: list[str] = []
    statuses: Counter[int] = Counter()
    deadline = time.monotonic() + seconds
    rng = random.Random(seed)

    async def client(index: int) -> None:
        n = 0
        async with httpx.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as http:
            while time.monotonic() < deadline:
                url = urls[(index + n) % len(urls)]
                body = {
                    "subject": rng.choice(SUBJECTS),
                    "agent_id": "agent:stress",
                    "user_input": f"I want to see the city number {seed}x{index}x{n} soon",
                    "occurred_at": datetime.now(UTC).isoformat(),
                    "purpose": "personalization",
                    "sharing": "shared",
                }
                n += 1
                try:
                    response = await http.post(f"{url}/v1/captures", json=body)
                except httpx.HTTPError:
                    statuses[-1] += 1
                    continue
                statuses[response.status_code] += 1
                if response.status_code == 201:
                    acked.append(response.json()["capture_id"])

    await asyncio.gather(*(client(i) for i in range(clients)))
    return acked, statuses


def stress_run(
    target: Target,
    *,
    partitions: int = 2,
    seconds: float = 20.0,
    clients: int = 8,
    seed: int = 1,
    catch_up_s: float = 180.0,
) -> dict[str, Any]:
    """2 servers (built-in worker, all partitions) + 3 workers (partitions 0, 1 and all
    when partitioned, else all three on every partition), 8 REST clients, SIGKILLs."""
    from uprof.api import ApiKeyStore

    rng = random.Random(seed)
    _seed(target, partitions, SUBJECTS)
    settings = make_settings(target, worker_partitions=partitions)
    keys = ApiKeyStore.open(settings)
    try:
        key = keys.create(PLANNER).token
    finally:
        keys.close()
    servers = [server_child(target, partitions) for _ in range(2)]
    spec: list[int | None] = [0, 1, None] if partitions == 2 else [None, None, None]
    workers = layout_children(target, partitions, spec)
    t0 = time.perf_counter()
    start_all([*servers, *workers])  # leaves no orphan polling a dropped database
    started_s = time.perf_counter() - t0
    done = threading.Event()
    killer_errors: list[str] = []

    def killer() -> None:
        while not done.wait(rng.uniform(0.3, 1.5)):
            victim = rng.choice(workers)
            try:
                # Restarted without waiting: the next kill may find it starting up, or
                # in the middle of a batch.
                victim.sigkill()
                victim.spawn()
                if rng.random() < 0.3:
                    victim.wait_ready()  # so that a later kill finds it mid-batch
            except Exception as e:
                killer_errors.append(f"{type(e).__name__}: {e}"[:300])

    thread = threading.Thread(target=killer)
    with killed_on_failure([*servers, *workers]):  # until finish() has stopped them
        thread.start()
        try:
            acked, statuses = asyncio.run(
                _rest_load([s.url for s in servers], key, clients, seconds, seed)
            )
        finally:
            done.set()
            thread.join()
        for child in workers:
            child.wait_ready()
        t1 = time.perf_counter()
        figures = finish(target, partitions, [*servers, *workers], acked, catch_up_s=catch_up_s)
    figures["phases_s"] = {
        "start": round(started_s, 1),
        "load": round(t1 - t0 - started_s, 1),
        "finish": round(time.perf_counter() - t1, 1),
    }
    figures.update(
        backend=target.kind,
        partitions=partitions,
        servers=len(servers),
        workers=[("all" if k is None else k) for k in spec],
        statuses={str(k): v for k, v in statuses.items()},
        restart_errors=killer_errors,
    )
    figures["ok"] = figures["ok"] and not killer_errors and figures["acked"] > 0
    return figures


def stress_scenario(
    kind: str, *, runs: int, seconds: float, partitions: int, seed: int = 1
) -> dict[str, Any]:
    results = []
    start_failures = 0
    for i in range(runs):
        with temp_target(kind) as target:
            t0 = time.perf_counter()
            try:
                r = stress_run(target, partitions=partitions, seconds=seconds, seed=seed + i)
            except RuntimeError as e:
                # A child that did not start in time (an overloaded machine): no run took
                # place, so nothing is counted; the database is dropped and the next begins.
                start_failures += 1
                print(json.dumps({"run": i + 1, "start_failure": str(e)[:300]}), flush=True)
                continue
            r["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps({"run": i + 1, **r}, default=str), flush=True)
        results.append(r)
    keys = ("duplicate", "missing", "view_duplicate", "view_missing", "lost")
    return {
        "backend": kind,
        "runs": len(results),
        "runs_ok": sum(1 for r in results if r["ok"]),
        "start_failures": start_failures,
        "seconds_per_run": seconds,
        "partitions": partitions,
        "captures_total": sum(r["captures"] for r in results),
        "acked_total": sum(r["acked"] for r in results),
        "sigkills_total": sum(r["sigkills"] for r in results),
        **{f"{k}_total": sum(r[k] for r in results) for k in keys},
        "rebuild_equals_live_runs": sum(1 for r in results if r["rebuild_equals_live"]),
        "runs_detail": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.workers_bench", description=__doc__)
    p.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    if args.out.exists():
        try:
            results = json.loads(args.out.read_text())
        except ValueError:
            results = {}
    all_ok = True
    for kind in args.backend or ["sqlite", "postgres"]:
        started = time.perf_counter()
        summary = stress_scenario(
            kind, runs=args.runs, seconds=args.seconds, partitions=args.partitions, seed=args.seed
        )
        summary["wall_s"] = round(time.perf_counter() - started, 1)
        summary["load_average_after"] = os.getloadavg()
        summary["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        summary["command"] = (
            f"uprof bench reliability workers --backend {kind} --runs {args.runs} "
            f"--seconds {args.seconds:g} --partitions {args.partitions}"
        )
        results[f"stress-{kind}-{args.partitions}p"] = summary
        all_ok = all_ok and summary["runs_ok"] == summary["runs"]
        print(json.dumps({k: v for k, v in summary.items() if k != "runs_detail"}), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
