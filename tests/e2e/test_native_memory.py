"""Long-running processes cap glibc's malloc arenas (uprof/native_memory.py)."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from uprof.cli.main import app

ROOT = Path(__file__).resolve().parents[2]

# Eight threads allocate at once, then the process counts its malloc heaps (arenas)
# with glibc's malloc_info. A thread's first malloc takes an arena of its own while
# the process is under its arena limit, so without a cap this finds about nine.
COUNT_ARENAS = """
import ctypes, ctypes.util, os, re, sys, tempfile, threading
from uprof.native_memory import limit_malloc_arenas
applied = limit_malloc_arenas(int(sys.argv[1]))
held, barrier = [], threading.Barrier(8)
def allocate():
    barrier.wait()
    held.append([bytearray(5000) for _ in range(200)])
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fclose.argtypes = (ctypes.c_void_p,)
fd, path = tempfile.mkstemp()
os.close(fd)
stream = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, stream)
libc.fclose(stream)
with open(path) as f:
    heaps = len(re.findall(r'<heap nr="[0-9]+">', f.read()))
os.unlink(path)
print(applied, heaps)
"""


def _is_glibc() -> bool:
    name = ctypes.util.find_library("c") or ""
    return name.startswith("libc.so") and hasattr(ctypes.CDLL(name), "malloc_info")


def _arenas_after_eight_threads(cap: int) -> tuple[bool, int]:
    result = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, str(cap)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    applied, heaps = result.stdout.split()
    return applied == "True", int(heaps)


@pytest.mark.skipif(not _is_glibc(), reason="malloc arenas are a glibc feature")
def test_the_cap_holds_eight_threads_to_two_arenas_and_without_it_they_take_more() -> None:
    applied, capped = _arenas_after_eight_threads(2)
    assert applied and capped <= 2
    applied, uncapped = _arenas_after_eight_threads(0)
    # The control: the same threads without the cap do spread over more arenas, so the
    # count above measures the cap and not a machine that never makes arenas.
    assert not applied and uncapped > 2


def test_serve_and_worker_cap_the_arenas_before_they_build_anything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import logging

    import uprof.bootstrap

    # `uprof worker` configures the root logger of the process it runs in: this one.
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    import uprof.native_memory

    calls: list[tuple[str, int]] = []

    def record_cap(arenas: int) -> bool:
        calls.append(("cap", arenas))
        return True

    def stop_at_bootstrap(*_args: object, **_kwargs: object) -> None:
        calls.append(("bootstrap", 0))
        raise SystemExit(9)

    monkeypatch.setattr(uprof.native_memory, "limit_malloc_arenas", record_cap)
    monkeypatch.setattr(uprof.bootstrap, "bootstrap", stop_at_bootstrap)
    monkeypatch.setenv("UPROF_MALLOC_ARENAS", "3")
    for command in (["serve"], ["worker"]):
        calls.clear()
        result = CliRunner().invoke(app, ["--data-dir", str(tmp_path / "data"), *command])
        assert result.exit_code == 9, result.output
        assert calls == [("cap", 3), ("bootstrap", 0)], command
