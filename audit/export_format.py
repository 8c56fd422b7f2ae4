"""The audit export format, shared by the exporter and the offline verifier.

JSONL, one RFC 8785 canonical JSON object per line, each line ending in ``\\n``
(``LINE_END``, the only line end: ``\\r``, ``\\x85``, U+2028 ... are characters of a line):

1. header: ``{"checkpoint", "exported_at", "filter", "filtered", "format", "key_id", "kind":
   "header", "note_key_id", "origin", "tree_size"}``; ``checkpoint`` is the signed C2SP note
   that every proof in the file is against.
2. one line per entry, in leaf order: ``{"entry": <the entry object, canonical>, "inclusion":
   [base64 hashes, leaf to root], "kind": "entry", "leaf_index": n}``. The leaf hash is
   ``SHA-256(0x00 || <the entry's canonical JSON bytes>)``.
3. trailer: ``{"entry_count", "export_sha256", "kind": "trailer", "signature"}``:
   ``export_sha256`` is SHA-256 over the header and entry lines (each with its ``\\n``), and
   ``signature`` is Ed25519 by the log key over ``EXPORT_SIGNATURE_CONTEXT || digest``. The
   signature is what makes dropping, adding or reordering entries of a *filtered* export
   evident; an unfiltered one is also checked for dense indexes and the checkpoint root.

CSV carries the same data, one record per line: the column row ``CSV_COLUMNS``, then a
``header`` row (the header JSON in ``data``), ``entry`` rows (canonical entry JSON in
``entry``, ``;``-joined base64 hashes in ``inclusion``, plus copies of ``recorded_at``,
``action``, ``app_id``, ``subject_ref`` for spreadsheets) and a ``trailer`` row. Digest and
signature are computed over the JSONL form, so both formats carry the same trailer values.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from audit._codec import b64decode_strict, hexdecode_strict
from audit.canonical import canonical_bytes
from audit.entry import normalise_timestamp, validate_entry
from audit.errors import AuditEntryError, VerificationError
from audit.strict_json import strict_json

EXPORT_FORMAT = "uprof.audit-export/v1"
#: Domain separation: no checkpoint note (origin first) or JSON body ("{" first) starts so.
EXPORT_SIGNATURE_CONTEXT = b"uprof audit export v1\x00"

HEADER_KEYS = frozenset(
    {
        "checkpoint",
        "exported_at",
        "filter",
        "filtered",
        "format",
        "key_id",
        "kind",
        "note_key_id",
        "origin",
        "tree_size",
    }
)
ENTRY_KEYS = frozenset({"entry", "inclusion", "kind", "leaf_index"})
TRAILER_KEYS = frozenset({"entry_count", "export_sha256", "kind", "signature"})
FILTER_KEYS = frozenset({"action", "app_id", "since", "subject_ref", "tenant", "until"})

CSV_COLUMNS = (
    "kind",
    "leaf_index",
    "recorded_at",
    "action",
    "app_id",
    "subject_ref",
    "entry",
    "inclusion",
    "data",
)
#: Entry fields copied into CSV columns for people reading the file in a spreadsheet.
CSV_COPIED_FIELDS = ("recorded_at", "action", "app_id", "subject_ref")
CSV_PROOF_SEPARATOR = ";"

_ENTRY_LINE_PREFIX = '{"entry":'

#: The longest line (in bytes, without its newline) a reader of an export accepts. The
#: largest line the exporter can write is an entry with every allowlisted field at its
#: largest (docs/audit-format.md, "Line length"): six token-list fields (``categories``,
#: ``purposes``, ``item_refs``, ``event_ids``, ``roles``, ``rule``) of 1,000 tokens of 200
#: characters (~203 KB each), ``counts`` with 1,000 such keys (~220 KB), ``dek_commitments``
#: of 1,000 SHA-256s (~67 KB) and the scalars: ~1.52 MB as JSONL, ~1.55 MB as CSV (every
#: ``"`` doubled). A header with 100 signature lines is ~40 KB. 4 MiB is that with a margin
#: of 2.6x; a longer line is refused after reading ``MAX_LINE_BYTES + 1`` bytes of it, so a
#: trail of one multi-gigabyte line costs the verifier 4 MiB, not the line (bug KX).
MAX_LINE_BYTES = 4 * 1024 * 1024

#: The one line end of the format. Every reader of an export splits at it and nowhere else:
#: the SDK's (streamed, spooled or whole), the verifier, the server's upload check; the
#: verifier refuses a ``\\r`` before it (a canonical line holds none, nor does a CSV row as
#: the exporter writes it), so ``\\r\\n`` is not a line end of the format (bug NE).
LINE_END = "\n"
#: The ``newline=`` of a text file an export is read back from: lines end at ``LINE_END``
#: only (``newline=""`` also ends them at ``\\r``), and nothing is translated.
TEXT_NEWLINE = LINE_END

# Python's csv refuses a field over its limit (128 KiB by default), which an entry's cell
# can exceed (bug IY). The limit is global state of the csv module: it is raised here, once,
# at import, to the line cap (no field is longer than its line, and no reader is handed a
# line over the cap), and nothing changes it afterwards. Raising it per line, as IY did,
# raced with every other thread reading CSV and let one upload's line length set everyone's
# limit (bug KY). Never lowered: the SDK imports this inside other people's applications,
# and one that raised the limit for its own CSV (to ``sys.maxsize``, say) could no longer
# read a field over the cap once it imported ``uprof.sdk`` (bug LI).
if csv.field_size_limit() < MAX_LINE_BYTES:
    csv.field_size_limit(MAX_LINE_BYTES)


def check_filter(chosen: Mapping[str, Any]) -> None:
    """Raise ``AuditEntryError`` naming the first filter value an export's header may not
    hold: ``since``/``until`` a time in the log's form, the others what an entry's field
    of that name holds (the allowlist). The one check of a header's filter: the verifier
    refuses a header by it, and the exporter refuses the filter by it before writing
    anything, since an export with a filter its verifier refuses was written, signed and
    audited, and never verified (bug NB)."""
    for name, value in chosen.items():
        try:
            if name in ("since", "until"):
                if not isinstance(value, str) or normalise_timestamp(value, name) != value:
                    raise AuditEntryError(f"filter {name} must be a time in the log's form")
            else:
                validate_entry({"action": "x", name: value})
        except AuditEntryError as exc:
            raise AuditEntryError(f"filter {name}: {exc}") from None


def over_line_cap(text: str, *, ended: bool = False) -> bool:
    """Whether ``text`` (one line, without its newline; with it when ``ended``) is longer
    than ``MAX_LINE_BYTES`` in UTF-8. A character is at least one byte: only a line near
    the cap and not all ASCII (``isascii`` is a flag of the string) is encoded, and the
    line is never copied to take its newline off (bug MB: a line at the cap was copied
    twice more here)."""
    size = len(text) - (ended and text.endswith("\n"))
    if size <= MAX_LINE_BYTES // 4:
        return False
    if size > MAX_LINE_BYTES or text.isascii():
        return size > MAX_LINE_BYTES
    return len(text.encode("utf-8")) - (len(text) - size) > MAX_LINE_BYTES


def line_cap_refusal(number: int) -> str:
    """The message refusing line ``number`` of an export as over the cap."""
    return (
        f"line {number} is longer than {MAX_LINE_BYTES} bytes, the longest an export "
        "holds (docs/audit-format.md, line length)"
    )


def _refuse_over_cap(line: str, number: int) -> None:
    """Raise ``ValueError`` naming line ``number`` when it is over the cap, or when it holds
    lone surrogates (text read with ``errors="surrogateescape"`` from bytes that are not
    UTF-8) where its bytes are counted: refused as not UTF-8, as the verifier refuses
    them (bug LH), not as a ``UnicodeEncodeError`` about a position (bug NF)."""
    try:
        over = over_line_cap(line, ended=True)
    except UnicodeEncodeError:
        raise ValueError(f"line {number} is not UTF-8") from None
    if over:
        raise ValueError(line_cap_refusal(number))


def checked_lines(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` as they are, refusing (``ValueError``) the first over the cap."""
    near = MAX_LINE_BYTES // 4  # shorter lines are under the cap whatever their characters
    for number, line in enumerate(lines, start=1):
        if len(line) > near:
            _refuse_over_cap(line, number)
        yield line


