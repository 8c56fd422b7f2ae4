"""A server process for tests and benchmarks: its listening socket, and waiting for it to
answer /healthz (light: httpx only)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from uprof.retry import Backoff, RetryPolicy


class ServerProcess(Protocol):
    """What waiting for a server and stopping it use of its process: a ``Popen``, or a
    test's forked child (``tests.children.PythonChild``)."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def communicate(self, *, timeout: float | None = None) -> Any: ...


class _NotHealthyYet(Exception):
    """/healthz answered, but not 200 yet."""


def wait_until_healthy(
    process: ServerProcess,
    url: str,
    *,
    timeout_s: float = 120.0,
    poll_s: float = 0.1,
    exited: Callable[[], str] | None = None,
) -> None:
    """Poll ``url``/healthz every ``poll_s`` until it answers 200 (uprof's one retry
    policy, bounded to about ``timeout_s``). Raise RuntimeError if the process exits first
    (``exited()`` says why) or the server never answers; the caller stops the process."""
    policy = RetryPolicy(
        attempts=max(1, round(timeout_s / poll_s)),
        on=(httpx.HTTPError, _NotHealthyYet),
        backoff=Backoff(poll_s, poll_s),
    )

    def probe() -> None:
        if process.poll() is not None:
            raise RuntimeError(exited() if exited else f"server exited with {process.returncode}")
        if httpx.get(f"{url}/healthz", timeout=1).status_code != 200:
            raise _NotHealthyYet

    try:
        policy.call(probe)
    except (httpx.HTTPError, _NotHealthyYet):
        raise RuntimeError(f"server did not start within {timeout_s:.0f} s") from None


def popen_serving(command: list[str], **popen: Any) -> tuple[subprocess.Popen[Any], int]:
    """Start ``command``, an ``uprof ... serve`` command line, on a loopback socket bound
    and listening here and handed over as ``--fd``; return the process and its port.

    Picking a free port, closing it and passing its number left a moment in which another
    process could take the port; a socket handed over leaves none. This process keeps no
    copy of it, so once the server is gone its port refuses connections instead of
    queueing them for nobody.
    """
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = int(sock.getsockname()[1])
        fds = [sock.fileno(), *popen.pop("pass_fds", ())]
        process = subprocess.Popen([*command, "--fd", str(sock.fileno())], pass_fds=fds, **popen)
    return process, port


def stop_server(process: ServerProcess, timeout_s: float = 60.0) -> int | None:
    """SIGTERM, wait up to ``timeout_s`` for the graceful exit, then SIGKILL: the process
    is gone and reaped on return, whatever happened (a ``terminate(); wait(t)`` left a
    server that did not stop running, and the caller's error hid it). Returns the exit
    status of the graceful stop, or None if it had to be killed."""
    if process.poll() is not None:
        return process.returncode
    process.terminate()
    try:
        process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return None
    return process.returncode
