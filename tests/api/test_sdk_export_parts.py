"""A part file left by a killed ``audit_export_to`` is cleared by the next export to the
same path, never one a live process writes (bug OH, decision 0179's Left).

``audit_export_to(path)`` writes ``.<name>.<8 hex>.part`` beside the path and renames it
over the path once the export is whole (0179, ND). A process killed meanwhile left its
part forever: nothing removed it. Each export now holds a ``flock`` on its part for the
part's life (released by the system however the process ends) and, before writing,
removes the parts of the same path whose lock is free. Real processes: one killed while
it writes, one alive and writing while another exports to the same path.
"""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

import httpx

from tests.api.export_frames import header_line, trailer_line
from tests.children import streaming_child
from uprof.sdk import Client
from uprof.sdk._client import _part_name


def framed(tree_size: int) -> tuple[bytes, bytes]:
    """The header and trailer lines of an export of no entries (what the summary reads)."""
    return (header_line(f"tree {tree_size}", tree_size) + "\n").encode(), (
        trailer_line() + "\n"
    ).encode()


def export_to(path: Path, tree_size: int) -> int:
    """An export of a tree of ``tree_size`` to ``path`` through the sync client."""
    header, trailer = framed(tree_size)

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=header + trailer)

    with Client("http://uprof.test", "k", transport=httpx.MockTransport(handle)) as client:
        return client.audit_export_to(path).tree_size


#: A child exporting a tree of 7 to argv[1]: it says "writing" once its part is open,
#: then waits for a line in the FIFO argv[2] before the trailer comes.
WRITER = """
import sys
import httpx
from tests.api.test_sdk_export_parts import framed
from uprof.sdk import Client

header, trailer = framed(7)

def body():
    yield header
    print("writing", flush=True)
    with open(sys.argv[2]) as go:
        go.readline()
    yield trailer

def handle(request):
    return httpx.Response(200, content=body())

with Client("http://uprof.test", "k", transport=httpx.MockTransport(handle)) as client:
    print("done", client.audit_export_to(sys.argv[1]).tree_size, flush=True)
"""


def _parts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


def test_a_killed_exports_part_is_cleared_by_the_next_export(tmp_path: Path) -> None:
    """OH: a writer SIGKILLed while it writes leaves its part; the next export to the same
    path removes it and writes the path (on main: the part stayed beside the export)."""
    path, go = tmp_path / "trail.jsonl", tmp_path / "go"
    os.mkfifo(go)
    with streaming_child(WRITER, str(path), str(go)) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "writing"
        child.send_signal(signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
    assert len(_parts(tmp_path)) == 1  # what the killed writer left
    assert export_to(path, 3) == 3
    assert _parts(tmp_path) == []
    assert path.read_bytes() == b"".join(framed(3))


def test_a_live_exports_part_is_left_alone(tmp_path: Path) -> None:
    """Held, and what the fix must keep: while one process writes its part, another
    export to the same path completes and leaves that part; the first then completes
    too, its export at the path (whole exports both, the last one renamed wins)."""
    path, go = tmp_path / "trail.jsonl", tmp_path / "go"
    os.mkfifo(go)
    with streaming_child(WRITER, str(path), str(go)) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "writing"
        (live,) = _parts(tmp_path)
        assert export_to(path, 3) == 3
        assert _parts(tmp_path) == [live]
        assert path.read_bytes() == b"".join(framed(3))
        with open(go, "w") as fifo:
            fifo.write("go\n")
        assert child.stdout.readline().split() == ["done", "7"]
        assert child.wait(60) == 0
    assert _parts(tmp_path) == []
    assert path.read_bytes() == b"".join(framed(7))


def test_only_unlocked_parts_of_that_path_are_removed(tmp_path: Path) -> None:
    """OH, the rules of the removal, in one process (a ``flock`` on another open file
    conflicts within a process too): a locked part stays; an unlocked one goes; a part
    of another path, a symlink or a FIFO named as a part, and a name that is not one
    stay (on main the unlocked part stayed as well)."""
    path = tmp_path / "trail.jsonl"
    locked = tmp_path / _part_name(path.name, "0123abcd")
    stale = tmp_path / _part_name(path.name, "89abcdef")
    other = tmp_path / _part_name("other.jsonl", "0123abcd")
    linked = tmp_path / _part_name(path.name, "feedbeef")
    fifo = tmp_path / _part_name(path.name, "deadbeef")
    odd = tmp_path / _part_name(path.name, "not-hex!")
    for part in (locked, stale, other, odd):
        part.write_text("partial")
    linked.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("keep")
    os.mkfifo(fifo)
    holder = os.open(locked, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        assert export_to(path, 2) == 2
        assert sorted(_parts(tmp_path)) == sorted(
            p.name for p in (locked, other, linked, fifo, odd)
        )
        assert (tmp_path / "elsewhere").read_text() == "keep"
    finally:
        os.close(holder)
    assert export_to(path, 2) == 2
    assert locked.name not in _parts(tmp_path)
