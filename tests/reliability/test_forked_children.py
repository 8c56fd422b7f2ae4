"""The forked test children behave as ``python -c`` children would (tests/children.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests import children
from tests.children import PythonChild, run_python


def test_a_child_is_another_process_with_the_callers_environment_and_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UPROF_CHILD_PROBE", "set after the fork server started")
    done = run_python(
        "import os, sys; print(os.getpid(), os.environ['UPROF_CHILD_PROBE'], sys.argv[1:])",
        "one",
        "two",
    )
    assert done.returncode == 0, done.stderr
    pid, rest = done.stdout.split(" ", 1)
    assert int(pid) != os.getpid()
    assert rest.strip() == "set after the fork server started ['one', 'two']"
    assert done.args[:2] == [sys.executable, "-c"]


def test_exit_codes_are_a_processes_exit_codes() -> None:
    assert run_python("import os; os._exit(9)").returncode == 9
    assert run_python("import sys; sys.exit(3)").returncode == 3
    raised = run_python("raise ValueError('from the child')")
    assert raised.returncode == 1
    assert "ValueError: from the child" in raised.stderr
    killed = run_python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -signal.SIGKILL


def test_output_written_before_a_normal_exit_and_atexit_handlers_reach_the_caller() -> None:
    done = run_python(
        "import atexit, sys\n"
        "atexit.register(lambda: print('at exit', flush=True))\n"
        "print('out'); print('err', file=sys.stderr)\n"
    )
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["out", "at exit"]
    assert done.stderr.strip() == "err"


def test_the_fork_server_imported_the_project_and_checked_itself_before_the_fork() -> None:
    done = run_python(
        "import sys\n"
        "from tests import children\n"
        "print('uprof.kernel' in sys.modules, children._in_the_fork_server())\n"
    )
    # tests.children was imported in the fork server (it is preloaded), so its import
    # there ran _check_forkable.
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_the_fork_servers_check_refuses_a_server_that_runs_a_thread() -> None:
    """What the fork server checks after its imports (a forked child only has the thread
    that forked, so the check must run in the server, not in a child)."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="left-by-an-import")
    thread.start()
    try:
        with pytest.raises(RuntimeError, match="left-by-an-import"):
            children._check_forkable()
    finally:
        stop.set()
        thread.join()


def test_a_child_past_its_timeout_is_killed_and_reported() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("import time; print('started', flush=True); time.sleep(600)", timeout=1)


def test_a_running_child_can_be_polled_and_killed() -> None:
    child = PythonChild("import time; time.sleep(600)")
    assert child.poll() is None
    child.kill()
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL


def test_a_streamed_stdout_gives_each_line_as_the_child_writes_it() -> None:
    """What the crash scenarios need (``Popen(stdout=PIPE)``): the parent reads the child's
    READY while the child still runs, SIGKILLs it, then gets the rest; a child that
    writes more than a pipe holds before it is read does not block for ever."""
    child = PythonChild(
        # One write: the SIGKILL cannot land between the two lines.
        "import os, time\nos.write(1, b'READY\\nmore\\n')\ntime.sleep(600)\n",
        stream_stdout=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "READY\n"
    assert child.poll() is None
    child.send_signal(signal.SIGKILL)
    out, _ = child.communicate(timeout=30)
    assert out == "more\n"
    assert child.returncode == -signal.SIGKILL

    big = PythonChild("print('x' * 1_000_000)", stream_stdout=True)
    out, err = big.communicate(timeout=60)
    assert (out, big.returncode) == ("x" * 1_000_000 + "\n", 0), err


def test_a_child_in_a_new_session_leads_a_process_group_that_dies_together() -> None:
    """``start_new_session``: the keys crash scenario SIGKILLs the child's whole group (its
    pg_dump / pg_restore with it)."""
    child = PythonChild(
        "import os, subprocess, sys, time\n"
        "grandchild = subprocess.Popen(['sleep', '600'])\n"
        "print(os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid(), grandchild.pid,"
        " flush=True)\n"
        "time.sleep(600)\n",
        stream_stdout=True,
        new_session=True,
    )
    assert child.stdout is not None
    leader, group, grandchild = child.stdout.readline().split()
    assert (leader, group) == ("True", "True")
    os.killpg(child.pid, signal.SIGKILL)
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    for _ in range(300):  # killed: gone, or a zombie until init reaps it
        try:
            state = Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        threading.Event().wait(0.1)
    else:
        raise AssertionError("the grandchild outlived its process group's SIGKILL")


def test_a_piped_stdin_gives_the_child_each_line_written_and_its_end_when_closed() -> None:
    """``Popen(stdin=PIPE)``, what ``uprof mcp --transport stdio`` is driven through: the
    child reads ``sys.stdin`` (its own fd 0, not multiprocessing's os.devnull) line by
    line as the caller writes, answers each while it runs, and ends at the caller's close."""
    child = PythonChild(
        "import sys\n"
        "for line in sys.stdin:\n"
        "    print(line.strip().upper(), flush=True)\n"
        "print('end', sys.stdin.fileno(), flush=True)\n",
        stream_stdout=True,
        stdin_pipe=True,
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(b"one\n")
    assert child.stdout.readline() == "ONE\n"
    child.stdin.write(b"two\n")
    assert child.stdout.readline() == "TWO\n"
    assert child.poll() is None
    child.stdin.close()
    out, err = child.communicate(timeout=30)
    assert (out, child.returncode) == ("end 0\n", 0), err


def test_forked_popen_runs_a_python_m_or_c_command_line_as_the_interpreter_would(
    tmp_path: Path,
) -> None:
    """``benchmarks.workers_bench.Launch`` of the suite: ``-m`` runs the module as
    ``__main__`` with the arguments after it, ``-c`` runs the script; the environment is
    the one given, stdout is read as written, stderr comes with ``communicate``."""
    env = {**os.environ, "CHILD_MARK": "m"}
    document = tmp_path / "doc.json"
    document.write_text('{"a": [1, 2]}')
    # json.tool does its work only under ``if __name__ == '__main__'``.
    module = children.forked_popen(
        [sys.executable, "-m", "json.tool", "--compact", str(document)], env
    )
    out, err = module.communicate(timeout=60)
    assert (out, err, module.returncode) == ('{"a":[1,2]}\n', "", 0)
    script = children.forked_popen(
        [
            sys.executable,
            "-c",
            "import os, sys\nprint(__name__, sys.argv[1:], os.environ['CHILD_MARK'], flush=True)\n"
            "print('to stderr', file=sys.stderr)\nraise SystemExit(3)\n",
            "a",
            "b",
        ],
        env,
    )
    assert script.stdout is not None
    assert script.stdout.readline() == "__main__ ['a', 'b'] m\n"
    out, err = script.communicate(timeout=60)
    assert (out, script.returncode) == ("", 3)
    assert "to stderr" in err
    with pytest.raises(ValueError, match="not a python -m or -c"):
        children.forked_popen([sys.executable, "script.py"], env)
