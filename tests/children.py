"""Python child processes for tests, forked from a server that has the project imported.

A test that needs "another process" on the same stores (a second kernel, a worker, a
process killed at a bad moment) used to start a fresh interpreter each time: ``python -c``
or a ``spawn`` multiprocessing context. Each such child spends ~0.6 s of CPU importing
the project before it does anything (sqlalchemy, pydantic, casbin, numpy, the project's
own modules), and the suite starts over a hundred of them: on the 2-core reference
machine that import time was ~10% of the CPU the whole suite needs.

Here every such child is forked from multiprocessing's fork server, which imported the
modules below once (per test process). A child is still a process of its own (its own
pid, its own memory, its own connections and file locks, killable with SIGKILL); it
shares nothing with the test process but the stores, as before. It starts with the state
a fresh interpreter has after importing those modules: the fork server imports, it opens
nothing (no connection, no file, no thread), which ``_check_forkable`` checks.

``run_python`` and ``PythonChild`` are ``subprocess.run`` and ``subprocess.Popen`` of
``[sys.executable, "-c", script, *args]`` for such children: output captured, the exit
code as a process would give it (negative for a signal, the code of ``os._exit``), the
environment of the test at the time of the call, atexit handlers run at a normal exit as
an interpreter runs them. ``CONTEXT`` is the multiprocessing context for tests that
start a function in a child. A test of a real command (``uprof serve``, ``uprof
worker``, the MCP server) still starts the command. ``PythonChild(stream_stdout=True)``
gives the child's stdout as a pipe read while it runs, and ``new_session=True`` puts it in
a session of its own (``Popen``'s ``start_new_session``): the crash scenarios' victims.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import reduction
from pathlib import Path
from typing import IO

#: What the fork server imports once: what the children of the kernel tests import, and
#: what ``uprof serve`` imports at its start (uvicorn, the server's app and its pages:
#: ~0.9 s of CPU per forked server otherwise, paid once per fork server here).
PRELOAD = [
    "tests.conftest",
    "tests.fakes.ports",
    "tests.kernel.conftest",
    "uprof.cli.main",
    "uvicorn",
    "uprof.api.logconfig",
    "uprof.native_memory",
    "uprof.server",
    "tests.children",  # last: its import in the fork server checks what the others left
]

#: A child script running the ``uprof`` CLI on its arguments (``run_python(CLI_SCRIPT,
#: "backup", ...)``): the command as an operator runs it, a process of its own.
CLI_SCRIPT = "from uprof.cli.main import app\napp()\n"


def blocked_on_flock(pid: int, path: Path) -> bool:
    """Whether process ``pid`` waits for a ``flock`` of ``path``: Linux's /proc/locks
    lists a blocked request as ``N: -> FLOCK ADVISORY WRITE <pid> <dev>:<inode> 0 EOF``.
    False where it cannot tell (no such file, or the lock file not made yet)."""
    try:
        inode = str(path.stat().st_ino)
        with open("/proc/locks") as locks:
            lines = locks.readlines()
    except FileNotFoundError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) >= 8 and fields[1] == "->" and fields[2] == "FLOCK":
            if fields[5] == str(pid) and fields[6].rsplit(":", 1)[-1] == inode:
                return True
    return False


def until_ended_or_blocked_on(child: PythonChild, path: Path, timeout_s: float) -> None:
    """Wait until ``child`` has ended or is blocked on a flock of ``path`` (from then on
    it can only wait for its holder), at most ``timeout_s``. For a test whose child, on
    a fixed build, queues for a lock the test's other process holds until let go: the
    test lets it go once the queueing is seen, not after the whole bound."""
    deadline = time.monotonic() + timeout_s
    while child.poll() is None and time.monotonic() < deadline:
        if blocked_on_flock(child.pid, path):
            return
        time.sleep(0.05)


def progress_count(path: Path) -> int:
    """The count a looping child last wrote to ``path``: 0 before its first round."""
    return int(path.read_text() or 0) if path.exists() else 0


CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(PRELOAD)


def _in_the_fork_server() -> bool:
    return "from multiprocessing.forkserver import main" in " ".join(sys.orig_argv)


def _check_forkable() -> None:
    """Run in the fork server after its imports: a thread there would be copied into no
    child (and a lock it held would stay held in every child)."""
    if threading.active_count() != 1:
        names = [t.name for t in threading.enumerate()]
        raise RuntimeError(f"the fork server of the tests runs threads: {names}")


class _PipeEnd:
    """A descriptor handed to the forked child (a pipe's write end, a listening socket):
    the fork server passes it over its socket, as multiprocessing passes a
    ``Connection``; in the child it is a descriptor number of the child's own."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[object, tuple[object]]:
        return _PipeEnd._in_child, (reduction.DupFd(self.fd),)

    @staticmethod
    def _in_child(dup: object) -> int:
        return dup.detach()  # type: ignore[attr-defined, no-any-return]  # multiprocessing's


def _run_script(
    script: str,
    args: list[str],
    env: dict[str, str],
    cwd: str,
    out: str | int,
    err: str,
    new_session: bool = False,
    handed: int | None = None,
    stdin: int | None = None,
) -> None:
    """The child's body: ``python -c script *args`` with fd 1 and 2 on the given files
    (``out`` a descriptor: a pipe's write end), in a session of its own if asked; a
    descriptor ``handed`` over is open in the child, its number there the last argument."""
    if new_session:
        os.setsid()
    if handed is not None:
        os.set_inheritable(handed, True)
        args = [*args, str(handed)]
    for fd, path in ((1, out), (2, err)):
        if isinstance(path, int):
            target = path
        else:
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    if stdin is not None:
        # A pipe's read end as fd 0; multiprocessing set sys.stdin to os.devnull.
        os.dup2(stdin, 0)
        os.close(stdin)
        sys.stdin = open(0, closefd=False)  # the process's own stdin
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["-c", *args]
    try:
        exec(compile(script, "<string>", "exec"), {"__name__": "__main__"})
    finally:
        # An interpreter runs these as it exits; a multiprocessing child does not.
        atexit._run_exitfuncs()


class PythonChild:
    """``subprocess.Popen([sys.executable, "-c", script, *args], stdout=PIPE, stderr=PIPE,
    text=True)`` for a child forked from the fork server: the same ``poll``, ``wait``,
    ``kill``, ``send_signal``, ``communicate`` and ``returncode`` (output goes to files
    until read). With ``stream_stdout``, ``stdout`` is the read end of a pipe, as
    ``Popen``'s: a test reads the child's lines as it writes them. With ``stdin_pipe``,
    ``stdin`` is the write end of the child's stdin (bytes, unbuffered), as ``Popen``'s
    ``stdin=PIPE``: closing it is the child's end of input. ``new_session`` is
    ``Popen``'s ``start_new_session``."""

    def __init__(
        self,
        script: str,
        *args: str,
        env: dict[str, str] | None = None,
        stream_stdout: bool = False,
        stdin_pipe: bool = False,
        new_session: bool = False,
        hand_over: int | None = None,
        stderr_to: Path | None = None,
    ) -> None:
        self.args = [sys.executable, "-c", script, *args]
        folder = tempfile.mkdtemp(prefix="uprof-child-")
        weakref.finalize(self, shutil.rmtree, folder, True)
        self._out = Path(folder, "stdout")
        self._err = Path(folder, "stderr") if stderr_to is None else stderr_to
        self.stdout: IO[str] | None = None
        self.stdin: IO[bytes] | None = None
        read_in: _PipeEnd | None = None
        if stdin_pipe:  # ``Popen``'s stdin=PIPE, bytes: the test writes, the child reads
            read_end, write_end = os.pipe()
            self.stdin = open(write_end, "wb", buffering=0)  # closed by the test
            read_in = _PipeEnd(read_end)
        out: str | _PipeEnd = str(self._out)
        if stream_stdout:
            read_end, write_end = os.pipe()
            self.stdout = open(read_end, errors="replace")  # closed by communicate()
            out = _PipeEnd(write_end)
        self._process = CONTEXT.Process(
            target=_run_script,
            args=(
                script,
                list(args),
                dict(os.environ if env is None else env),
                os.getcwd(),
                out,
                str(self._err),
                new_session,
                None if hand_over is None else _PipeEnd(hand_over),
                read_in,
            ),
            name="python-child",
        )
        try:
            self._process.start()
        finally:
            if isinstance(out, _PipeEnd):
                os.close(out.fd)  # the child has its own: EOF once it is gone
            if read_in is not None:
                os.close(read_in.fd)  # the child's alone: it sees EOF once stdin is closed
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, signum)

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the child (``TimeoutExpired`` after ``timeout``), then its output."""
        if self.stdout is None:
            self.wait(timeout)
            return self._read(self._out), self._read(self._err)
        rest: list[str] = []  # read while waiting: a child blocked on a full pipe never ends
        stdout = self.stdout
        reader = threading.Thread(target=lambda: rest.append(stdout.read()), daemon=True)
        reader.start()
        self.wait(timeout)
        reader.join()
        self.stdout.close()
        return "".join(rest), self._read(self._err)

    def stderr_so_far(self) -> str:
        """What the child has written to stderr until now (it may still be running)."""
        return self._read(self._err)

    @staticmethod
    def _read(path: Path) -> str:
        return path.read_text(errors="replace") if path.exists() else ""


def run_python(
    script: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
    text=True, timeout=timeout)`` for a child forked from the fork server: on timeout the
    child is killed and ``subprocess.TimeoutExpired`` raised."""
    child = PythonChild(script, *args, env=env)
    try:
        out, err = child.communicate(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        raise subprocess.TimeoutExpired(child.args, timeout, out, err) from None
    code = child.returncode
    assert code is not None
    return subprocess.CompletedProcess(child.args, code, out, err)


def forked_popen(command: list[str], env: dict[str, str]) -> PythonChild:
    """``subprocess.Popen(command, env=env, stdout=PIPE, stderr=PIPE, text=True)`` of a
    Python command line (``[python, "-m", module, *args]`` or ``[python, "-c", script,
    *args]``), forked from the fork server: ``stdout`` is a pipe read as the child writes
    it, stderr is read by ``communicate``. ``-m`` runs the module as ``__main__``, as the
    interpreter does. ``benchmarks.workers_bench.Launch`` for the suite's workers."""
    flag, what, args = (command[1], command[2], command[3:]) if len(command) > 2 else ("", "", [])
    if flag == "-m":
        script = f"import runpy\nrunpy.run_module({what!r}, run_name='__main__', alter_sys=True)\n"
    elif flag == "-c":
        script = what
    else:
        raise ValueError(f"not a python -m or -c command line: {command[:3]}")
    return PythonChild(script, *args, env=env, stream_stdout=True)


#: The pids of children a fixture holds past its test's body (``held_by_fixture``).
_HELD_BY_FIXTURES: set[int] = set()


def held_by_a_fixture(pid: int | None) -> bool:
    """Whether the child ``pid`` is one a fixture holds and stops in its own teardown:
    the suite's check after a test's body (tests/conftest.py) leaves it alone."""
    return pid in _HELD_BY_FIXTURES


@contextmanager
def held_by_fixture(child: PythonChild) -> Iterator[PythonChild]:
    """For a fixture that starts a child and yields while it runs (a server the test
    talks to): the child may outlive the test's body, which the suite's check that no
    multiprocessing child outlives a test's body otherwise refuses (it runs before the
    fixtures' teardown). The fixture stops the child inside this block; one still running
    at its end is killed and reaped, and the fixture's teardown fails naming it: the
    check's promise (no child left to hang the test process's exit) holds per fixture."""
    _HELD_BY_FIXTURES.add(child.pid)
    try:
        yield child
    finally:
        _HELD_BY_FIXTURES.discard(child.pid)
        left = child.poll() is None
        if left:
            child.kill()
            child.wait(30)
    if left:  # not reached when the fixture fails: its own error is the report
        raise AssertionError(f"a fixture left its child running: pid {child.pid}")


def serving_child(
    args: list[str], env: dict[str, str], stderr: Path | None
) -> tuple[PythonChild, int]:
    """``benchmarks.server_ready.popen_serving`` of the ``uprof`` CLI (``args``: ``serve``
    and its options), forked from the fork server: the command gets a loopback socket
    bound and listening here as ``--fd``, its stderr goes to ``stderr`` (None: a file of
    the child's own, read by ``communicate``); returns the child and its port. This
    process keeps no copy of the socket."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = int(sock.getsockname()[1])
        child = PythonChild(
            CLI_SCRIPT, *args, "--fd", env=env, hand_over=sock.fileno(), stderr_to=stderr
        )
    return child, port


@contextmanager
def served_from_fork(env: dict[str, str], stderr: Path) -> Iterator[str]:
    """For a fixture: ``uprof serve`` forked (``serving_child``) with ``env``, held by the
    fixture past the test's body (``held_by_fixture``), answering its health check;
    yields its URL and stops it at the end."""
    from benchmarks.server_ready import stop_server, wait_until_healthy

    process, port = serving_child(["serve", "--log-level", "warning"], env, stderr)
    url = f"http://127.0.0.1:{port}"
    with held_by_fixture(process):
        try:
            wait_until_healthy(process, url, timeout_s=120)
            yield url
        finally:
            stop_server(process)


if _in_the_fork_server():
    _check_forkable()


@contextmanager
def streaming_child(script: str, *args: str) -> Iterator[PythonChild]:
    """A ``PythonChild`` whose output a test reads line by line as it writes them
    (``stream_stdout``); at the end killed if still running, then reaped and its pipe
    closed."""
    child = PythonChild(script, *args, stream_stdout=True)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(30)
