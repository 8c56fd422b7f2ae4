"""A trail's line has a length cap (bug KX) and the csv field limit is fixed (bug KY).

An auditor verifies a trail someone handed them, offline: a trail of one multi-gigabyte
line was read whole before it was refused. The verifier now reads at most the cap plus one
byte of a line, and the largest line the log can write fits under the cap with margin.
"""

from __future__ import annotations

import csv
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from audit import export_format
from audit.errors import AuditEntryError, VerificationError
from audit.export import export_csv, export_jsonl
from audit.keys import public_key_pem
from audit.log import AuditLog
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN
from tests.audit.test_log import fill
from uprof.cli.main import app as cli

#: Larger than any cap the verifier could sensibly hold, and cheap as a sparse file.
HUGE = 256 * 1024 * 1024


def _cap() -> int:
    """The cap KX adds (4 MiB), read so that these tests also run, and fail, before it."""
    return int(getattr(export_format, "MAX_LINE_BYTES", 4 * 1024 * 1024))


def _largest_entry() -> dict[str, object]:
    """An entry with every allowlisted field at its largest shape (audit.entry)."""
    from audit.entry import ENTRY_FIELDS, MAX_LIST

    token = "t" * 200
    tokens = [f"{i:04d}" + "t" * 196 for i in range(MAX_LIST)]
    largest: dict[str, object] = {
        "action": "a" + "b" * 99,
        "categories": tokens,
        "purposes": tokens,
        "item_refs": tokens,
        "event_ids": tokens,
        "roles": tokens,
        "rule": tokens,
        "counts": dict.fromkeys(tokens, 2**53 - 1),
        "dek_commitments": ["f" * 64] * MAX_LIST,
        "explicit": False,
        "special_category": False,
    }
    for name, check in ENTRY_FIELDS.items():
        if name in largest or name == "recorded_at":
            continue
        for value in (token, "f" * 64, 2**53 - 1, "2025-03-01T08:00:00.000000Z"):
            try:
                check(name, value)
            except AuditEntryError:  # not this field's shape: try the next
                continue
            largest[name] = value
            break
    assert set(largest) | {"recorded_at"} == set(ENTRY_FIELDS), "a field has no largest shape"
    return largest


