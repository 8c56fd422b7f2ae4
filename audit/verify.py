"""Offline verification of audit exports: needs only the log's public key and origin.

``verify_export`` raises ``VerificationError`` at the first problem, naming the line number
and, for an entry, its ``leaf_index``; on success it returns a ``VerificationReport``. It checks:

1. the header: canonical JSON, format, origin and key ids, and the checkpoint note's signature;
2. every entry: canonical line, ``leaf_index`` inside the checkpoint's tree and strictly
   increasing (so unique), matching the header's declared filter, and an inclusion proof that
   leads from ``SHA-256(0x00 || entry bytes)`` to the checkpoint root;
3. for an unfiltered export: indexes dense ``0..n-1`` with ``n`` the checkpoint's tree size,
   and the root recomputed from all leaves equal to the checkpoint root;
4. the trailer: entry count, SHA-256 of every line before it, and the log key's signature over
   that digest; nothing may follow it.

This module imports no database code.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any, BinaryIO

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit._codec import b64decode_strict, hexdecode_strict
from audit.checkpoint import CheckpointBody, verify_checkpoint
from audit.entry import stored_entry_bytes
from audit.errors import AuditEntryError, VerificationError
from audit.export_format import (
    CSV_COLUMNS,
    CSV_COPIED_FIELDS,
    CSV_PROOF_SEPARATOR,
    ENTRY_KEYS,
    EXPORT_SIGNATURE_CONTEXT,
    MAX_LINE_BYTES,
    ExportFrame,
    entry_line,
    over_line_cap,
    split_entry_line,
)
from audit.keyring import key_by_id, trusted_keys
from audit.keys import HELD_BY_READER, RotationProof, TrustedKeys, note_key_id
from audit.merkle import HASH_SIZE, Frontier, IncreasingInclusions, leaf_hash, verify_inclusion
from audit.strict_json import strict_json

_DECIMAL_RE = re.compile(r"^(0|[1-9][0-9]{0,18})\Z")


@dataclass(frozen=True)
class VerificationReport:
    """What a successfully verified export proved."""

    format: str  # "jsonl" | "csv"
    origin: str
    key_id: str
    tree_size: int
    root: bytes
    entry_count: int
    filtered: bool
    filter: dict[str, str] = field(default_factory=dict)
    first_leaf_index: int | None = None
    last_leaf_index: int | None = None
    exported_at: str = ""
    export_sha256: str = ""
    #: How many of the key history's rotation points the trail was checked to pass through
    #: (``keys_unbounded``: rotations a v1 history recorded no point for, whose old keys
    #: this verdict cannot bound; see docs/audit-format.md).
    rotation_points_checked: int = 0
    keys_unbounded: int = 0


def _strict_json(text: str, line_number: int) -> Any:
    return strict_json(text, "line", line_number=line_number)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _ExportVerifier:
    """The checks shared by both encodings, fed one logical line at a time."""

    def __init__(
        self,
        keys: Sequence[Ed25519PublicKey],
        origin: str,
        fmt: str,
        trusted: Sequence[CheckpointBody] = (),
        tenant: str | None = None,
        rotation_proof: RotationProof = None,
    ) -> None:
        #: For a trail whose key was rotated out after its checkpoint: the log's proof
        #: from the checkpoint's size to the key's point (``verify_export``).
        self._rotation_proof = rotation_proof
        #: The tenant whose trail this must be (``verify_export(..., tenant=)``), or None.
        self._tenant = tenant
        #: The trusted keys (the pinned key, or its endorsed history, as ranges); the
        #: header names which one signs the trailer.
        self._keys = keys if isinstance(keys, TrustedKeys) else TrustedKeys(keys)
        self._key = self._keys[-1]
        #: Checkpoints the reader trusted before (smallest first): the trail must extend each.
        self._trusted = sorted(trusted)
        self._origin = origin
        self._format = fmt
        self._digest = sha256()
        self._header: dict[str, Any] | None = None
        self._tree_size = 0
        self._root = b""
        self._filter: dict[str, str] = {}
        self._filtered = False
        self._frontier = Frontier()
        #: The entries' inclusion proofs, checked in leaf order (set with the checkpoint).
        self._inclusions = IncreasingInclusions(0, b"")
        self._count = 0
        self._last = -1
        self._first: int | None = None
        self._report: VerificationReport | None = None
        self._rotation_points_checked = 0

    # header ---------------------------------------------------------------------------------

    def header(self, obj: Any, line: str, line_number: int) -> None:
        def fail(reason: str) -> VerificationError:
            return VerificationError(f"export header: {reason}", line_number=line_number)

        # The frame (``ExportFrame``: the fields, their canonical form, the format, the
        # filter, ``filtered``, ``exported_at``, ``tree_size`` a count) was read first;
        # here what only the pinned key and origin can tell.
        if obj["origin"] != self._origin:
            raise fail(f"origin {obj['origin']!r} is not the expected {self._origin!r}")
        key = key_by_id(self._keys, obj["key_id"])
        if key is None:
            raise fail(
                "key_id is not the pinned public key's id"
                + (" nor of a key its history endorses" if len(self._keys) > 1 else "")
            )
        self._key = key
        if obj["note_key_id"] != note_key_id(self._origin, self._key).hex():
            raise fail("note_key_id does not match the pinned public key")
        try:
            # Signed by the key the header names, the one that signs the trailer, in its
            # range (LN): checked against every key of the history, a retired key signed
            # the trailer of a filtered trail over the current key's checkpoint unbounded.
            # Below its point, the checkpoint needs its rotation proof (LK).
            self._tree_size, self._root = verify_checkpoint(
                obj["checkpoint"],
                self._keys.only(key),
                self._origin,
                rotation_proof=self._rotation_proof,
            )
        except VerificationError as exc:
            if "carries no signature" in exc.reason:
                raise fail(
                    "the checkpoint is not signed by the key the header names (key_id), "
                    "the one that signs the trailer"
                ) from None
            raise fail(exc.reason) from None
        if obj["tree_size"] != self._tree_size:
            raise fail("tree_size differs from the signed checkpoint")
        self._inclusions = IncreasingInclusions(self._tree_size, self._root)
        chosen = obj["filter"]
        if self._tenant is not None and chosen.get("tenant", self._tenant) != self._tenant:
            raise fail(f"export is filtered on tenant {chosen['tenant']!r}, not {self._tenant!r}")
        self._filter, self._filtered = chosen, bool(chosen)
        self._check_rotation_points()
        self._check_trusted_sizes(fail)
        self._header = obj
        self._digest.update(line.encode("utf-8") + b"\n")

    # entries --------------------------------------------------------------------------------

    def entry(
        self,
        leaf_index: Any,
        entry_obj: Any,
        entry_json: str,
        proof_b64: list[str],
        line: str,
        line_number: int,
    ) -> None:
        index = leaf_index if _is_int(leaf_index) else None

        def fail(reason: str) -> VerificationError:
            return VerificationError(reason, line_number=line_number, leaf_index=index)

        if self._header is None:
            raise fail("entry before the export header")
        if index is None:
            raise fail("leaf_index is not an integer")
        if not 0 <= index < self._tree_size:
            raise fail(f"leaf_index outside the checkpoint's tree of size {self._tree_size}")
        if index <= self._last:
            raise fail(
                f"leaf indexes must be strictly increasing (previous entry was {self._last}): "
                "entries were reordered or duplicated"
            )
        if not self._filtered and index != self._count:
            raise fail(
                f"unfiltered export must hold every index 0..{self._tree_size - 1}; "
                f"index {self._count} is missing (entries deleted or reordered)"
            )
        if not isinstance(entry_obj, dict):
            raise fail("entry is not a JSON object")
        try:
            canonical = stored_entry_bytes(entry_obj)
        except AuditEntryError as exc:
            raise fail(f"not an entry the log could have stored: {exc}") from None
        if canonical != entry_json.encode("utf-8"):
            raise fail("entry is not in RFC 8785 canonical form")
        self._check_filter(entry_obj, fail)
        leaf = leaf_hash(canonical)
        if not self._inclusions.check(leaf, index, proof_b64):
            self._refuse_inclusion(leaf, index, proof_b64, fail)
        if not self._filtered:
            self._frontier.append(leaf)
            self._check_trusted_prefix(fail)
        self._digest.update(line.encode("utf-8") + b"\n")
        self._count += 1
        self._last = index
        if self._first is None:
            self._first = index

    def _refuse_inclusion(
        self, leaf: bytes, index: int, proof_b64: Sequence[object], fail: Any
    ) -> None:
        """Say what is wrong with a proof ``IncreasingInclusions`` did not accept: the full
        check of it alone, every hash decoded and the path hashed up to the root."""
        hashes = []
        for position, text in enumerate(proof_b64):
            try:
                hashes.append(b64decode_strict(text, f"inclusion hash {position}", size=HASH_SIZE))
            except VerificationError as exc:
                raise fail(exc.reason) from None
        try:
            verify_inclusion(leaf, index, self._tree_size, hashes, self._root)
        except VerificationError as exc:
            raise fail(f"{exc.reason}: the entry or its proof was altered") from None
        # Both lead to the root yet differ from an earlier line's proof at one node: two
        # hashes for one node, a SHA-256 collision, or a fault here. Refused (fail closed).
        raise fail(
            "inclusion proof leads to the root but differs from an earlier entry's proof "
            "of the same tree: the entry or its proof was altered"
        )

    def _check_trusted_sizes(self, fail: Any) -> None:
        if not self._trusted:
            return
        if self._filtered:
            raise fail(
                "a filtered export cannot show that it extends a trusted checkpoint: "
                "ask for the unfiltered trail"
            )
        newest = self._trusted[-1]
        if newest.tree_size > self._tree_size:
            raise fail(
                f"the trusted checkpoint of size {newest.tree_size} is larger than this "
                f"export's tree of size {self._tree_size}: the log shrank or forked"
            )
        self._check_trusted_prefix(fail)  # a trusted size of 0

    def _check_rotation_points(self) -> None:
        """A whole trail must pass through every point where the key history says a key
        was rotated out, inside its size: entries a retired key's checkpoints covered are
        then the log's (a log rewritten below a rotation point, or a retired key's fork
        of it, is refused). A filtered trail, or one smaller than a point, cannot show it:
        ``rotation_points_checked`` says how many were."""
        if self._filtered:
            return
        # A set: after a log restart several keys share the restart's point.
        points = {
            CheckpointBody(point.tree_size, point.root)
            for point in self._keys.retired_at.values()
            if point.tree_size <= self._tree_size
        }
        self._rotation_points_checked = len(points)
        self._trusted = sorted([*self._trusted, *points])

    def _check_trusted_prefix(self, fail: Any) -> None:
        """Compare the root of the leaves read so far with a trusted checkpoint of that size."""
        while self._trusted and self._trusted[0].tree_size == self._frontier.size:
            trusted = self._trusted.pop(0)
            if self._frontier.root() != trusted.root:
                raise fail(
                    f"the first {trusted.tree_size} entries do not hash to the root of the "
                    f"trusted checkpoint of size {trusted.tree_size}: the log was rewritten "
                    "after that checkpoint was published"
                )

    def _check_filter(self, entry: dict[str, Any], fail: Any) -> None:
        for name in ("subject_ref", "app_id", "action", "tenant"):
            if name in self._filter and entry.get(name) != self._filter[name]:
                raise fail(f"entry does not match the export's filter on {name}")
        stated = entry.get("tenant")
        if self._tenant is not None and stated is not None and stated != self._tenant:
            # An unfiltered trail of several tenants' entries is not one tenant's (JS).
            raise fail(f"entry is of tenant {stated!r}, not {self._tenant!r}")
        recorded_at = entry.get("recorded_at")
        if "since" in self._filter or "until" in self._filter:
            if not isinstance(recorded_at, str):
                raise fail("entry has no recorded_at to match the export's time filter")
            if "since" in self._filter and recorded_at < self._filter["since"]:
                raise fail("entry is older than the export's 'since'")
            if "until" in self._filter and recorded_at >= self._filter["until"]:
                raise fail("entry is not older than the export's 'until'")

    # trailer --------------------------------------------------------------------------------

    def trailer(self, obj: Any, line: str, line_number: int) -> None:
        def fail(reason: str) -> VerificationError:
            return VerificationError(f"export trailer: {reason}", line_number=line_number)

        # The frame checked the fields, their canonical form, ``entry_count`` against
        # the entry lines (each verified above) and the digest's and signature's form.
        assert self._header is not None and obj["entry_count"] == self._count
        if not self._filtered:
            if self._count != self._tree_size:
                raise fail(
                    f"unfiltered export ends after {self._count} of {self._tree_size} entries"
                )
            if self._frontier.root() != self._root:
                raise fail("root recomputed from all entries differs from the checkpoint root")
        digest = self._digest.digest()
        claimed = hexdecode_strict(obj["export_sha256"], "export_sha256", size=32)
        signature = b64decode_strict(obj["signature"], "export signature", size=64)
        if claimed != digest:
            raise fail("export_sha256 does not match the lines above: the file was altered")
        try:
            self._key.verify(signature, EXPORT_SIGNATURE_CONTEXT + digest)
        except InvalidSignature:
            raise fail("signature over the export does not verify with the pinned key") from None
        header = self._header
        self._report = VerificationReport(
            format=self._format,
            origin=self._origin,
            key_id=header["key_id"],
            tree_size=self._tree_size,
            root=self._root,
            entry_count=self._count,
            filtered=self._filtered,
            filter=dict(self._filter),
            first_leaf_index=self._first,
            last_leaf_index=None if self._first is None else self._last,
            exported_at=header["exported_at"],
            export_sha256=digest.hex(),
            rotation_points_checked=self._rotation_points_checked,
            keys_unbounded=self._keys.unbounded_retired,
        )

    @property
    def done(self) -> bool:
        return self._report is not None

    def report(self, last_line: int) -> VerificationReport:
        if self._report is None:
            raise VerificationError(
                "export ends without its trailer: it was truncated", line_number=last_line
            )
        return self._report


# --- Input ------------------------------------------------------------------------------------


def _numbered_lines(
    source: str | os.PathLike[str] | bytes | Iterable[str | bytes],
) -> Iterator[tuple[int, str]]:
    """Yield (line number, text without newline); a file (a path, or its whole content as
    bytes) must end every line with \\n and has no other line break."""
    if isinstance(source, bytes | bytearray):  # a whole file's content: read like the file
        yield from _file_lines(io.BytesIO(source))
        return
    if isinstance(source, str | os.PathLike):
        with Path(source).open("rb") as handle:
            yield from _file_lines(handle)
        return
    for number, item in enumerate(source, start=1):
        if isinstance(item, bytes):
            _check_length(len(item) - item.endswith(b"\n"), number)
        text = _decode(item, number) if isinstance(item, bytes) else item
        if not isinstance(text, str):
            raise VerificationError("export lines must be text", line_number=number)
        if text.endswith("\n"):
            text = text[:-1]
        # A character is at least one byte: only a line near the cap needs counting.
        if len(text) > MAX_LINE_BYTES // 4 and _over_line_cap(text, number):
            _check_length(MAX_LINE_BYTES + 1, number)
        yield number, text


def _over_line_cap(text: str, number: int) -> bool:
    """The format's one byte count (``over_line_cap``). Text read with
    ``errors="surrogateescape"`` holds lone surrogates for bytes that are not UTF-8:
    refused as the same bytes in a file are, not as ``UnicodeEncodeError`` (bug LH)."""
    try:
        return over_line_cap(text)
    except UnicodeEncodeError:
        raise VerificationError("line is not UTF-8", line_number=number) from None


def _file_lines(handle: BinaryIO) -> Iterator[tuple[int, str]]:
    """Read a file a line at a time, never more than ``MAX_LINE_BYTES + 1`` bytes of one."""
    number = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if not raw.endswith(b"\n"):
            _check_length(len(raw), number)
            raise VerificationError("last line has no newline", line_number=number)
        yield number, _decode(raw[:-1], number)


def _check_length(size: int, number: int) -> None:
    if size > MAX_LINE_BYTES:
        raise VerificationError(
            f"line is longer than {MAX_LINE_BYTES} bytes, the longest an export holds "
            "(docs/audit-format.md, line length)",
            line_number=number,
        )


def _decode(raw: bytes, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VerificationError("line is not UTF-8", line_number=number) from None


# --- Entry points -----------------------------------------------------------------------------


def verify_export(
    source: str | os.PathLike[str] | bytes | Iterable[str | bytes],
    public_key: Ed25519PublicKey | bytes | str | Sequence[Ed25519PublicKey],
    origin: str,
    *,
    trusted_checkpoints: Iterable[str] = (),
    key_history: Any = None,
    tenant: str | None = None,
    rotation_proof: RotationProof = None,
) -> VerificationReport:
    """Verify a JSONL or CSV export offline; raise VerificationError at the first problem.

    ``source`` is a file path, a file's whole content (bytes), or an iterable of lines (with
    or without their newlines).
    ``public_key`` is the pinned key (object, PEM, or 32 raw bytes); ``origin`` the log's name.
    ``trusted_checkpoints`` are signed notes the reader received before (from a receipt, an
    earlier export, a witness): an unfiltered export must then hold, as its first n entries,
    exactly the tree of each such checkpoint of size n, so a log rewritten and re-signed
    since is refused.
    ``key_history`` (``audit.keyring``, naming the pinned key): the export and the trusted
    checkpoints may be signed by any key of that history (a key rotated since).
    With ``tenant``, the trail must be that tenant's: an export filtered on another tenant,
    or holding an entry that names another, is refused. Tenants on one set of stores share
    the log's key and origin, so without it another tenant's trail verifies as well as
    one's own (bug JS; the verdict, ``report.filter``, names the tenant filtered on).
    ``rotation_proof``: for a trail whose checkpoint (size m) its key signed before being
    rotated out at N > m (the history says so), the log's consistency proof from m to N
    (base64 hashes, or a callable ``(m, N) -> hashes``); without it such a trail is refused
    (bug LK, decision 0175-retired-below): it rests on the retired key's word alone.
    """
    key = trusted_keys(public_key, key_history)
    trusted = []
    for position, note in enumerate(trusted_checkpoints):
        try:
            # The reader's own notes: a forged one only makes the trail fail to extend it.
            trusted.append(verify_checkpoint(note, key, origin, rotation_proof=HELD_BY_READER))
        except VerificationError as exc:
            raise VerificationError(f"trusted checkpoint {position + 1}: {exc.reason}") from None
    lines = _numbered_lines(source)
    first = next(lines, None)
    if first is None:
        raise VerificationError("export is empty", line_number=0)
    fmt = "jsonl" if first[1].startswith("{") else "csv"
    verifier = _ExportVerifier(key, origin, fmt, trusted, tenant, rotation_proof)
    return _verify_lines(first, lines, verifier, fmt)


def _verify_lines(
    first: tuple[int, str],
    lines: Iterator[tuple[int, str]],
    verifier: _ExportVerifier,
    fmt: str,
) -> VerificationReport:
    """Read the lines through the export's frame (``ExportFrame``, the one reading of it
    the SDK's summary shares), then check each record with the key."""
    frame = ExportFrame(fmt)
    number = first[0]
    for number, line in itertools.chain((first,), lines):
        read = frame.read(number, line)
        if read is None:  # the CSV column row
            continue
        if read.kind == "header":
            verifier.header(read.record, read.text, number)
        elif read.kind == "trailer":
            verifier.trailer(read.record, read.text, number)
        elif read.cells is not None:
            _csv_entry(verifier, read.cells, number)
        elif read.record is not None:
            _jsonl_entry(verifier, read.record, line, number)
        else:
            _assembled_entry(verifier, line, number)
    frame.end()
    return verifier.report(number)


