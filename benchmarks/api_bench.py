"""REST benchmark: slice overhead over in-process, and sustained capture over HTTP.

Two figures, both on loopback with the server in its own process (``uprof serve``'s
wiring: background pipeline worker, API-key auth, metrics and limits on):

1. **Slice overhead.** The same subject and query, sliced over REST (``POST
   /v1/slices``, keep-alive), then in process (``kernel.slice``), each after a warm-up;
   reports p50/p95 of each and the p50 difference. The two processes do not run alike
   (the server also runs the pipeline worker), so that difference mixes what HTTP adds
   with what background work costs a request. The edge overhead separates them: per
   request, the client's time minus the kernel's own time for that slice, which the
   server reports in its ``Server-Timing`` header.
   Both sides pass ``wait_timeout_s=0``: each slice records a ``SliceServed`` event,
   and only the server's worker may run the pipeline (two processes running it at once
   collide on the projection position), so neither side waits for it; the figure is
   what HTTP, authentication and JSON add to the same slice.
2. **Sustained capture.** This process is the load generator: ``--concurrency``
   clients POST ``/v1/captures`` for ``--subjects`` consenting subjects until
   ``--captures`` requests or ``--seconds`` have passed, whichever comes first;
   reports requests/s, p50/p99 and any non-201 answers. ``--no-worker`` serves without
   the pipeline worker (``uprof serve --no-worker``, as beside ``uprof worker``
   processes), to separate the write path from the extraction and projection work
   that otherwise shares the server's process.
   ``--generator`` picks the load generator: ``httpx`` (asyncio clients in this
   process, the default and the generator of the earlier figures) or ``wrk`` (the C
   load generator from Debian's ``wrk`` package, with a Lua script that varies the
   bodies). On two cores a Python client costs about as much CPU per request as the
   server, so it can be what limits the rate; ``wrk`` costs a fraction of that.
   Both report the CPU seconds the server process and the generator used during the
   load (per 1,000 captures too): wall-clock rates swing with whatever else runs on
   the machine, CPU per capture much less.

Prints one JSON object. Run: ``python -m benchmarks.api_bench [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.server_ready import wait_until_healthy

PURPOSE = "personalization"
AGENT = "agent:bench"
APP = "app:planner"
QUERY = "what are my plans and preferences?"


def _percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds a live process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process plus its children that have been waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _settings(data_dir: Path, embedder: str, background: bool, run_worker: bool = True) -> Any:
    from uprof.settings import Settings

    return Settings(
        data_dir=data_dir,
        embedder=embedder,
        background_workers=background,
        run_worker=run_worker,
    )


# ------------------------------------------------------------------ server mode


def serve(data_dir: Path, port: int, embedder: str, run_worker: bool = True) -> None:
    """The server process: what ``uprof serve`` runs, with access logs off."""
    import uvicorn

    from uprof.api import ApiKeyStore
    from uprof.api.logconfig import server_log_config
    from uprof.bootstrap import bootstrap
    from uprof.server import create_server

    settings = _settings(data_dir, embedder, background=True, run_worker=run_worker)
    kernel = bootstrap(settings)
    keys = ApiKeyStore.open(settings)
    try:
        uvicorn.run(
            create_server(kernel, keys),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            log_config=server_log_config("warning"),
        )
    finally:
        keys.close()
        kernel.close()


def _start_server(
    data_dir: Path, embedder: str, run_worker: bool = True
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.api_bench",
            "--serve",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            "--embedder",
            embedder,
            *([] if run_worker else ["--no-worker"]),
        ],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url, timeout_s=120, poll_s=0.1)
    except RuntimeError:
        process.terminate()
        raise
    return process, url


# --------------------------------------------------------------------- figures


def _seed(kernel: Any, subjects: int, turns: int) -> None:
    from domain.values import Interaction

    texts = [
        "I want to run a half marathon in spring",
        "I like jazz and long walks",
        "I live in Lisbon",
        "I want to learn the cello",
        "I am vegetarian",
        "I prefer meetings in the morning",
        "I want to visit Japan next year",
    ]
    for s in range(subjects):
        subject = f"subject-{s}"
        kernel.grant_consent(subject, app_id=APP, categories=["*"], purposes=[PURPOSE])
        if s == 0:
            kernel.capture_many(
                subject,
                [
                    Interaction(
                        app_id=APP,
                        agent_id=AGENT,
                        user_input=f"{texts[i % len(texts)]} ({i})",
                        occurred_at=datetime(2025, 1, 1 + i % 28, 9, tzinfo=UTC),
                        sharing="shared",
                        purpose=PURPOSE,
                    )
                    for i in range(turns)
                ],
            )
    kernel.process()


def slice_overhead(kernel: Any, url: str, key: str, iterations: int) -> dict[str, Any]:
    """The same slice over REST, then in process, each phase alone so neither side's
    read recording competes with the other's requests."""
    body = {
        "subject": "subject-0",
        "query": QUERY,
        "budget_tokens": 512,
        "purpose": PURPOSE,
        "agent_id": AGENT,
        "wait_timeout_s": 0,
    }
    remote: list[float] = []
    edge: list[float] = []  # per request: client-observed time minus the server's slice
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        for i in range(iterations + 5):
            began = time.perf_counter()
            response = http.post("/v1/slices", json=body)
            took = time.perf_counter() - began
            if response.status_code != 200:
                raise RuntimeError(
                    f"slice over REST failed: {response.status_code} {response.text}"
                )
            if i >= 5:  # the first few warm caches and connections
                remote.append(took)
                edge.append(took - _server_slice_s(response))
    local: list[float] = []
    for i in range(iterations + 5):
        began = time.perf_counter()
        kernel.slice(
            "subject-0",
            QUERY,
            budget_tokens=512,
            purpose=PURPOSE,
            app_id=APP,
            agent_id=AGENT,
            wait_timeout_s=0,
        )
        if i >= 5:
            local.append(time.perf_counter() - began)
    p50_local, p50_remote = statistics.median(local), statistics.median(remote)
    return {
        "iterations": iterations,
        "in_process_p50_ms": _ms(p50_local),
        "in_process_p95_ms": _ms(_percentile(local, 0.95)),
        "rest_p50_ms": _ms(p50_remote),
        "rest_p95_ms": _ms(_percentile(remote, 0.95)),
        "rest_overhead_p50_ms": _ms(p50_remote - p50_local),
        "edge_overhead_p50_ms": _ms(statistics.median(edge)),
        "edge_overhead_p95_ms": _ms(_percentile(edge, 0.95)),
    }


