"""What a kernel start and a server app build cost on a store already at schema head.

``python -m benchmarks.startup --backend sqlite|postgres [...] --runs N [--out PATH]``

One first start creates the store (SQLite folder or a PostgreSQL database of its own,
removed afterwards) and an API key; it is not timed. Then each run times, on that store:

- ``start``: ``bootstrap(settings)`` then ``kernel.close()`` (what every CLI command and
  ``uprof serve`` pay before doing anything);
- ``start_serve``: the same with ``background_workers`` on, as ``uprof serve`` starts (the
  extractor and the token table are built at start, not on first use);
- ``create_server``: ``create_server(kernel, keys)`` on a kernel (``start_serve``'s
  settings) built outside the timing;
- ``first_request``: the app's first request, ``GET /healthz`` through httpx's ASGI
  transport (no lifespan, no socket);
- ``first_auth_request``: then ``GET /v1/whoami`` with the key (the cheapest
  authenticated route; the first request to pass authentication).

Two settings of the same measurements:

- ``in_process``: all runs in this process (imports done by the first start): what a
  test worker or a long-lived process building kernels and apps again pays;
- ``fresh_process``: each run in a new child process (``--child``) that imports the
  modules, then times its first start, app build and requests: what one CLI command or
  one ``uprof serve`` start pays. Imports done before the timing are not counted;
  imports done lazily inside the calls are.

Prints JSON (and writes it to ``--out``): every run's wall and CPU milliseconds, their
medians, the commit and the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.bench_common import run_context
from benchmarks.reliability import Target, make_settings, temp_target

STEPS = ("start", "start_serve", "create_server", "first_request", "first_auth_request")


def _timed(run: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, wall ms, CPU ms of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return result, (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def _get(app: Any, path: str, token: str | None = None) -> int:
    import httpx

    async def call() -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            response = await client.get(path, headers=headers)
        return response.status_code

    return asyncio.run(call())


def _first_start(target: Target) -> str:
    """Create the store (schema at head) and one API key; return the key's token."""
    from uprof.api import ApiKeyStore
    from uprof.bootstrap import bootstrap

    settings = make_settings(target)
    bootstrap(settings).close()
    keys = ApiKeyStore.open(settings)
    try:
        return keys.create("app:planner").token
    finally:
        keys.close()


def one_run(target: Target, token: str) -> dict[str, tuple[float, float]]:
    """One run of every step on ``target``: {step: (wall ms, CPU ms)}."""
    from uprof.api import ApiKeyStore
    from uprof.bootstrap import bootstrap
    from uprof.server import create_server

    settings = make_settings(target)
    out: dict[str, tuple[float, float]] = {}
    _, wall, cpu = _timed(lambda: bootstrap(settings).close())
    out["start"] = (wall, cpu)
    serve = make_settings(target, background_workers=True)
    _, wall, cpu = _timed(lambda: bootstrap(serve).close())
    out["start_serve"] = (wall, cpu)
    kernel = bootstrap(serve)
    keys = ApiKeyStore.open(settings)
    try:
        app, wall, cpu = _timed(lambda: create_server(kernel, keys))
        out["create_server"] = (wall, cpu)
        status, wall, cpu = _timed(lambda: _get(app, "/healthz"))
        assert status == 200, status
        out["first_request"] = (wall, cpu)
        status, wall, cpu = _timed(lambda: _get(app, "/v1/whoami", token))
        assert status == 200, status
        out["first_auth_request"] = (wall, cpu)
    finally:
        keys.close()
        kernel.close()
    return out


def _child(target: Target, token: str) -> None:
    # Import what the timed calls need at module level, as `uprof serve` has by then.
    import httpx  # noqa: F401

    import uprof.api
    import uprof.bootstrap
    import uprof.server  # noqa: F401

    print(json.dumps(one_run(target, token)))


def _summary(runs: list[dict[str, tuple[float, float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for step in STEPS:
        walls = [round(r[step][0], 2) for r in runs]
        cpus = [round(r[step][1], 2) for r in runs]
        out[step] = {
            "median_wall_ms": round(statistics.median(walls), 2),
            "median_cpu_ms": round(statistics.median(cpus), 2),
            "wall_ms": walls,
            "cpu_ms": cpus,
        }
    return out


def _measure(backend: str, runs: int, fresh_runs: int) -> dict[str, Any]:
    with temp_target(backend) as target:
        token = _first_start(target)
        one_run(target, token)  # warm-up: the lazy imports of a first start and app
        in_process = [one_run(target, token) for _ in range(runs)]
        fresh = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
        env["HF_HUB_OFFLINE"] = "1"
        child = [target.kind, str(target.data_dir), target.database_url or "-", token]
        for _ in range(fresh_runs):
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.startup", "--child", *child],
                cwd=Path(__file__).resolve().parent.parent,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            last = done.stdout.strip().splitlines()[-1]
            fresh.append({k: (v[0], v[1]) for k, v in json.loads(last).items()})
    return {
        "runs": runs,
        "in_process": _summary(in_process),
        "fresh_process": _summary(fresh),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", nargs="+", choices=("sqlite", "postgres"), default=["sqlite"])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--fresh-runs", type=int, help="fresh-process runs (default --runs)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=4, metavar=("KIND", "DATA_DIR", "URL", "TOKEN"))
    args = parser.parse_args(argv)
    if args.child:
        kind, data_dir, url, token = args.child
        _child(Target(kind, Path(data_dir), None if url == "-" else url), token)
        return 0

    result: dict[str, Any] = {"context": run_context(), "python": sys.version.split()[0]}
    for backend in args.backend:
        result[backend] = _measure(backend, args.runs, args.fresh_runs or args.runs)
    result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
