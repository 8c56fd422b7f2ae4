"""Two processes finishing one interrupted erasure (review of 0199 and 0201, bug QI).

An erasure's in-flight mark is a file its process flocks; the lock dies with the
process (kill -9 included), and the file goes when the process ends the request. 0198's
``erasure_finishing`` (and ``erasure_in_flight``) opened the mark, then locked it: a
process that opened the file just before its holder finished and removed it then locked
a file no longer in the folder, and was told it held the mark. A third process then made
a new mark and took it too: two processes finishing the same request at once, and the
first one's end removed the mark of the one still running (a residue audit then saw no
mark). Now a lock taken on a file its name no longer names is let go and the mark opened
again. Real processes (flock is per open file description; the key folder is files
only: the same on both backends).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from tests import children
from uprof.crypto import keydir
from uprof.crypto.keydir import FileKeyMaterialStore

REQUEST = "2c7d3e4f-1a2b-4c5d-8e9f-0a1b2c3d4e5f"


def _dies_holding(folder: Path, held: Any) -> None:
    with FileKeyMaterialStore(folder).erasure_in_flight(REQUEST):
        held.set()
        os.kill(os.getpid(), 9)  # kill -9 while the mark is held


def _finishes_late(folder: Path, opened: Any, go: Any, taken: Any, end: Any) -> None:
    """A finisher whose lock comes only after ``go``: it has opened the mark by then."""
    real = fcntl.flock

    def late(fd: int, how: int) -> None:
        opened.set()
        assert go.wait(60)
        real(fd, how)

    keydir.fcntl.flock = late  # type: ignore[attr-defined]
    with FileKeyMaterialStore(folder).erasure_finishing(REQUEST) as mine:
        keydir.fcntl.flock = real  # type: ignore[attr-defined]
        taken.put(mine)
        assert end.wait(60)


def test_qi_a_mark_removed_between_open_and_lock_is_not_held(tmp_path: Path) -> None:
    """Bug QI. An erasure's process is killed holding its mark; finisher B opens the
    mark, and before it locks it finisher A takes it, finishes and removes it; then B
    locks, and C comes. At most one of B and C may hold the mark, and while one does
    the audit sees it held. main at f9d71eac: B held the removed file and C a new one,
    both finishing at once."""
    folder = tmp_path / "keys"
    store = FileKeyMaterialStore(folder)
    ctx = children.CONTEXT
    held = ctx.Event()
    dead = ctx.Process(target=_dies_holding, args=(folder, held))
    dead.start()
    dead.join(60)
    assert held.is_set() and store.erasure_mark_state(REQUEST) == "free"
    opened, go, end, taken = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    late = ctx.Process(target=_finishes_late, args=(folder, opened, go, taken, end))
    late.start()
    try:
        assert opened.wait(60), "B never opened the mark"
        with store.erasure_finishing(REQUEST) as first:  # A
            assert first is True
        go.set()
        b_holds = taken.get(timeout=60)
        with FileKeyMaterialStore(folder).erasure_finishing(REQUEST) as c_holds:  # C
            state = store.erasure_mark_state(REQUEST)
        assert not (b_holds and c_holds), "two processes finish the request at once"
        assert b_holds and not c_holds, (b_holds, c_holds)
        assert state == "held", state
    finally:
        end.set()
        late.join(60)
    assert late.exitcode == 0
    assert store.erasure_mark_state(REQUEST) == "none"
