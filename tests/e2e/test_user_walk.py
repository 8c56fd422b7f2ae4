"""What a new user met walking the documents' skipped blocks on real processes
(decision 0226-a-new-users-walk): the worker's JSON log as docs/operations.md shows it,
and the audit export's answer as a person reads it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

from benchmarks.server_ready import popen_serving, stop_server, wait_until_healthy
from tests.conftest import Backend

UPROF = [sys.executable, "-m", "uprof.cli.main"]


def _base(backend: Backend) -> list[str]:
    base = ["--data-dir", str(backend.data_dir / "data"), "--embedder", "hashing"]
    return base + (["--database-url", backend.url] if backend.kind == "postgres" else [])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    return {**env, "HF_HUB_OFFLINE": "1", **extra}


def _started_worker_stderr(backend: Backend) -> str:
    """Start ``uprof worker`` with JSON logs, wait for its ready line, stop it with SIGTERM
    (as an operator does) and return everything it wrote to stderr."""
    worker = subprocess.Popen(
        [*UPROF, *_base(backend), "worker", "--log-level", "info"],
        env=_env(UPROF_LOG_FORMAT="json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        deadline = time.monotonic() + 120
        ready = ""
        while time.monotonic() < deadline and not ready.startswith("uprof worker ready"):
            ready = worker.stdout.readline()
            if ready == "" and worker.poll() is not None:
                break
        assert ready.startswith("uprof worker ready"), ready
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    return stderr


def test_the_worker_keeps_casbin_quiet_as_the_servers_do(backend: Backend) -> None:
    """docs/operations.md: every line is one JSON object of uprof's or its server's. The
    servers hold pycasbin at ERROR (uprof.api.logconfig); the worker printed pycasbin's
    model dump (seven INFO lines) at every start, and would print every denial."""
    stderr = _started_worker_stderr(backend)
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    casbin = [r["message"] for r in records if r["logger"].startswith("casbin")]
    assert casbin == []


def test_audit_export_says_what_it_wrote_in_words(backend: Backend) -> None:
    """docs/governance.md's ``uprof audit export`` printed the Python repr of its summary
    (``ExportSummary(tree_size=..., checkpoint='...\\n...')``), the checkpoint's newlines
    escaped: the user reads how many entries went to the file and how to check it."""
    out = backend.data_dir / "trail.jsonl"
    done = subprocess.run(
        [*UPROF, *_base(backend), "audit", "export", "--out", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    header = lines[0]
    entries = [line for line in lines if line["kind"] == "entry"]
    assert entries, "a fresh deployment's log holds its first entries"
    said = " ".join(done.stdout.split())
    assert "ExportSummary" not in said
    assert "\\n" not in said
    assert f"exported {len(entries)} entries" in said
    assert f"tree size {header['tree_size']}" in said
    assert str(out) in "".join(done.stdout.split())


def test_readyz_names_the_worker_a_no_worker_server_waits_for(backend: Backend) -> None:
    """docs/cli.md's multi-process example: servers with ``--no-worker`` beside ``uprof
    worker`` processes. Their ``/readyz`` said ``"worker": "inline"``, as if the server did
    the pipeline's work on request threads; its reads wait for the external workers."""
    server, port = popen_serving(
        [*UPROF, *_base(backend), "serve", "--no-worker", "--host", "127.0.0.1"],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(server, url)
        answer = httpx.get(f"{url}/readyz", timeout=30)
    finally:
        stop_server(server)
    assert answer.status_code == 200, answer.text
    assert answer.json()["worker"] == "external"


def _readyz_until(
    url: str, wanted: Callable[[dict[str, Any]], bool], within_s: float
) -> dict[str, Any]:
    """Ask ``/readyz`` until its body is ``wanted`` (bounded); return the last body."""
    deadline = time.monotonic() + within_s
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = httpx.get(f"{url}/readyz", timeout=30).json()
        if wanted(body):
            break
        time.sleep(0.2)  # a poll's pause, not a proof: the condition decides
    return body


def test_wa_readyz_says_when_no_worker_moves_the_pending_work(backend: Backend) -> None:
    """Bug WA: a ``--no-worker`` server with no ``uprof worker`` at all said only
    ``"worker": "external"``, ready, while a capture waited for a worker that did not
    exist. Readiness now says how long the pending work has not moved, and 0 once a
    worker has caught it up."""
    created = subprocess.run(
        [*UPROF, *_base(backend), "apps", "create", "app:planner"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stderr
    token = next(w for w in created.stdout.split() if w.startswith("upk_"))
    headers = {"Authorization": f"Bearer {token}"}
    server, port = popen_serving(
        [*UPROF, *_base(backend), "serve", "--no-worker", "--host", "127.0.0.1"],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    worker: subprocess.Popen[str] | None = None
    try:
        wait_until_healthy(server, url)
        with httpx.Client(base_url=url, timeout=60, headers=headers) as http:
            consent = {
                "subject": "alice",
                "categories": ["*"],
                "purposes": ["personalization"],
                "collected_by": "consent-ui:test",
            }
            assert http.post("/v1/consents", json=consent).status_code == 201
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
        stalled = _readyz_until(url, lambda b: (b.get("pipeline_unmoved_s") or 0) >= 1.0, 60)
        assert stalled["worker"] == "external"
        assert stalled["extraction_pending"] >= 1, stalled
        assert (stalled.get("pipeline_unmoved_s") or 0) >= 1.0, (
            f"readiness does not say the pending work has not moved: {stalled}"
        )
        worker = subprocess.Popen(
            [*UPROF, *_base(backend), "worker"],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        caught_up = _readyz_until(
            url,
            lambda b: b["extraction_pending"] == 0 and b["projection_pending"] == 0,
            120,
        )
        assert caught_up["extraction_pending"] == caught_up["projection_pending"] == 0, caught_up
        assert caught_up["pipeline_unmoved_s"] == 0.0, caught_up
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(120)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        stop_server(server)