def capped_lines(read: Callable[[int], str]) -> Iterator[str]:
    """The lines of a text stream (``read`` is its ``readline``), each with its newline,
    reading at most ``MAX_LINE_BYTES`` + 1 characters of one: a longer line raises
    ``ValueError`` once the cap is passed, so a stream of one endless line costs the
    cap, not the line (bug LU). The stream must end its lines at ``LINE_END`` only: a
    text file opened with ``newline=TEXT_NEWLINE`` (bug NE)."""
    number = 0
    while line := read(MAX_LINE_BYTES + 1):
        number += 1
        _refuse_over_cap(line, number)
        yield line


def export_lines(text: str) -> Iterator[str]:
    """The lines of an export held whole, each with its ``\\n`` (the last without one when
    the text does not end with it), split at ``LINE_END`` only, one line at a time.

    ``str.splitlines`` also splits at ``\\r``, ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``,
    ``\\x85``, U+2028 and U+2029, so one answer read whole was other lines than the same
    answer read as it streamed, which splits at ``\\n`` as the verifier does (bug NE)."""
    start = 0
    while (end := text.find(LINE_END, start)) != -1:
        yield text[start : end + 1]
        start = end + 1
    if start < len(text):
        yield text[start:]


def line_at(raw: bytes, number: int) -> bytes:
    """Line ``number`` (1-based) of an export's bytes, without its ``\\n``; empty when the
    file has fewer lines. Found by searching, not by splitting the whole file: a 20 MiB
    upload of empty lines split into a list cost 160 MiB of pointers to quote one (bug NG)."""
    end = LINE_END.encode()
    if number < 1:
        return b""
    start = 0
    for _ in range(number - 1):
        found = raw.find(end, start)
        if found == -1:
            return b""
        start = found + 1
    stop = raw.find(end, start)
    return raw[start : len(raw) if stop == -1 else stop]


