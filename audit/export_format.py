"""The audit export format, shared by the exporter and the offline verifier.

JSONL, one RFC 8785 canonical JSON object per line, each line ending in ``\\n``:

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
from collections.abc import Iterable, Iterator, Sequence

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

    Python's csv refuses a field over its limit (128 KiB by default), and the allowlist
    lets an entry's cell be larger (1,000 tokens of 200 characters in a list field), so a
    CSV trail the log wrote was refused by the verifier, and its summary failed in the SDK
    and ``POST /v1/audit/export`` (bug IY). The exporter writes no field across lines and
    no field is longer than its line, which is already read: the limit (process-wide) is
    raised to each line's length, never lowered.
    """

    def sized() -> Iterator[str]:
        for line in lines:
            if len(line) > csv.field_size_limit():
                csv.field_size_limit(len(line))
            yield line

    return csv.reader(sized())
