"""Check an audit export or an erasure receipt someone hands in, and say where it fails.

The offline verifiers (``audit.verify.verify_export``, ``audit.receipts.verify_receipt``)
raise at the first problem; services that take a file from a user (the compliance
console, the REST API) want an answer instead: verified or not, the failing line and
leaf, and the failing line's text to show.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from audit.errors import VerificationError
from audit.export_format import line_at

Kind = Literal["export", "receipt"]
#: How much of a failing line is quoted back.
QUOTED_CHARS = 400


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    kind: Kind
    detail: str
    line_number: int | None = None
    leaf_index: int | None = None
    line_text: str = ""


def check_upload(
    raw: bytes,
    kind: Kind,
    public_key: Any,
    origin: str,
    *,
    tenant: str | None = None,
    rotation_proof: Callable[[int, int], Sequence[str]] | None = None,
) -> CheckResult:
    """Verify ``raw`` (an export in JSONL or CSV, or a receipt's JSON) with the log's key.

    With ``tenant`` (the service's own: tenants on one set of stores share the log's key
    and origin), a receipt of another tenant and an export of another tenant's are
    refused: the verdict, ``ok``, is what a caller reads, and it said ``True`` for another
    tenant's file to an auditor who may read none of that tenant's entries (bug JQ).
    ``rotation_proof(m, n)``: the log's consistency proof between two of its sizes, for a
    receipt or an export whose key was rotated out after it (bugs KG, LK)."""
    from audit.receipts import parse_receipt, verify_receipt
    from audit.verify import verify_export

    try:
        if kind == "receipt":
            receipt = parse_receipt(raw)
            verify_receipt(
                receipt, public_key, origin=origin, tenant=tenant, rotation_proof=rotation_proof
            )
            body = receipt["body"]
            detail = (
                f"receipt {body['receipt_id']} issued {body['issued_at']} for tenant "
                f"{body['subject']['tenant']}, "
                f"{len(body['actions'])} actions, scope {body['request']['scope']}"
            )
        else:
            report = verify_export(
                bytes(raw), public_key, origin, tenant=tenant, rotation_proof=rotation_proof
            )
            filtered_on = report.filter.get("tenant")
            detail = (
                f"{report.entry_count} entries, tree size {report.tree_size}, "
                f"format {report.format}"
                + (f", tenant {filtered_on}" if filtered_on is not None else "")
            )
    except VerificationError as error:
        line_text = ""
        if error.line_number:
            # Only what is quoted is decoded: a line may be as long as the cap.
            quoted = line_at(raw, error.line_number)[: 4 * QUOTED_CHARS]
            line_text = quoted.decode("utf-8", "replace")
        return CheckResult(
            ok=False,
            kind=kind,
            detail=str(error),
            line_number=error.line_number,
            leaf_index=error.leaf_index,
            line_text=line_text[:QUOTED_CHARS],
        )
    return CheckResult(ok=True, kind=kind, detail=detail)


def carried_checkpoint(raw: bytes | str) -> str:
    """The signed checkpoint note a file carries, unverified: an export's (JSONL or CSV,
    its header's ``checkpoint``), a proof document's, or the file itself when it is a
    note. What ``uprof audit rotation-proof`` and the SDK send for an export or a proof
    document (a note, not the whole trail); the log verifies it before proving anything.

    Raises VerificationError when the file is none of these."""
    from audit.export_format import CSV_COLUMNS, csv_line, read_csv_rows
    from audit.strict_json import strict_json

    data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
    first, _, rest = data.partition(b"\n")
    try:
        if first.startswith(b"{"):
            carrier = strict_json(first, "file")
        elif first + b"\n" == csv_line(CSV_COLUMNS).encode():
            row = next(read_csv_rows([rest.partition(b"\n")[0].decode("utf-8")]), [])
            carrier = strict_json(row[-1], "export header") if row and row[0] == "header" else {}
        else:
            return data.decode("utf-8")
    except (UnicodeDecodeError, ValueError, csv.Error):
        raise VerificationError(
            "the file is not UTF-8 text or its first record is not JSON"
        ) from None
    note = carrier.get("checkpoint") if isinstance(carrier, dict) else None
    if not isinstance(note, str) or "body" in carrier:
        raise VerificationError(
            "the file is neither an export, a proof document nor a checkpoint note (a "
            "receipt's rotation proof is asked for with the receipt itself)"
        )
    return note