@dataclass(frozen=True)
class FrameLine:
    """One line of an export as its frame reads it (``ExportFrame.read``).

    ``kind``: "header", "entry" or "trailer". ``record``: the header's or trailer's
    object (its frame checked), or a JSONL entry's object when its line is not in the
    canonical assembly (``{"entry":`` first; the verifier says what is wrong with it),
    else None: an entry's line is not parsed here. ``text``: what the digest and the
    canonical checks read: the header's or trailer's canonical JSON; a CSV entry's row or
    a parsed JSONL entry's line (a JSONL entry in its canonical assembly is one shared
    ``FrameLine`` of number 0 and no text: the line is the caller's own). ``cells``: a
    CSV entry row's cells."""

    number: int
    kind: str
    text: str
    record: dict[str, Any] | None = None
    cells: list[str] | None = None


#: What ``ExportFrame.read`` returns for a JSONL entry in its canonical assembly: its
#: number and text are the caller's own (the line it handed in).
_AN_ENTRY = FrameLine(0, "entry", "")


class ExportFrame:
    """The one reading of an export's frame: the exporter's form of every line, the
    order of the records, and what the header and the trailer may hold without the
    key. Fed one line at a time (``read``); ``VerificationError`` naming the line at the
    first line the format refuses. Both readers of an export read through it: the
    offline verifier (``audit.verify``, which then checks with the key what only the
    key can tell: the origin and key ids, the checkpoint, every entry and its proof, the
    digest and the signature) and the SDK's summary (``export_frame``). They were two
    readings of one frame, held together by a test only (decision 0189's Left).

    The rules: no line ends in ``\r`` (neither a canonical JSON line nor a CSV row as
    the exporter writes it does: ``\r\n`` is a rewritten file, bug OF). JSONL: line 1 is
    the header; then entries (a line ``{"entry":`` first, as its canonical JSON has it, is
    an entry and is not parsed here; any other is parsed, and must be an entry or the
    trailer); the trailer is last. CSV: the column row, the header row, entry rows, the
    trailer row, each row written exactly as the exporter writes it. The header and the
    trailer are strict JSON objects of exactly their fields, in RFC 8785 canonical
    form; the header's format, filter, ``filtered``, ``exported_at`` (the log's form) and
    ``tree_size`` (a count); the trailer's ``entry_count`` the entry lines counted, its
    digest 32 bytes of hex and its signature 64 of base64. Nothing follows the trailer.

    ``read`` takes a line with its newline (``ended``) or without; an entry's line is
    not copied to take it off (most of an export's bytes are entries: a copy of each
    cost the SDK's whole-answer readers half again, decision 0189)."""

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        self.header: dict[str, Any] | None = None
        self.trailer: dict[str, Any] | None = None
        self.entries = 0
        self._lines = 0

    def read(self, number: int, line: str, *, ended: bool = False) -> FrameLine | None:
        """What line ``number`` is (None: the CSV column row)."""
        self._lines = number
        cut = len(line) - 1 if ended else len(line)
        if line.endswith("\r", 0, cut):
            raise VerificationError(
                "line ends with \\r\\n, not the format's \\n", line_number=number
            )
        if self.trailer is not None:
            raise VerificationError("content after the export trailer", line_number=number)
        if self.format == "csv":
            return self._csv_line(number, line, cut)
        if self.header is None:
            text = line[:cut]
            return self._header(_parsed(text, number), text, number)
        if line.startswith(_ENTRY_LINE_PREFIX):
            # The hot path (most lines): nothing made per line; the caller has the line.
            self.entries += 1
            return _AN_ENTRY
        text = line[:cut]
        obj = _parsed(text, number)
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind == "entry":
            self.entries += 1
            return FrameLine(number, "entry", text, record=obj)
        if kind == "trailer":
            return self._trailer(obj, text, number)
        raise VerificationError(f"unexpected record kind {kind!r}", line_number=number)

    def end(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The header and trailer once every line was read; refused when the lines
        stopped before the trailer."""
        if self._lines == 0:
            raise VerificationError("export is empty", line_number=0)
        if self.header is None or self.trailer is None:
            raise VerificationError(
                "export ends without its trailer: it was truncated", line_number=self._lines
            )
        return self.header, self.trailer

    def _csv_line(self, number: int, line: str, cut: int) -> FrameLine | None:
        if number == 1:
            if line[:cut] + "\n" != csv_line(CSV_COLUMNS):
                raise VerificationError(
                    "neither a JSONL export (no '{') nor a CSV export (wrong column row)",
                    line_number=number,
                )
            return None
        cells = _csv_cells(line, cut, number)
        kind, data = cells[0], cells[-1]
        if kind in ("header", "trailer"):
            if any(cells[1:-1]):
                raise VerificationError(f"{kind} row has data outside 'data'", line_number=number)
            obj = _parsed(data, number)
            if kind == "header" and self.header is None:
                return self._header(obj, data, number)
            if kind == "trailer" and isinstance(obj, dict) and obj.get("kind") == "trailer":
                if self.header is None:
                    raise VerificationError(
                        "export trailer: trailer before the export header", line_number=number
                    )
                return self._trailer(obj, data, number)
            raise VerificationError(f"unexpected {kind} row", line_number=number)
        if kind == "entry" and self.header is not None:
            self.entries += 1
            return FrameLine(number, "entry", line, cells=cells)
        raise VerificationError(f"unexpected row kind {kind!r}", line_number=number)

    def _header(self, obj: Any, text: str, number: int) -> FrameLine:
        def fail(reason: str) -> VerificationError:
            return VerificationError(f"export header: {reason}", line_number=number)

        if not isinstance(obj, dict) or obj.get("kind") != "header":
            raise fail("the first record must be the header")
        if set(obj) != HEADER_KEYS:
            raise fail(f"fields must be {sorted(HEADER_KEYS)}")
        _require_canonical(obj, text, number)
        if obj["format"] != EXPORT_FORMAT:
            raise fail(f"unknown format {obj['format']!r}")
        chosen = obj["filter"]
        if not isinstance(chosen, dict) or not set(chosen) <= FILTER_KEYS:
            raise fail(f"filter must be an object with keys among {sorted(FILTER_KEYS)}")
        try:
            check_filter(chosen)
        except AuditEntryError as exc:
            raise fail(str(exc)) from None
        if obj["filtered"] is not bool(chosen):
            raise fail("'filtered' must be true exactly when a filter is given")
        exported_at = obj["exported_at"]
        try:
            if not isinstance(exported_at, str) or normalise_timestamp(exported_at) != exported_at:
                raise AuditEntryError("exported_at must be a time in the log's form")
        except AuditEntryError:
            raise fail("exported_at must be a UTC time like 2025-03-01T08:00:00.000000Z") from None
        if not _is_count(obj["tree_size"]):
            raise fail("tree_size is not a count")
        self.header = obj
        return FrameLine(number, "header", text, record=obj)

    def _trailer(self, obj: dict[str, Any], text: str, number: int) -> FrameLine:
        def fail(reason: str) -> VerificationError:
            return VerificationError(f"export trailer: {reason}", line_number=number)

        if set(obj) != TRAILER_KEYS:
            raise fail(f"fields must be {sorted(TRAILER_KEYS)}")
        _require_canonical(obj, text, number)
        if not _is_count(obj["entry_count"]) or obj["entry_count"] != self.entries:
            raise fail(f"entry_count differs from the {self.entries} entries present")
        try:
            hexdecode_strict(obj["export_sha256"], "export_sha256", size=32)
            b64decode_strict(obj["signature"], "export signature", size=64)
        except VerificationError as exc:
            raise fail(exc.reason) from None
        self.trailer = obj
        return FrameLine(number, "trailer", text, record=obj)


def export_frame(lines: Iterable[str], fmt: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and trailer of an export's ``lines`` (each with its ``\\n``), read by
    ``ExportFrame`` as the verifier reads them, without the key; ``ValueError`` naming the
    line where the verifier refuses the frame. Every line ends with ``LINE_END``, the last
    one too. A JSONL entry whose line is not the canonical assembly is refused here too
    (the verifier refuses it, saying what is wrong with it). The entries' contents, the
    digest and the signatures are the verifier's (``uprof audit verify``,
    ``Client.audit_verify``). The SDK's summary of an export is read here, so it never
    reports a file whose frame the verifier refuses (bug OF)."""
    frame = ExportFrame(fmt)
    try:
        for number, line in enumerate(lines, start=1):
            if not line.endswith(LINE_END):
                raise VerificationError("last line has no newline", line_number=number)
            read = frame.read(number, line, ended=True)
            if read is not None and read.kind == "entry" and read.record is not None:
                raise VerificationError("entry line is not in canonical form", line_number=number)
        return frame.end()
    except VerificationError as exc:
        raise ValueError(str(exc)) from None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parsed(text: str, number: int) -> Any:
    return strict_json(text, "line", line_number=number)


def _require_canonical(obj: Any, text: str, number: int) -> None:
    try:
        canonical = canonical_bytes(obj).decode("utf-8")
    except AuditEntryError as exc:
        raise VerificationError(str(exc), line_number=number) from None
    if canonical != text:
        raise VerificationError("line is not in RFC 8785 canonical form", line_number=number)


def _csv_cells(line: str, cut: int, number: int) -> list[str]:
    """The cells of a CSV export's row ``number`` (``line``, its newline after ``cut``),
    written exactly as the exporter writes it."""
    try:
        rows = list(read_csv_rows([line]))
    except csv.Error as exc:
        raise VerificationError(f"row is not valid CSV ({exc})", line_number=number) from None
    if len(rows) != 1 or len(rows[0]) != len(CSV_COLUMNS):
        raise VerificationError(f"row must have {len(CSV_COLUMNS)} cells", line_number=number)
    written = csv_line(rows[0])
    # ``csv_line`` ends with its newline: equal to the line with it, or to the line and it.
    if len(written) != cut + 1 or not written.startswith(line):
        raise VerificationError(
            "row is not written the way the exporter writes it", line_number=number
        )
    return rows[0]


def entry_line(entry_json: str, proof_b64: Sequence[str], leaf_index: int) -> str:
    """Assemble the canonical JSONL line of one entry (without its newline).

    RFC 8785 sorts keys by UTF-16 code units; for these ASCII keys that is "entry" <
    "inclusion" < "kind" < "leaf_index", and the nested values are already canonical.
    """
    return _ENTRY_LINE_PREFIX + entry_json + entry_line_tail(proof_b64, leaf_index)


def entry_line_tail(proof_b64: Sequence[str], leaf_index: int) -> str:
    """Return what follows the entry object in its canonical line."""
    hashes = '"' + '","'.join(proof_b64) + '"' if proof_b64 else ""
    return f',"inclusion":[{hashes}],"kind":"entry","leaf_index":{leaf_index}}}'


def split_entry_line(line: str, proof_b64: Sequence[str], leaf_index: int) -> str | None:
    """Return the entry JSON text of a line, or None if the line is not the canonical assembly."""
    tail = entry_line_tail(proof_b64, leaf_index)
    if not line.startswith(_ENTRY_LINE_PREFIX) or not line.endswith(tail):
        return None
    return line[len(_ENTRY_LINE_PREFIX) : len(line) - len(tail)]


def csv_line(cells: Sequence[str]) -> str:
    """Serialise one CSV record exactly as the exporter writes it (with its newline)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    return buffer.getvalue()


def read_csv_rows(lines: Iterable[str]) -> Iterator[list[str]]:
    """Read a CSV export's records, one line each (every reader of the format uses this).

    The allowlist lets an entry's cell be larger than Python's default csv field limit
    (bug IY); the limit is the line cap, set once when this module is imported (above).

    Each line is read alone: the exporter writes one record per line (a cell's newline
    is escaped inside its JSON), and one ``csv.reader`` over all the lines would carry a
    quoted cell on into the next line, so a hostile stream of short lines, each under the
    cap, grew one record without end (bug MA). Alone, no record is longer than its line.
    """
    for line in lines:
        yield from csv.reader((line,))
