"""The SDK's summary of an export reads its frame as the verifier does (bug OF, decision
0184's Left).

``AuditExportSummary.of_export`` (every SDK reader of an export, and the embedded
server's ``audit_export``) skipped blank lines, read a header or trailer ended by
``\\r\\n`` (``json.loads`` takes the ``\\r`` for whitespace) or written with spaces, a last
line without its newline, lines after the trailer, and a trailer whose ``entry_count``
is not the entries present: it summarised files ``uprof audit verify`` refuses. It now
reads through ``audit.export_format.export_frame``. Here real exports (JSONL and CSV,
signed by a real log) are altered one line at a time; each alteration must be refused by
the verifier (checked, so the test cannot drift into alterations nobody refuses) and by
the summary. The untouched export is summarised as the verifier reports it.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from audit.errors import VerificationError
from audit.export import export_csv, export_jsonl
from audit.export_format import EXPORT_FORMAT
from audit.log import AuditLog
from audit.verify import verify_export
from tests.audit.conftest import ORIGIN
from tests.audit.test_log import fill
from uprof.schemas.api import AuditExportSummary
from uprof.sdk import AsyncClient, Client, TransportError


def _lines(log: AuditLog, fmt: str) -> list[str]:
    out = io.StringIO()
    (export_csv if fmt == "csv" else export_jsonl)(log, out)
    return out.getvalue().splitlines(keepends=True)


def _with(lines: list[str], at: int, text: str | None) -> list[str]:
    """``lines`` with line ``at`` replaced by ``text`` (None: removed)."""
    changed = list(lines)
    if text is None:
        del changed[at]
    else:
        changed[at] = text
    return changed


def _crlf(line: str) -> str:
    return line[:-1] + "\r\n"


def _filtered(header: str) -> str:
    """The header saying it is filtered, its filter empty (canonical still)."""
    assert header.count(":false") == 1, header  # "filtered", in JSONL or a CSV cell
    return header.replace(":false", ":true")


#: (name, alteration of the lines); ``h`` is the header's index (1 in CSV, after the
#: column row), entries follow it and the trailer is last.
ALTERATIONS: list[tuple[str, Callable[[list[str], int], list[str]]]] = [
    ("header ended by CRLF", lambda ls, h: _with(ls, h, _crlf(ls[h]))),
    ("trailer ended by CRLF", lambda ls, h: _with(ls, -1, _crlf(ls[-1]))),
    ("every line ended by CRLF", lambda ls, h: [_crlf(line) for line in ls]),
    ("an entry ended by CRLF", lambda ls, h: _with(ls, h + 1, _crlf(ls[h + 1]))),
    ("a blank line after the header", lambda ls, h: [*ls[: h + 1], "\n", *ls[h + 1 :]]),
    ("a blank line before the trailer", lambda ls, h: [*ls[:-1], "\n", ls[-1]]),
    ("a line of spaces after the trailer", lambda ls, h: [*ls, "   \n"]),
    ("a blank line after the trailer", lambda ls, h: [*ls, "\n"]),
    ("the trailer twice", lambda ls, h: [*ls, ls[-1]]),
    ("no newline after the trailer", lambda ls, h: _with(ls, -1, ls[-1][:-1])),
    ("a space in the header", lambda ls, h: _with(ls, h, ls[h].replace(":", ": ", 1))),
    ("a space in the trailer", lambda ls, h: _with(ls, -1, ls[-1].replace(",", ", ", 1))),
    ("an entry left out", lambda ls, h: _with(ls, h + 2, None)),
    ("the trailer before the last entry", lambda ls, h: [*ls[:-2], ls[-1], ls[-2]]),
    ("another format", lambda ls, h: _with(ls, h, ls[h].replace(EXPORT_FORMAT, "x/v9"))),
    ("filtered without a filter", lambda ls, h: _with(ls, h, _filtered(ls[h]))),
]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.parametrize(("name", "alter"), ALTERATIONS, ids=[a[0] for a in ALTERATIONS])
def test_a_frame_the_verifier_refuses_is_not_summarised(
    sqlite_log: AuditLog, fmt: str, name: str, alter: Callable[[list[str], int], list[str]]
) -> None:
    """OF: refused by both (on main at 5e738d2 the summary read all 32)."""
    fill(sqlite_log, 5)
    altered = alter(_lines(sqlite_log, fmt), 1 if fmt == "csv" else 0)
    with pytest.raises(VerificationError):
        verify_export("".join(altered).encode(), sqlite_log.public_key, ORIGIN)
    with pytest.raises(ValueError):
        AuditExportSummary.of_export(altered, fmt)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_an_untouched_export_is_summarised_as_the_verifier_reports_it(
    sqlite_log: AuditLog, fmt: str
) -> None:
    """Held: the frame of a real export (empty, and of 5 entries) is read as before."""
    for count in (0, 5):
        fill(sqlite_log, count)
        lines = _lines(sqlite_log, fmt)
        report = verify_export("".join(lines).encode(), sqlite_log.public_key, ORIGIN)
        summary = AuditExportSummary.of_export(lines, fmt)
        assert (summary.tree_size, summary.entry_count, summary.export_sha256) == (
            report.tree_size,
            report.entry_count,
            report.export_sha256,
        )


def _readers(body: bytes, folder: Path) -> dict[str, object]:
    """What each of the SDK's four readers makes of ``body`` (a summary, or the error)."""

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body)

    transport = httpx.MockTransport(handle)
    seen: dict[str, object] = {}
    with Client("http://uprof.test", "k", transport=transport) as client:
        for how, read in (
            ("sync-whole", lambda: client.audit_export().summary),
            ("sync-to", lambda: client.audit_export_to(folder / "sync.jsonl")),
        ):
            try:
                seen[how] = read()
            except TransportError as error:
                seen[how] = error

    async def run() -> None:
        async with AsyncClient("http://uprof.test", "k", transport=transport) as client:
            for how in ("async-whole", "async-to"):
                try:
                    if how == "async-whole":
                        seen[how] = (await client.audit_export()).summary
                    else:
                        seen[how] = await client.audit_export_to(folder / "async.jsonl")
                except TransportError as error:
                    seen[how] = error

    asyncio.run(run())
    return seen


