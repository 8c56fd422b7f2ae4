"""``uprof serve --fd``: serving a listening socket handed over by the parent process.

The parent binds and listens, the server serves that very socket: no moment in which
another process could take the port (a port picked free, closed and passed by number
allowed one), and the parent keeping no copy means the port refuses once the server
is gone.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.server_ready import popen_serving, stop_server, wait_until_healthy
from uprof.cli.main import app

UPROF = [sys.executable, "-m", "uprof.cli.main"]


def test_a_server_on_a_handed_over_socket_answers_and_its_port_refuses_once_it_stops(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPROF_")}
    env["HF_HUB_OFFLINE"] = "1"
    command = [*UPROF, "--data-dir", str(tmp_path / "data"), "--embedder", "hashing", "serve"]
    server, port = popen_serving([*command, "--log-level", "warning"], env=env)
    try:
        wait_until_healthy(server, f"http://127.0.0.1:{port}", timeout_s=120)
    finally:
        stopped = stop_server(server)
    assert stopped is not None, "the server did not stop within 60 s of SIGTERM (killed)"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def _serve_fd(fd: int, tmp_path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, ["--data-dir", str(tmp_path / "data"), "serve", "--fd", str(fd)]
    )
    return result.exit_code, result.output


def test_a_file_is_refused_as_not_a_socket_and_stays_open(tmp_path: Path) -> None:
    with open(tmp_path / "plain.txt", "w+b") as plain:
        code, output = _serve_fd(plain.fileno(), tmp_path)
        assert code == 2, output
        assert "--fd" in output and "not an open socket" in output
        plain.write(b"still open")  # the refused descriptor was not closed


def test_a_socket_that_is_not_listening_tcp_is_refused_and_stays_open(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        code, output = _serve_fd(udp.fileno(), tmp_path)
        assert code == 2, output
        assert "--fd" in output and "not a TCP socket" in output
        udp.getsockname()  # still open
    with socket.socket() as tcp:
        tcp.bind(("127.0.0.1", 0))
        code, output = _serve_fd(tcp.fileno(), tmp_path)
        assert code == 2, output
        assert "--fd" in output and "not listening" in output
        tcp.getsockname()
    assert not (tmp_path / "data").exists()  # refused before the deployment was opened