def _server_slice_s(response: httpx.Response) -> float:
    """The kernel's own time for this slice, from the server's Server-Timing header."""
    timing = response.headers.get("Server-Timing", "")
    for metric in timing.split(","):
        name, _, params = metric.strip().partition(";")
        if name == "slice" and params.startswith("dur="):
            return float(params[len("dur=") :]) / 1000
    raise RuntimeError(f"no slice timing in the response: {timing!r}")


async def _capture_load(
    url: str, key: str, subjects: int, total: int, seconds: float, concurrency: int
) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    sent = 0
    deadline = time.monotonic() + seconds

    async def worker(http: httpx.AsyncClient, index: int) -> None:
        nonlocal sent
        while sent < total and time.monotonic() < deadline:
            n = sent
            sent += 1
            body = {
                "subject": f"subject-{n % subjects}",
                "agent_id": AGENT,
                "user_input": f"I want to try activity number {n}",
                "occurred_at": "2025-02-01T10:00:00Z",
                "purpose": PURPOSE,
                "sharing": "shared",
            }
            began = time.perf_counter()
            response = await http.post("/v1/captures", json=body)
            latencies.append(time.perf_counter() - began)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60, limits=limits
    ) as http:
        began = time.perf_counter()
        await asyncio.gather(*(worker(http, i) for i in range(concurrency)))
        elapsed = time.perf_counter() - began
    return {
        "requests": len(latencies),
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": _ms(statistics.median(latencies)),
        "p99_ms": _ms(_percentile(latencies, 0.99)),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


#: wrk's Lua script: POST /v1/captures with bodies like the httpx generator's (the
#: subject cycles, the text is unique) and print one JSON line of statuses and latency
#: percentiles. wrk has no request budget (a stopped thread does not end the run), so
#: it runs for ``--seconds``.
WRK_SCRIPT = r"""
local threads = {}
local next_id = 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end
function init(args)
  subjects = tonumber(args[1]); n = 0
  statuses = {}
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. args[2]
end
function request()
  n = n + 1
  local body = string.format(
    '{"subject":"subject-%d","agent_id":"agent:bench",' ..
    '"user_input":"I want to try activity number %d-%d",' ..
    '"occurred_at":"2025-02-01T10:00:00Z","purpose":"personalization","sharing":"shared"}',
    (n * 7 + id) % subjects, id, n)
  return wrk.format(nil, "/v1/captures", nil, body)
end
function response(status, headers, body)
  local key = tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
end
function done(summary, latency, requests)
  local merged = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do
      merged[status] = (merged[status] or 0) + count
    end
  end
  local parts = {}
  for status, count in pairs(merged) do
    table.insert(parts, string.format('"%s": %d', status, count))
  end
  io.write(string.format(
    'WRK-RESULT {"requests": %d, "seconds": %.3f, "p50_ms": %.3f, "p99_ms": %.3f, ' ..
    '"socket_errors": %d, "statuses": {%s}}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000,
    latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.timeout,
    table.concat(parts, ", ")))
end
"""


def _wrk_capture_load(
    url: str, key: str, subjects: int, total: int, seconds: float, concurrency: int
) -> dict[str, Any]:
    """The capture load from wrk (``apt-get install wrk``): ``concurrency`` connections
    over two threads for ``seconds`` (``total`` does not apply)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("--generator wrk needs the wrk program (Debian: apt-get install wrk)")
    threads = min(2, concurrency)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    try:
        command = [
            wrk,
            f"--threads={threads}",
            f"--connections={concurrency}",
            f"--duration={max(1, round(seconds))}s",
            "--timeout=60s",
            f"--script={script.name}",
            url,
            "--",
            str(subjects),
            key,
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, check=True, timeout=seconds + 120
        )
    finally:
        os.unlink(script.name)
    line = next((x for x in done.stdout.splitlines() if x.startswith("WRK-RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    result = json.loads(line.removeprefix("WRK-RESULT "))
    return {
        "requests": result["requests"],
        "concurrency": concurrency,
        "seconds": round(result["seconds"], 3),
        "requests_per_s": round(result["requests"] / result["seconds"], 1),
        "p50_ms": round(result["p50_ms"], 3),
        "p99_ms": round(result["p99_ms"], 3),
        "statuses": dict(sorted(result["statuses"].items())),
        "socket_errors": result["socket_errors"],
    }


def capture_load(
    generator: str,
    server_pid: int,
    url: str,
    key: str,
    subjects: int,
    total: int,
    seconds: float,
    concurrency: int,
) -> dict[str, Any]:
    """The sustained capture figure from one generator, with the CPU both sides used."""
    server_before, generator_before = _process_cpu_s(server_pid), _own_cpu_s()
    if generator == "wrk":
        load = _wrk_capture_load(url, key, subjects, total, seconds, concurrency)
    else:
        load = asyncio.run(_capture_load(url, key, subjects, total, seconds, concurrency))
    server_cpu = _process_cpu_s(server_pid) - server_before
    generator_cpu = _own_cpu_s() - generator_before
    answered = max(load["requests"], 1)
    return {
        "generator": generator,
        **load,
        "server_cpu_s": round(server_cpu, 2),
        "generator_cpu_s": round(generator_cpu, 2),
        "server_cpu_s_per_1000": round(server_cpu / answered * 1000, 3),
        "generator_cpu_s_per_1000": round(generator_cpu / answered * 1000, 3),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _threaded_captures(
    door: Any, subjects: int, per_thread: int, concurrency: int, tag: str
) -> dict[str, Any]:
    from domain.values import Interaction

    latencies: list[float] = []
    failures: list[str] = []

    def client(c: int) -> None:
        for n in range(per_thread):
            interaction = Interaction(
                app_id=APP,
                agent_id=AGENT,
                user_input=f"I want to try {tag} {c}x{n}",
                occurred_at=datetime(2025, 2, 1, 10, tzinfo=UTC),
                purpose=PURPOSE,
                sharing="shared",
            )
            began = time.perf_counter()
            try:
                door.capture(f"subject-{(c * per_thread + n) % subjects}", interaction)
            except Exception as e:  # counted and reported, never hidden
                failures.append(type(e).__name__)
            latencies.append(time.perf_counter() - began)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    return {
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p99_ms": _ms(_percentile(latencies, 0.99)),
        "failures": len(failures),
    }


def in_process_capture(
    embedder: str, subjects: int, per_thread: int, concurrency: int, rounds: int
) -> dict[str, Any]:
    """Captures through the authorized door from ``concurrency`` threads in one process,
    no pipeline worker: the one-request path and the group-commit writer (decision
    0017) alternating round by round on one kernel, so both see the same machine."""
    from domain.principal import Principal, PrincipalKind
    from uprof.bootstrap import bootstrap
    from uprof.facade import Facade

    with tempfile.TemporaryDirectory(prefix="uprof-api-bench-inproc-") as tmp:
        kernel = bootstrap(_settings(Path(tmp) / "data", embedder, background=False))
        try:
            writer = getattr(kernel.capture_service, "writer", None)
            if writer is None:
                return {"skipped": "this tree has no group-commit writer"}
            for s in range(subjects):
                kernel.grant_consent(
                    f"subject-{s}", app_id=APP, categories=["*"], purposes=[PURPOSE]
                )
            door = Facade(
                kernel,
                Principal(
                    tenant=kernel.subjects.tenant,
                    app_id=APP,
                    key_id="bench",
                    kind=PrincipalKind.APP,
                    roles=frozenset({"app"}),
                ),
            )
            _threaded_captures(door, subjects, 2, concurrency, "warm-up")
            runs: dict[str, list[dict[str, Any]]] = {"one_request_path": [], "group_commit": []}
            for r in range(rounds):
                runs["one_request_path"].append(
                    _threaded_captures(door, subjects, per_thread, concurrency, f"a{r}")
                )
                writer.start()
                try:
                    runs["group_commit"].append(
                        _threaded_captures(door, subjects, per_thread, concurrency, f"b{r}")
                    )
                finally:
                    writer.stop()
        finally:
            kernel.close()
    medians = {k: statistics.median(r["requests_per_s"] for r in v) for k, v in runs.items()}
    return {
        "concurrency": concurrency,
        "captures_per_round": per_thread * concurrency,
        "rounds": runs,
        "median_requests_per_s": medians,
        "ratio_group_over_one_request": round(
            medians["group_commit"] / medians["one_request_path"], 2
        ),
        "group_commit_mean_group_size": round(writer.grouped_requests / max(writer.groups, 1), 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from uprof.api import ApiKeyStore
    from uprof.bootstrap import bootstrap

    with tempfile.TemporaryDirectory(prefix="uprof-api-bench-") as tmp:
        data_dir = Path(tmp) / "data"  # its key folder, data.keys, stays inside tmp
        # The bench's own kernel seeds the data (running the pipeline itself, before the
        # server starts) and then serves the in-process side without running the
        # pipeline: from then on only the server's worker does (background=True).
        kernel = bootstrap(_settings(data_dir, args.embedder, background=True))
        keys = ApiKeyStore.open(_settings(data_dir, args.embedder, background=False))
        try:
            _seed(kernel, args.subjects, args.turns)
            key = keys.create(APP).token
            server, url = _start_server(data_dir, args.embedder, not args.no_worker)
            try:
                overhead = (
                    None if args.skip_slices else slice_overhead(kernel, url, key, args.iterations)
                )
                load = capture_load(
                    args.generator,
                    server.pid,
                    url,
                    key,
                    args.subjects,
                    args.captures,
                    args.seconds,
                    args.concurrency,
                )
                lag = httpx.get(f"{url}/readyz", timeout=10).json()
            finally:
                server.terminate()
                server.wait(30)
        finally:
            keys.close()
            kernel.close()
    inproc = (
        in_process_capture(args.embedder, args.subjects, 25, args.concurrency, 3)
        if args.in_process_capture
        else None
    )
    return {
        "benchmark": "api",
        "backend": "sqlite",
        "embedder": args.embedder,
        "server_pipeline_worker": not args.no_worker,
        "cpus": os.cpu_count(),
        "seeded_turns": args.turns,
        **({"slice": overhead} if overhead is not None else {}),
        "capture_over_http": load,
        **({"capture_in_process": inproc} if inproc is not None else {}),
        "pipeline_after_load": {k: lag[k] for k in ("extraction_pending", "projection_pending")},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.api_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--embedder", choices=["hashing", "minilm"], default="hashing")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=300, help="captures of the sliced subject")
    parser.add_argument("--subjects", type=int, default=20)
    parser.add_argument("--captures", type=int, default=3_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--generator",
        choices=["httpx", "wrk"],
        default="httpx",
        help="the capture load generator: asyncio httpx clients in this process, or wrk "
        "(C, Debian package wrk) with a Lua script",
    )
    parser.add_argument(
        "--skip-slices",
        action="store_true",
        help="only the capture figure (the slice overhead is not measured)",
    )
    parser.add_argument(
        "--no-worker",
        action="store_true",
        help="serve without the pipeline worker (uprof serve --no-worker): the capture "
        "figure without extraction and projections sharing the server process",
    )
    parser.add_argument(
        "--in-process-capture",
        action="store_true",
        help="also: captures from threads in one process, one-request path against "
        "group commit, alternating (decision 0017)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.data_dir, args.port, args.embedder, not args.no_worker)
        return 0
    if args.quick:
        args.iterations, args.turns, args.captures, args.seconds = 30, 40, 300, 10.0
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