def test_the_sdk_readers_refuse_a_header_and_trailer_ended_by_crlf(
    sqlite_log: AuditLog, tmp_path: Path
) -> None:
    """OF through the SDK: a server answering a real export whose lines end in ``\\r\\n``
    gets a ``TransportError`` from each of the four readers (on main: a summary from
    each), and ``audit_export_to`` leaves no file at its path."""
    fill(sqlite_log, 3)
    body = "".join(_crlf(line) for line in _lines(sqlite_log, "jsonl")).encode()
    folder = tmp_path / "exports"
    folder.mkdir()
    seen = _readers(body, folder)
    assert all(isinstance(answer, TransportError) for answer in seen.values()), seen
    assert sorted(p.name for p in folder.iterdir()) == []


def test_the_sdk_readers_summarise_a_real_export(sqlite_log: AuditLog, tmp_path: Path) -> None:
    """Held: the same export with its own line ends is summarised by all four readers."""
    fill(sqlite_log, 3)
    body = "".join(_lines(sqlite_log, "jsonl")).encode()
    seen = _readers(body, tmp_path)
    assert {type(answer) for answer in seen.values()} == {AuditExportSummary}, seen
    assert {answer.entry_count for answer in seen.values()} == {3}  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.parametrize(("name", "alter"), ALTERATIONS, ids=[a[0] for a in ALTERATIONS])
def test_the_verifier_and_the_summary_refuse_a_frame_by_one_rule(
    sqlite_log: AuditLog, fmt: str, name: str, alter: Callable[[list[str], int], list[str]]
) -> None:
    """One rule set (decision 0189's Left): the verifier reads its lines through
    ``ExportFrame``, as the summary does, so both refuse an altered frame at the same
    line for the same reason (on main at 1a68357 two readings of one frame, held
    together by the test above: the same verdict, and 32 of 32 told in other words).
    An entry left out is the one alteration the verifier refuses earlier, at the entry
    after the gap: entries are checked with the key."""
    fill(sqlite_log, 5)
    altered = alter(_lines(sqlite_log, fmt), 1 if fmt == "csv" else 0)
    with pytest.raises(VerificationError) as verified:
        verify_export("".join(altered).encode(), sqlite_log.public_key, ORIGIN)
    with pytest.raises(ValueError) as summarised:
        AuditExportSummary.of_export(altered, fmt)
    if name == "an entry left out":
        assert verified.value.leaf_index == 2, verified.value
        assert "entry_count differs from the 4 entries" in str(summarised.value)
    else:
        assert str(summarised.value) == str(verified.value)