def test_the_largest_line_the_log_can_write_verifies_under_the_cap(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """The cap is not a guess: the log accepts an entry with every field at its largest,
    both exports of it verify, and their longest line leaves the cap a margin of 2x."""
    sqlite_log.append(_largest_entry())
    fill(sqlite_log, 2)
    longest = 0
    for name, write in (("trail.jsonl", export_jsonl), ("trail.csv", export_csv)):
        path = tmp_path / name
        write(sqlite_log, path)
        assert verify_export(path, sqlite_log.public_key, ORIGIN).entry_count == 3
        longest = max(longest, *(len(line) for line in path.read_bytes().split(b"\n")))
    assert 1_400_000 < longest < _cap() // 2


def _sparse_trail(path: Path, first: bytes, size: int) -> Path:
    """A file of ``first`` followed by zero bytes up to ``size``: no newline, no disk."""
    with path.open("wb") as handle:
        handle.write(first)
        handle.truncate(size)
    return path


def test_a_multi_hundred_megabyte_line_is_refused_reading_only_the_cap(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """A 256 MiB first line: refused naming line 1 and the cap, with the verifier's peak
    memory bounded by the cap (on main the whole line was read before any check)."""
    fill(sqlite_log, 1)
    trail = _sparse_trail(tmp_path / "huge.jsonl", b'{"checkpoint":"', HUGE)
    tracemalloc.start()
    try:
        with pytest.raises(VerificationError) as refused:
            verify_export(trail, sqlite_log.public_key, ORIGIN)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * _cap(), f"peak {peak} bytes for a {HUGE}-byte line"
    assert refused.value.line_number == 1
    assert str(_cap()) in refused.value.reason


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_line_over_the_cap_after_the_header_is_named_by_its_number(
    sqlite_log: AuditLog, tmp_path: Path, fmt: str
) -> None:
    """A real trail with one line just over the cap inserted: line 2 (JSONL: after the
    header) or 3 (CSV: after the column row and the header) is named, with the cap, in
    the library, from bytes and from lines."""
    fill(sqlite_log, 2)
    path = tmp_path / f"trail.{fmt}"
    (export_jsonl if fmt == "jsonl" else export_csv)(sqlite_log, path)
    lines = path.read_bytes().split(b"\n")
    at = 1 if fmt == "jsonl" else 2
    lines.insert(at, b"x" * (_cap() + 1))
    content = b"\n".join(lines)
    for source in (content, content.splitlines(keepends=True)):
        with pytest.raises(VerificationError) as refused:
            verify_export(source, sqlite_log.public_key, ORIGIN)
        assert refused.value.line_number == at + 1
        assert f"longer than {_cap()} bytes" in refused.value.reason
    # Exactly the cap is a line like any other: refused for what it holds, not its length.
    lines[at] = b"x" * _cap()
    with pytest.raises(VerificationError) as refused:
        verify_export(b"\n".join(lines), sqlite_log.public_key, ORIGIN)
    assert "longer than" not in refused.value.reason


def test_the_cli_refuses_a_huge_line_naming_it_and_the_cap(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """``uprof audit verify`` goes through the same reader: line and cap named, exit 1,
    memory bounded by the cap."""
    fill(sqlite_log, 1)
    trail = _sparse_trail(tmp_path / "huge.csv", b"kind,leaf_index", HUGE)
    key = tmp_path / "key.pem"
    key.write_bytes(public_key_pem(sqlite_log.public_key))
    tracemalloc.start()
    try:
        result = CliRunner().invoke(
            cli, ["audit", "verify", str(trail), "--public-key", str(key), "--origin", ORIGIN]
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.exit_code == 1, result.output
    assert "line 1" in result.output and str(_cap()) in result.output
    assert peak < 3 * _cap()


def test_the_csv_field_limit_is_the_cap_and_reading_never_moves_it(tmp_path: Path) -> None:
    """KY: the limit is set once, at import, to the line cap; reading a CSV line as long
    as the cap leaves it where it is (IY raised it to each line read, process-wide)."""
    from audit.export_format import read_csv_rows

    before = csv.field_size_limit()
    cell = "x" * (_cap() - 10)
    assert list(read_csv_rows([f"entry,{cell}\n"])) == [["entry", cell]]
    assert csv.field_size_limit() == before == _cap()


@pytest.mark.parametrize("width", [10, 1_100_000, _cap() + 1])
def test_a_text_line_that_is_not_utf8_is_refused_naming_it_at_any_length(
    sqlite_log: AuditLog, tmp_path: Path, width: int
) -> None:
    """LH: lines handed in as text, read from a file with ``errors="surrogateescape"`` (a
    reader that keeps bytes that are not UTF-8), hold lone surrogates. The length check
    KX added encodes a line of over a quarter of the cap to count its bytes, and raised
    ``UnicodeEncodeError``, not the verifier's error. Such a line is refused as not UTF-8,
    naming it, as the same bytes in a file are (a short one, never encoded there, is
    refused for what it holds, naming it too)."""
    fill(sqlite_log, 2)
    path = tmp_path / "trail.jsonl"
    export_jsonl(sqlite_log, path)
    lines = path.read_bytes().split(b"\n")
    lines.insert(1, b'{"kind":"entry","x":"' + b"\xff" * width + b'"}')
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(VerificationError) as from_file:
        verify_export(path, sqlite_log.public_key, ORIGIN)
    with path.open(encoding="utf-8", errors="surrogateescape", newline="") as text:
        with pytest.raises(VerificationError) as from_text:
            verify_export(text, sqlite_log.public_key, ORIGIN)
    assert from_file.value.line_number == from_text.value.line_number == 2
    reason = "line is not UTF-8" if width < _cap() else f"longer than {_cap()} bytes"
    assert reason in from_file.value.reason
    if width > _cap() // 4:
        assert reason in from_text.value.reason


_HOST = """
import csv, io, sys
csv.field_size_limit(int(sys.argv[1]))
import uprof.sdk  # what an application embedding the SDK imports
from audit.export_format import MAX_LINE_BYTES, read_csv_rows
cell = "x" * (MAX_LINE_BYTES - 10)
assert list(read_csv_rows(["entry," + cell + "\\n"])) == [["entry", cell]]
if csv.field_size_limit() > MAX_LINE_BYTES:  # the host's own long field, read as before
    (row,) = csv.reader(io.StringIO("a," + "x" * (MAX_LINE_BYTES + 1024) + "\\n"))
print(csv.field_size_limit())
"""


def test_importing_the_sdk_never_lowers_the_hosts_csv_limit() -> None:
    """LI: the csv field limit is global to a process, and the SDK runs inside other
    people's applications. KY set it, at import, to the line cap: an application that
    had raised it for its own CSV (the common ``csv.field_size_limit(sys.maxsize)``) could
    no longer read a field over 4 MiB once it imported ``uprof.sdk``. The import only
    raises it to the cap, never lowers it, and uprof reads a cell near the cap either way
    (a fresh interpreter per limit: a host's raised one, and Python's default)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    for limit, after in ((sys.maxsize, sys.maxsize), (131072, _cap())):
        done = subprocess.run(
            [sys.executable, "-c", _HOST, str(limit)],
            cwd=root,
            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == [str(after)], (limit, done.stdout)
