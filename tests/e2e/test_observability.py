"""Tracing and JSON logs configured the way an operator does it: environment variables on
real processes (issue 18). Spans go to stderr (console) or to an OTLP/HTTP collector on
loopback; a server started with ``UPROF_LOG_FORMAT=json`` writes only JSON lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from benchmarks.server_ready import popen_serving
from tests.conftest import Backend
from uprof import telemetry
from uprof.settings import Settings

UPROF = [sys.executable, "-m", "uprof.cli.main"]


def _base(backend: Backend) -> list[str]:
    base = ["--data-dir", str(backend.data_dir / "data"), "--embedder", "hashing"]
    return base + (["--database-url", backend.url] if backend.kind == "postgres" else [])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPROF_", "OTEL_"))}
    return {**env, "HF_HUB_OFFLINE": "1", **extra}


def _uprof(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        UPROF + args, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _grant_and_capture(backend: Backend, env: dict[str, str], text: str) -> str:
    base = _base(backend)
    consent = ["consent", "grant", "--subject", "alice", "--app", "app:planner"]
    granted = _uprof([*base, *consent, "--category", "*", "--purpose", "personalization"], _env())
    assert granted.returncode == 0, granted.stderr
    capture = ["capture", "--subject", "alice", "--app", "app:planner", "--agent", "agent:one"]
    captured = _uprof([*base, *capture, "--text", text, "--session", "s-obs"], env)
    assert captured.returncode == 0, captured.stderr
    assert captured.stdout.startswith("captured "), "results stay on stdout, alone"
    return captured.stderr


def test_console_exporter_writes_the_capture_span_to_stderr(backend: Backend) -> None:
    stderr = _grant_and_capture(backend, _env(UPROF_OTEL_EXPORTER="console"), "I like tea")
    # ConsoleSpanExporter prints one JSON document per span.
    assert '"name": "uprof.capture"' in stderr
    assert '"name": "uprof.capture.commit.events"' in stderr
    assert '"service.name": "uprof"' in stderr
    assert "tea" not in stderr and "alice" not in stderr and "s-obs" not in stderr


class _Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, bytes]]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """A stand-in OTLP/HTTP collector on loopback that keeps what it is sent."""
    received: list[tuple[str, bytes]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def test_otlp_exporter_sends_the_spans_to_the_collector(
    backend: Backend, collector: tuple[str, list[tuple[str, bytes]]]
) -> None:
    url, received = collector
    env = _env(UPROF_OTEL_EXPORTER="otlp", UPROF_OTEL_ENDPOINT=url)
    _grant_and_capture(backend, env, "I like tea")
    paths = {path for path, _ in received}
    assert paths == {"/v1/traces"}
    payload = b"".join(body for _, body in received)
    assert b"uprof.capture" in payload and b"uprof.capture.commit.keys" in payload
    assert b"tea" not in payload and b"alice" not in payload


def test_without_the_otlp_package_the_start_fails_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A None entry makes the import fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    settings = Settings(data_dir=tmp_path / "d", otel_exporter="otlp")
    with pytest.raises(telemetry.TracingSetupError, match=r"uprof\[otlp\]"):
        telemetry.configure(settings)
    assert not telemetry.enabled()


def test_a_json_server_writes_only_json_lines_and_no_query_string(backend: Backend) -> None:
    canary = f"sess{uuid.uuid4().hex[:8]}"
    server, port = popen_serving(
        [*UPROF, *_base(backend), "serve", "--log-level", "debug"],
        env=_env(UPROF_LOG_FORMAT="json"),
        stdout=subprocess.PIPE,  # uvicorn's access log
        stderr=subprocess.PIPE,  # every other logger
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        httpx.get(f"http://127.0.0.1:{port}/healthz?session_id={canary}", timeout=5)
    finally:
        server.terminate()
        stdout, stderr = server.communicate(timeout=60)
    lines = [json.loads(line) for line in (stdout + stderr).splitlines() if line.strip()]
    assert lines, "the server logged"
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert any(line["http"]["path"] == "/healthz" for line in access), access
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert canary not in stdout + stderr


def test_a_json_line_written_inside_a_span_names_its_trace(spans: object) -> None:
    import logging

    from uprof.logs import JsonFormatter

    record = logging.LogRecord("uprof.test", logging.INFO, __file__, 1, "batch %d", (3,), None)
    with telemetry.span("uprof.test"):
        inside = json.loads(JsonFormatter().format(record))
    (traced,) = spans.get_finished_spans()  # type: ignore[attr-defined]
    assert inside["trace_id"] == f"{traced.context.trace_id:032x}"
    assert inside["span_id"] == f"{traced.context.span_id:016x}"
    assert inside["message"] == "batch 3" and inside["level"] == "INFO"
    assert "trace_id" not in json.loads(JsonFormatter().format(record))  # outside any span
