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
from typing import Any

from audit.entry import normalise_timestamp, validate_entry
from audit.errors import AuditEntryError

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


def entry_line(entry_json: str, proof_b64: Sequence[str], leaf_index: int) -> str:
    """Assemble the canonical JSONL line of one entry (without its newline).

    RFC 8785 sorts keys by UTF-16 code units; for these ASCII keys that is "entry" <
    "inclusion" < "kind" < "leaf_index", and the nested values are already canonical.
    """
    return _ENTRY_LINE_PREFIX + entry_json + entry_line_tail(proof_b64, leaf_index)


def entry_line_tail(proof_b64: Sequence[str], leaf_index: int) -> str:
    """Return what follows the entry object in its canonical line."""
    hashes = ",".join(f'"{h}"' for h in proof_b64)
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