def _assembled_entry(verifier: _ExportVerifier, line: str, number: int) -> None:
    """An entry line as the exporter assembles it (``{"entry":`` first), read by Python's
    ``json``, in half the time ``strict_json`` takes. What it reads differently from
    ``strict_json`` (the last of two equal keys, floats, ``NaN``, deep nesting) never
    passes ``_jsonl_entry``: a line passes only when it is exactly the canonical assembly
    of what was read, an entry the log could have stored, which holds none of them. On a
    refusal, the line is read strictly again: what ``strict_json`` refuses is what is said,
    as when every line was read by it; else the two readings are the same object, and so
    is the refusal."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        obj = None
    if not isinstance(obj, dict):
        _jsonl_entry(verifier, _strict_json(line, number), line, number)
        return
    try:
        _jsonl_entry(verifier, obj, line, number)
    except VerificationError as refused:
        error = refused
    else:
        return
    _strict_json(line, number)
    raise error


def _jsonl_entry(verifier: _ExportVerifier, obj: dict[str, Any], line: str, number: int) -> None:
    leaf_index = obj.get("leaf_index")
    shown = leaf_index if _is_int(leaf_index) else None
    proof = obj.get("inclusion")
    if set(obj) != ENTRY_KEYS:
        raise VerificationError(
            f"entry fields must be {sorted(ENTRY_KEYS)}", line_number=number, leaf_index=shown
        )
    # JSON's strings are ``str`` itself: the set of the hashes' types, made in C.
    if shown is None or not isinstance(proof, list) or not set(map(type, proof)) <= {str}:
        raise VerificationError(
            "entry needs an integer leaf_index and a list of base64 hashes",
            line_number=number,
            leaf_index=shown,
        )
    entry_json = split_entry_line(line, proof, shown)
    if entry_json is None:
        raise VerificationError(
            "entry line is not in canonical form", line_number=number, leaf_index=shown
        )
    verifier.entry(shown, obj["entry"], entry_json, proof, line, number)


def _csv_entry(verifier: _ExportVerifier, cells: list[str], number: int) -> None:
    named = dict(zip(CSV_COLUMNS, cells, strict=True))
    if not _DECIMAL_RE.match(named["leaf_index"]):
        raise VerificationError("leaf_index is not a decimal integer", line_number=number)
    leaf_index = int(named["leaf_index"])
    if named["data"]:
        raise VerificationError(
            "entry row has a 'data' cell", line_number=number, leaf_index=leaf_index
        )
    entry_json = named["entry"]
    entry_obj = _strict_json(entry_json, number)
    if isinstance(entry_obj, dict):
        for name in CSV_COPIED_FIELDS:
            if named[name] != str(entry_obj.get(name, "")):
                raise VerificationError(
                    f"column {name!r} differs from the signed entry",
                    line_number=number,
                    leaf_index=leaf_index,
                )
    proof = named["inclusion"].split(CSV_PROOF_SEPARATOR) if named["inclusion"] else []
    line = entry_line(entry_json, proof, leaf_index)
    verifier.entry(leaf_index, entry_obj, entry_json, proof, line, number)
