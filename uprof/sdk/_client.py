"""``Client`` (sync, HTTP or embedded) and ``AsyncClient`` (async, HTTP).

Both expose the same methods with the same arguments; each method validates its
request with the wire models before anything is sent, and returns a typed model.
The app is the one the API key (or, embedded, ``app_id``) names: no method takes
an app id.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import stat
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TextIO, TypeVar

import httpx
from pydantic import BaseModel, JsonValue

from audit.export_format import (
    MAX_LINE_BYTES,
    TEXT_NEWLINE,
    capped_lines,
    export_lines,
    line_cap_refusal,
)
from uprof.schemas import api as w
from uprof.sdk import _operations as ops
from uprof.sdk._backends import (
    ACCEPTED_ENCODING,
    DEFAULT_IN_PROGRESS_RESENDS,
    DEFAULT_WRITE_RETRIES,
    AsyncHttpBackend,
    DeadlinedTransport,
    EmbeddedBackend,
    HttpBackend,
    SyncBackend,
    environment_mounts,
)
from uprof.sdk._errors import TransportError, invalid_request
from uprof.sdk._operations import Call, Operation

R = TypeVar("R", bound=BaseModel)

if TYPE_CHECKING:
    from uprof.kernel import Uprof

DEFAULT_TIMEOUT_S = 30.0
#: The largest answer ``audit_export`` collects in memory, in UTF-8 bytes: sixteen times
#: the format's line cap, about 90,000 entries of a typical trail. A longer one is refused
#: once the limit is passed, naming it and ``audit_export_to``, which streams to a file
#: (bug NC: the answer was collected whatever its length, so a broken or hostile server,
#: or a trail larger than the caller's memory, took all of it).
AUDIT_EXPORT_MAX_BYTES = 64 * 1024 * 1024
InteractionLike = w.InteractionBody | Mapping[str, Any]
ProposalLike = BaseModel | Mapping[str, Any]


def _headers(api_key: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {api_key}",
        "User-Agent": "uprof-sdk",
        "Accept-Encoding": ACCEPTED_ENCODING,
    }


def _timeout_of(timeout_s: float | None) -> float | None:
    """``timeout_s`` as given, once it is a bound a call can be sent under: a finite
    number of seconds above 0, at most ``threading.TIMEOUT_MAX`` (the longest wait the
    system takes), or None for none. Anything else was taken as it was and failed at the
    first call, as an expired deadline (0, -1: never sent), a socket's ``ValueError``
    (NaN) or ``OverflowError`` (inf, 1e300), or a ``TypeError`` ("5") (bug SB); refused
    here, ``InvalidRequestError`` naming ``timeout_s``, before any client is made."""
    if timeout_s is None:
        return None
    number = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    if not number or not 0 < timeout_s <= threading.TIMEOUT_MAX:
        raise invalid_request(
            [
                w.FieldProblem(
                    field="timeout_s",
                    message=f"{timeout_s!r} is not a number of seconds above 0 and at most "
                    f"{threading.TIMEOUT_MAX:g} (None: no bound)",
                )
            ]
        )
    return float(timeout_s)


# Request builders, shared by both clients so they cannot drift apart.


def _capture(subject: str, fields: dict[str, Any], key: str | None) -> Call[w.CaptureAck]:
    if key is not None and fields.get("occurred_at_defaulted"):
        # A default of "now" differs between retries, so the retry would be a new body.
        raise invalid_request(
            [
                w.FieldProblem(
                    field="occurred_at",
                    message="required with idempotency_key (the default, now, "
                    "would differ between retries)",
                )
            ]
        )
    fields = {k: v for k, v in fields.items() if k != "occurred_at_defaulted"}
    return Call(ops.CAPTURE, ops.build(w.CaptureIn, subject=subject, **fields), key)


def _capture_many(
    subject: str, items: Sequence[InteractionLike], key: str | None
) -> Call[w.CaptureBatchAck]:
    body = ops.build(w.CaptureBatchIn, subject=subject, interactions=ops.interactions_of(items))
    return Call(ops.CAPTURE_MANY, body, key)


def _withdraw(
    subject: str, consent_id: str, erase: bool, key: str | None
) -> Call[w.ConsentWithdrawn]:
    body = ops.build(w.ConsentWithdrawIn, subject=subject, consent_id=consent_id, erase=erase)
    return Call(ops.WITHDRAW_CONSENT, body, key)


def _proposals(
    subject: str,
    items: Sequence[ProposalLike],
    agent_id: str,
    sharing: str,
    purpose: str,
    observed_at: datetime | None,
    key: str | None = None,
) -> Call[w.ProposalsResult]:
    fields: dict[str, Any] = {
        "subject": subject,
        "agent_id": agent_id,
        "sharing": sharing,
        "purpose": purpose,
        "proposals": ops.proposals_of(items),
    }
    if observed_at is not None:
        fields["observed_at"] = observed_at
    return Call(ops.SUBMIT_PROPOSALS, ops.build(w.ProposalsIn, **fields), key)


def _slice(fields: dict[str, Any]) -> Call[w.ProfileSlice]:
    present = {k: v for k, v in fields.items() if v is not None}
    return Call(ops.SLICE, ops.build(w.SliceIn, **present))


def _profile(subject: str, as_of: datetime | None) -> Call[w.Profile]:
    fields: dict[str, Any] = {"subject": subject}
    if as_of is not None:
        fields["as_of"] = as_of
    return Call(ops.PROFILE, ops.build(w.ProfileIn, **fields))


def _grant(
    subject: str,
    categories: Sequence[str],
    purposes: Sequence[str],
    legal_basis: str,
    expires_at: datetime | None,
    collected_by: str,
    key: str | None = None,
) -> Call[w.ConsentGranted]:
    fields: dict[str, Any] = {
        "subject": subject,
        "categories": list(categories),
        "purposes": list(purposes),
        "legal_basis": legal_basis,
        "collected_by": collected_by,
    }
    if expires_at is not None:
        fields["expires_at"] = expires_at
    return Call(ops.GRANT_CONSENT, ops.build(w.ConsentGrantIn, **fields), key)


def _audit_export(
    fmt: str,
    subject: str | None,
    for_app: str | None,
    action: str | None,
    since: datetime | None,
    until: datetime | None,
) -> Call[w.AuditExport]:
    fields = _given(
        format=fmt, subject=subject, for_app=for_app, action=action, since=since, until=until
    )
    return Call(ops.AUDIT_EXPORT, ops.build(w.AuditExportIn, **fields))


def _summary_of(lines: Iterable[str], fmt: str) -> w.AuditExportSummary:
    try:
        return w.AuditExportSummary.of_export(lines, fmt)
    except (ValueError, KeyError) as error:
        raise TransportError(
            f"audit_export: the export arrived incomplete or malformed ({error})"
        ) from None


class _Collected:
    """The chunks of an answer ``audit_export`` holds, up to ``AUDIT_EXPORT_MAX_BYTES``."""

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._size = 0

    def add(self, chunk: str) -> None:
        # An export is ASCII (``isascii`` is a flag of the string): only other text is
        # encoded to be counted in bytes.
        self._size += len(chunk) if chunk.isascii() else len(chunk.encode("utf-8", "surrogatepass"))
        if self._size > AUDIT_EXPORT_MAX_BYTES:
            self._chunks = []  # let go of it before the error travels up
            raise TransportError(
                f"audit_export: the answer is longer than {AUDIT_EXPORT_MAX_BYTES} bytes, "
                "the most it collects in memory; use audit_export_to(path), which writes "
                "it to a file as it arrives"
            )
        self._chunks.append(chunk)

    def assembled(self, fmt: str) -> w.AuditExport:
        content = "".join(self._chunks)
        self._chunks = []
        # Split where the streaming readers and the verifier split, at \n only (bug NE).
        # Held as a list, as ``splitlines`` gave: read through the generator, the benchmark
        # (``audit_export`` again and again) ran 1.8 times slower, for no lower peak (the
        # chunks and their join are the peak).
        summary = _summary_of(list(export_lines(content)), fmt)
        return w.AuditExport(format=fmt, content=content, summary=summary)


def _written_lines(chunks: Iterable[str], out: TextIO) -> Iterator[str]:
    """Write each chunk to ``out`` as it comes, and yield the text again line by line.

    The part of a line not yet ended is kept up to the format's line cap, no further: a
    server's endless line is refused (``ValueError``) once it passes the cap, not held
    whole (bug LU). Only the new chunk is split, never what is kept. A server may end an
    HTTP chunk anywhere: a line sent a few bytes at a time, kept as its pieces, cost a
    string object per piece, 10 to 35 times the cap (bug MB). Every ``_PIECES_PER_BLOCK``
    pieces are joined into one block, so the objects kept are few whatever the pieces'
    size, and each character is copied twice at most."""
    blocks: list[str] = []
    pieces: list[str] = []
    kept = 0
    number = 0
    for chunk in chunks:
        out.write(chunk)
        *ends, rest = chunk.split("\n")
        for end in ends:
            number += 1
            line = "".join([*blocks, *pieces, end, "\n"]) if kept else end + "\n"
            blocks, pieces, kept = [], [], 0  # let go before the reader looks at it
            yield line
        if rest:
            pieces.append(rest)
            kept += len(rest)
            if kept > MAX_LINE_BYTES:  # characters: at least as many bytes
                raise ValueError(line_cap_refusal(number + 1))
            if len(pieces) == _PIECES_PER_BLOCK:
                blocks.append("".join(pieces))
                pieces = []
    if kept:
        yield "".join([*blocks, *pieces])


#: How many pieces of an unended line ``_written_lines`` keeps before joining them.
_PIECES_PER_BLOCK = 1024

#: The start of a subject export's answer, ``{"export": <the document>}``, as JSON may
#: space it; the longest such start looked for before the answer is called malformed.
_EXPORT_OPENING = re.compile(r'\s*\{\s*"export"\s*:\s*')
_EXPORT_OPENING_MAX = 64


#: What ``_Brackets`` looks at first: a bracket, a quote, an escape; all else is skipped.
_JSON_STRUCTURE = re.compile(r'[{}\[\]"\\]')
_CLOSES = {"}": "{", "]": "["}
#: The deepest nesting ``_Brackets`` follows (the stack of open brackets is its memory):
#: far past any export's, and past what Python's ``json`` reads back.
_MAX_NESTING = 1000

# What ``_Brackets`` skips in C (``re``), so Python steps only where the nesting goes past
# ``_SKIP_LEVELS`` or a piece's end cuts a bracketed run or a string: QY's follower
# stepped in Python at every bracket and quote (about 10 MB/s on dense answers).
# Possessive quantifiers: what is matched is never tried again another way (without
# them a dense answer took minutes), so text is read a few times at most.
_PLAIN = r'[^{}\[\]"\\]++'  # no bracket, quote or escape
_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'  # a whole string, its escapes in it
_SKIP_LEVELS = 3


def _skips() -> tuple[re.Pattern[str], ...]:
    """``[k]``: text, whole strings and whole bracketed runs nesting at most ``k`` deep."""
    inner, skips = f"{_PLAIN}|{_STRING}", []
    for _ in range(_SKIP_LEVELS + 1):
        skips.append(re.compile(rf"(?:{inner})*+", re.DOTALL))
        run = rf"(?:{inner})*+"
        inner = rf"{_PLAIN}|{_STRING}|\{{{run}\}}|\[{run}\]"
    return tuple(skips)


_SKIPS = _skips()
#: Where a string opened before may end: its quote, or an escape. Control characters
#: (never raw in a JSON string) are in the set only so ``re`` looks it up in a table:
#: twice as fast as a set of two characters; one found is stepped past like any other.
_QUOTE_OR_ESCAPE = re.compile(r'["\\\x00-\x1f]')
#: The rest of a string from an escape: up to its closing quote, or to the piece's end
#: (stopping before an escape that is the piece's last character).
_STRING_REST = re.compile(r'[^"\\]*+(?:\\.[^"\\]*+)*+', re.DOTALL)


class _Brackets:
    """Follows a JSON object's brackets and strings as its text arrives in pieces, in
    memory bounded by its nesting: ``feed`` is False once the text is not one object (it
    opens with something else, closes what it did not open, goes on after its close, nests
    past ``_MAX_NESTING``, or has an escape outside a string); ``closed`` says the object
    has closed. It checks the shape, not every rule of JSON: enough to tell a whole
    document from one cut short or followed by more."""

    def __init__(self) -> None:
        self._open: list[str] = []
        self._started = self._in_string = self._escaped = self.closed = False

    def feed(self, text: str) -> bool:
        if self.closed:
            return not text.strip()
        at, end = 0, len(text)
        if self._escaped and text:
            at, self._escaped = 1, False  # the escaped character, first in this piece
        if not self._started:
            first = _JSON_STRUCTURE.search(text)
            if first is None:
                return not text.strip()
            if first.group() != "{" or text[: first.start()].strip():
                return False
            self._started = True
            self._open.append("{")
            at = first.end()
        while True:
            if self._in_string:
                found = _QUOTE_OR_ESCAPE.search(text, at)  # a long string: one search
                if found is None:
                    return True
                at = _STRING_REST.match(text, found.start()).end()  # type: ignore[union-attr]
                if at == end:
                    return True
                if text[at] == "\\":  # the piece's last: what it escapes comes next
                    self._escaped = True
                    return True
                self._in_string, at = False, at + 1  # past the closing quote
            levels = min(_MAX_NESTING - len(self._open), _SKIP_LEVELS)
            at = _SKIPS[levels].match(text, at).end()  # type: ignore[union-attr]
            if at == end:
                return True
            char, at = text[at], at + 1
            if char == '"':  # a string the piece's end cuts (a whole one was skipped)
                self._in_string = True
            elif char in "{[":
                if len(self._open) >= _MAX_NESTING:
                    return False
                self._open.append(char)
            elif char == "\\" or self._open.pop() != _CLOSES[char]:
                return False
            elif not self._open:
                self.closed = True
                return not text[at:].strip()


class _ExportDocument:
    """The document of a subject export's answer, ``{"export": <document>}``, taken out
    of it as the answer arrives, for ``export_subject_to``: ``feed`` each chunk of the
    answer and write what it returns, then ``end``. What is kept between chunks is the
    last character and the blanks after it (the answer's closing brace, once it ends), so
    memory stays flat. An answer that does not open or close as one is a
    ``TransportError``: the server is not uprof's, or the answer was cut short. What is
    written is followed as JSON's brackets and strings (``_Brackets``): an answer ending
    in a brace that closes no ``{"export": {...}}`` (cut after an inner object closed, a
    key after the document) was written as the export (review of 0204, bug QY)."""

    def __init__(self) -> None:
        self._head: str | None = ""
        self._held = ""
        self._brackets = _Brackets()

    def feed(self, chunk: str) -> str:
        if self._head is not None:
            self._head += chunk
            opening = _EXPORT_OPENING.match(self._head)
            if opening is None:
                if len(self._head) > _EXPORT_OPENING_MAX:
                    raise self._malformed()
                return ""
            chunk, self._head = self._head[opening.end() :], None
        text = self._held + chunk
        cut = max(len(text.rstrip()) - 1, 0)
        self._held = text[cut:]
        if not self._brackets.feed(text[:cut]):
            raise self._malformed()
        return text[:cut]

    def end(self) -> None:
        if self._head is not None or self._held.strip() != "}" or not self._brackets.closed:
            raise self._malformed()

    @staticmethod
    def _malformed() -> TransportError:
        return TransportError(
            'export_subject_to: the answer is not a whole {"export": ...} document '
            "(cut short, or not uprof's answer); nothing was written at the path"
        )


@contextlib.contextmanager
def _target(dest: str | PathLike[str] | TextIO) -> Iterator[TextIO]:
    """``dest`` to write an export to. A path is written through a new file beside it,
    synced and renamed over it once the export is read whole and its summary found; an
    export refused or interrupted (an error, a cancellation) removes that file, so the
    path holds a whole export or what it held before, never the part that arrived (bug
    ND). A text file given is the caller's: it holds what arrived."""
    if not isinstance(dest, str | PathLike):
        yield dest
        return
    path = Path(dest)
    if _a_stream(path):
        # A FIFO or a device (``/dev/stdout``): the caller reads it as it is written, and
        # no partial file can be left in it; renaming over it replaced it (bug NS).
        with open(path, "w", encoding="utf-8", newline="") as out:
            yield out
        return
    _clear_stale_parts(path)
    part, fd = _claimed_part(path)
    try:
        with open(fd, "w", encoding="utf-8", newline="") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
            # Renamed while still open, so still locked: a part unlocked for a moment
            # before its rename could be taken for a dead process's (bug OH).
            os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _claimed_part(path: Path) -> tuple[Path, int]:
    """A new part file beside ``path`` (hidden, named as a part, created as ``open(path,
    "w")`` would: the umask applies), open and locked (``flock``) for this export's life.

    The lock is what tells a live export's part from a dead one's (``_clear_stale_parts``):
    the system drops it when the process ends, however it ends. Between the create and
    the lock another export may have taken the new file for a dead one's and removed it:
    then it has no link any more, and another is made."""
    while True:
        part = path.with_name(_part_name(path.name, secrets.token_hex(_PART_TAG_CHARS // 2)))
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held only a moment by a remover, never by a writer
        if os.fstat(fd).st_nlink:
            return part, fd
        os.close(fd)


def _clear_stale_parts(path: Path) -> None:
    """Remove the part files beside ``path`` that no live process writes: those of an
    export to the same path whose process was killed (nothing else removed them; bug
    OH). Only a regular file of this user named as one of ``path``'s parts
    (``.<name>.<8 hex>.part``) whose lock is free is removed, and only while this holds
    its lock and it is still the file under that name; a part another process is
    writing is locked and left."""
    sample = _part_name(path.name, "0" * _PART_TAG_CHARS)
    head, tail = sample[: -len("0" * _PART_TAG_CHARS) - len(".part")], ".part"
    try:
        names = [e.name for e in os.scandir(path.parent) if e.name.startswith(head)]
    except OSError:
        return
    for name in names:
        tag = name[len(head) : -len(tail)]
        if name.endswith(tail) and len(tag) == _PART_TAG_CHARS and _is_hex(tag):
            _remove_if_stale(path.parent / name)


def _remove_if_stale(part: Path) -> None:
    try:
        fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return  # gone, a link, or not ours to read
    try:
        mine = os.fstat(fd)
        if not stat.S_ISREG(mine.st_mode) or mine.st_uid != os.getuid():
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live export writes it
        there = os.stat(part, follow_symlinks=False)
        if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
            part.unlink()
    except OSError:
        return  # renamed or removed meanwhile: not a stale part any more
    finally:
        os.close(fd)


_PART_TAG_CHARS = 8


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


#: The longest file name most file systems take, in bytes (ext4, XFS, btrfs, APFS).
_NAME_MAX = 255


def _part_name(name: str, tag: str) -> str:
    """``.<name>.<tag>.part``, ``name`` cut (by characters) to fit ``_NAME_MAX`` bytes: a
    name the path itself may have must not be refused for its part's (bug NU)."""
    while name and len(os.fsencode(f".{name}.{tag}.part")) > _NAME_MAX:
        name = name[:-1]
    return f".{name}.{tag}.part"


def _a_stream(path: Path) -> bool:
    """Whether ``path`` (its link followed) is there and neither a regular file nor a
    folder: a FIFO, a socket or a device, written into rather than renamed over."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # not there (or a dangling link): the part file is renamed to it
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a folder cannot be opened elsewhere)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _page(op: Operation[R], model: type[BaseModel], **fields: Any) -> Call[R]:
    """One page of a list; ``cursor``/``limit`` left out when not given (server defaults)."""
    return Call(op, ops.build(model, **_given(**fields)))


def _rotation_proof(
    receipt: str | Mapping[str, Any] | None, checkpoint: str | None
) -> Call[w.ReceiptRotationProof]:
    """The call for a rotation proof: of a receipt (its JSON as issued, or the ``receipt``
    mapping an erasure answered, ``ErasureReceipt.receipt``), or of a checkpoint (a
    signed note, such as an export header's ``checkpoint``, or a proof document's text)."""
    if (receipt is None) == (checkpoint is None):
        raise TypeError("give exactly one of receipt and checkpoint")
    if receipt is None:
        return Call(
            ops.RECEIPT_ROTATION_PROOF,
            ops.build(w.ReceiptRotationProofIn, checkpoint=checkpoint),
        )
    content = receipt if isinstance(receipt, str) else json.dumps(dict(receipt))
    body = ops.build(w.ReceiptRotationProofIn, receipt=content)
    return Call(ops.RECEIPT_ROTATION_PROOF, body)


def _audit_filters(
    subject: str | None,
    for_app: str | None,
    action: str | None,
    since: datetime | None,
    until: datetime | None,
) -> dict[str, Any]:
    return {
        "subject": subject,
        "for_app": for_app,
        "action": action,
        "since": since,
        "until": until,
    }


class Client:
    """The uprof API, synchronously: over HTTP (``Client(url, api_key)``) or in-process.

    >>> # with Client("http://127.0.0.1:8765", api_key) as client:
    >>> #     client.slice("alice", "what are my goals?", budget_tokens=256,
    >>> #                  purpose="personalization", agent_id="agent:one")
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        write_retries: int = DEFAULT_WRITE_RETRIES,
        in_progress_resends: int = DEFAULT_IN_PROGRESS_RESENDS,
    ) -> None:
        # Given no transport, the SDK's own, and the environment's proxies through it
        # (httpx mounts them only for its own); a transport given is the caller's whole
        # road, as httpx takes it.
        http = httpx.Client(
            base_url=base_url,
            headers=_headers(api_key),
            timeout=_timeout_of(timeout_s),
            transport=transport or DeadlinedTransport(),
            mounts=environment_mounts() if transport is None else None,
        )
        self._backend: SyncBackend = HttpBackend(http, write_retries, in_progress_resends)

    @classmethod
    def embedded(cls, kernel: Uprof, app_id: str, *, roles: Sequence[str] = ("app",)) -> Client:
        """A client over a kernel in this process, acting as ``app_id`` (same interface, no HTTP).

        The same checks and error mapping as the server apply. The kernel stays the
        caller's: closing the client does not close it.
        """
        client = cls.__new__(cls)
        client._backend = EmbeddedBackend(kernel, app_id, frozenset(roles))
        return client

    # ------------------------------------------------------------------ writes

    def capture(
        self,
        subject: str,
        *,
        agent_id: str,
        user_input: str = "",
        agent_response: str = "",
        occurred_at: datetime | None = None,
        session_id: str = "",
        actor: str = "",
        source_ref: str = "",
        purpose: str = "personalization",
        sharing: str = "private",
        agent_type: str = "",
        context: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> w.CaptureAck:
        """Capture one interaction (refused with PermissionDeniedError without consent).

        ``idempotency_key`` (on every write method): makes the call safe to retry; a
        retry with the same key and arguments gets the first answer and writes nothing.
        Over HTTP a write given no key gets one made for this call, and after a network
        failure (no answer: the write may have been committed) the client sends it again
        with that key, ``write_retries`` times (default 2), so it is stored once. Pass
        your own key to keep a retry of your own (a new call) safe too. A keyed write
        answered 409 ``request_in_progress`` (its first request, same key, still runs)
        is sent again with its key after the server's Retry-After (at most 30 s),
        ``in_progress_resends`` times (default 3), and gets the first request's answer;
        after that, ``ConflictError`` with that code.
        """
        fields = ops.interaction(
            agent_id=agent_id,
            user_input=user_input,
            agent_response=agent_response,
            occurred_at=occurred_at,
            session_id=session_id,
            actor=actor,
            source_ref=source_ref,
            purpose=purpose,
            sharing=sharing,
            agent_type=agent_type,
            context=context,
        )
        return self._backend.send(_capture(subject, fields, idempotency_key))

    def capture_many(
        self,
        subject: str,
        interactions: Sequence[InteractionLike],
        *,
        idempotency_key: str | None = None,
    ) -> list[w.CaptureAck]:
        """Capture several interactions about one subject, all or nothing."""
        return self._backend.send(_capture_many(subject, interactions, idempotency_key)).acks

    def submit_proposals(
        self,
        subject: str,
        proposals: Sequence[ProposalLike],
        *,
        agent_id: str,
        sharing: str = "private",
        purpose: str = "personalization",
        observed_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        """Submit structured proposals; returns how many the kernel applied."""
        call = _proposals(
            subject, proposals, agent_id, sharing, purpose, observed_at, idempotency_key
        )
        return self._backend.send(call).applied

    def grant_consent(
        self,
        subject: str,
        *,
        categories: Sequence[str],
        purposes: Sequence[str],
        collected_by: str,
        legal_basis: str = "consent",
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Record the subject's consent for this app; returns the consent id.

        ``collected_by`` names the app's own record of the user's consent action
        (required: an app records only consents it can show the user gave).
        """
        call = _grant(
            subject, categories, purposes, legal_basis, expires_at, collected_by, idempotency_key
        )
        return self._backend.send(call).consent_id

    def withdraw_consent(
        self,
        subject: str,
        consent_id: str,
        *,
        erase: bool = False,
        idempotency_key: str | None = None,
    ) -> w.ConsentWithdrawn:
        """Withdraw one of this app's consents (with ``erase``, also erase what it collected)."""
        return self._backend.send(_withdraw(subject, consent_id, erase, idempotency_key))

    def erase_subject(self, subject: str, *, basis: str = "GDPR-Art.17(1)") -> w.ErasureReceipt:
        """Erase a subject entirely (policy: ``erase``/``erasure``); returns the signed receipt."""
        body = ops.build(w.SubjectErasureIn, subject=subject, basis=basis)
        return self._backend.send(Call(ops.ERASE_SUBJECT, body))

    def erase_item(
        self, subject: str, item_id: str, *, with_evidence: bool = False
    ) -> w.ErasureReceipt:
        """Erase one profile item (policy: ``erase``/``erasure``)."""
        body = ops.build(
            w.ItemErasureIn, subject=subject, item_id=item_id, with_evidence=with_evidence
        )
        return self._backend.send(Call(ops.ERASE_ITEM, body))

    def erase_capture(self, subject: str, capture_id: str) -> w.ErasureReceipt:
        """Erase one captured event (policy: ``erase``/``erasure``)."""
        body = ops.build(w.CaptureErasureIn, subject=subject, capture_id=capture_id)
        return self._backend.send(Call(ops.ERASE_CAPTURE, body))

    def export_subject(self, subject: str) -> dict[str, JsonValue]:
        """Everything held about a subject (policy: ``export``/``access-request``)."""
        body = ops.build(w.SubjectExportIn, subject=subject)
        return self._backend.send(Call(ops.EXPORT_SUBJECT, body)).export

    def export_subject_to(self, subject: str, dest: str | PathLike[str] | TextIO) -> None:
        """Write ``export_subject``'s document (JSON) to ``dest`` (a path or a text file)
        as it arrives: no bound on its size (``export_subject`` reads up to
        ``MAX_ANSWER_BYTES``, 64 MiB), memory flat. A path holds the whole export once it
        has arrived, or, when it is refused or cut short, what it held before (written
        beside it and renamed over it, as ``audit_export_to``)."""
        body = ops.build(w.SubjectExportIn, subject=subject)
        document = _ExportDocument()
        with _target(dest) as out:
            with contextlib.closing(
                self._backend.stream_text(Call(ops.EXPORT_SUBJECT, body))
            ) as chunks:
                for chunk in chunks:
                    out.write(document.feed(chunk))
            document.end()

    def audit_export(
        self,
        *,
        format: str = "jsonl",
        subject: str | None = None,
        for_app: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> w.AuditExport:
        """The audit trail with proofs (``operator`` role); ``content`` is the file.

        The server streams it; this collects it in memory, up to
        ``AUDIT_EXPORT_MAX_BYTES`` (64 MiB): a longer answer raises ``TransportError``.
        For a large trail use ``audit_export_to``, which writes it to a file as it arrives.
        """
        call = _audit_export(format, subject, for_app, action, since, until)
        body = _Collected()
        with contextlib.closing(self._backend.stream_text(call)) as chunks:
            for chunk in chunks:
                body.add(chunk)
        return body.assembled(format)

    def audit_export_to(
        self,
        dest: str | PathLike[str] | TextIO,
        *,
        format: str = "jsonl",
        subject: str | None = None,
        for_app: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> w.AuditExportSummary:
        """Stream the audit export into ``dest`` (a path or a text file); return its summary.

        A path holds the export once it has arrived whole; until then, and when it is
        refused or interrupted, the path keeps what it held before (the export is written
        beside it and renamed over it)."""
        call = _audit_export(format, subject, for_app, action, since, until)
        with _target(dest) as out:
            lines = _written_lines(self._backend.stream_text(call), out)
            return _summary_of(lines, format)

    def audit_verify(self, content: str, *, kind: str = "export") -> w.AuditVerification:
        """Check an export or a receipt against the server's log (``operator`` role)."""
        body = ops.build(w.AuditVerifyIn, kind=kind, content=content)
        return self._backend.send(Call(ops.AUDIT_VERIFY, body))

    def audit_key(self) -> w.AuditKey:
        """The log's public key and latest checkpoint, to pin for offline verification."""
        return self._backend.send(Call(ops.AUDIT_KEY, None))

    def audit_proof(self, old_size: int, *, leaf_index: int | None = None) -> bytes:
        """A proof that the log only grew since the checkpoint of ``old_size`` entries you
        hold (and, with ``leaf_index``, that entry's inclusion): the proof document's file
        bytes, to save unchanged and check offline (``uprof audit verify-proof``;
        ``operator`` role, the policy's ``audit``)."""
        body = ops.build(w.AuditProofIn, old_size=old_size, leaf_index=leaf_index)
        return self._backend.send_for_bytes(Call(ops.AUDIT_PROOF, body))

    def audit_rotation_proof(
        self, receipt: str | Mapping[str, Any] | None = None, *, checkpoint: str | None = None
    ) -> w.ReceiptRotationProof:
        """The proof an erasure receipt issued before an audit key rotation needs offline
        with the key history: save ``rotation_proof`` as a JSON file for ``uprof audit
        verify-receipt --rotation-proof`` (both null when the receipt needs none;
        ``operator`` role, the policy's ``audit``; this tenant's receipts only). With
        ``checkpoint`` (an export header's signed note, or a proof document's text)
        instead, the proof an export or proof document signed before the rotation needs
        (``uprof audit verify``/``verify-proof --rotation-proof``)."""
        return self._backend.send(_rotation_proof(receipt, checkpoint))

    def register_session(self, session_id: str, subject: str) -> None:
        body = ops.build(w.SessionIn, session_id=session_id, subject=subject)
        self._backend.send(Call(ops.REGISTER_SESSION, body))

    def register_identifier(self, identifier: str, subject: str) -> None:
        body = ops.build(w.IdentifierIn, identifier=identifier, subject=subject)
        self._backend.send(Call(ops.REGISTER_IDENTIFIER, body))

    # ------------------------------------------------------------------- reads

    def slice(
        self,
        subject: str | None,
        query: str,
        *,
        budget_tokens: int,
        purpose: str,
        agent_id: str,
        agent_type: str = "",
        session_id: str | None = None,
        identifier: str | None = None,
        lexical_only: bool = False,
        wait_timeout_s: float | None = None,
    ) -> w.ProfileSlice:
        """The slice of the subject's profile this app may use for ``query``, within budget."""
        return self._backend.send(
            _slice(
                {
                    "subject": subject,
                    "query": query,
                    "budget_tokens": budget_tokens,
                    "purpose": purpose,
                    "agent_id": agent_id,
                    "agent_type": agent_type,
                    "session_id": session_id,
                    "identifier": identifier,
                    "lexical_only": lexical_only,
                    "wait_timeout_s": wait_timeout_s,
                }
            )
        )

    def profile(self, subject: str, *, as_of: datetime | None = None) -> w.Profile:
        """The whole profile (needs the ``operator`` role)."""
        return self._backend.send(_profile(subject, as_of))

    def evidence(self, subject: str, item_id: str) -> w.Evidence:
        """The captured events behind one item (needs the ``operator`` role)."""
        body = ops.build(w.EvidenceIn, subject=subject, item_id=item_id)
        return self._backend.send(Call(ops.EVIDENCE, body))

    def consents(self, subject: str) -> list[w.Consent]:
        """This app's consents from the subject, every page of them."""
        return list(self.iter_consents(subject))

    # ------------------------------------------------------------------- pages
    # Each ``list_*`` returns one page (``.items``, ``.next_cursor``); pass its
    # ``next_cursor`` back as ``cursor``. Each ``iter_*`` follows the cursors for you.

    def list_consents(
        self, subject: str, *, cursor: str | None = None, limit: int | None = None
    ) -> w.ConsentList:
        """One page of this app's consents from the subject."""
        call = _page(ops.CONSENTS, w.ConsentListIn, subject=subject, cursor=cursor, limit=limit)
        return self._backend.send(call)

    def iter_consents(self, subject: str, *, limit: int | None = None) -> Iterator[w.Consent]:
        return _follow(lambda c: self.list_consents(subject, cursor=c, limit=limit).items_page())

    def list_memories(
        self, subject: str, *, cursor: str | None = None, limit: int | None = None
    ) -> w.MemoryPage:
        """One page of the subject's memories, oldest first (``operator`` role)."""
        call = _page(ops.LIST_MEMORIES, w.MemoryListIn, subject=subject, cursor=cursor, limit=limit)
        return self._backend.send(call)

    def iter_memories(self, subject: str, *, limit: int | None = None) -> Iterator[w.MemoryOut]:
        return _follow(lambda c: self.list_memories(subject, cursor=c, limit=limit).items_page())

    def list_subjects(
        self, *, cursor: str | None = None, limit: int | None = None
    ) -> w.SubjectPage:
        """One page of live subjects by pseudonym (``operator`` role)."""
        return self._backend.send(
            _page(ops.LIST_SUBJECTS, w.SubjectListIn, cursor=cursor, limit=limit)
        )

    def iter_subjects(self, *, limit: int | None = None) -> Iterator[w.SubjectOut]:
        return _follow(lambda c: self.list_subjects(cursor=c, limit=limit).items_page())

    def audit_entries(
        self,
        *,
        subject: str | None = None,
        for_app: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> w.AuditEntryPage:
        """One page of the audit trail in leaf order (``operator`` role)."""
        filters = _audit_filters(subject, for_app, action, since, until)
        return self._backend.send(
            _page(ops.AUDIT_ENTRIES, w.AuditEntriesIn, **filters, cursor=cursor, limit=limit)
        )

    def iter_audit_entries(
        self,
        *,
        subject: str | None = None,
        for_app: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> Iterator[w.AuditEntryOut]:
        return _follow(
            lambda c: self.audit_entries(
                subject=subject,
                for_app=for_app,
                action=action,
                since=since,
                until=until,
                cursor=c,
                limit=limit,
            ).items_page()
        )

    def audit_receipts(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> w.ReceiptPage:
        """One page of the erasure receipts the log recorded (``operator`` role)."""
        call = _page(
            ops.AUDIT_RECEIPTS,
            w.ReceiptListIn,
            since=since,
            until=until,
            cursor=cursor,
            limit=limit,
        )
        return self._backend.send(call)

    def iter_audit_receipts(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> Iterator[w.ReceiptOut]:
        return _follow(
            lambda c: self.audit_receipts(
                since=since, until=until, cursor=c, limit=limit
            ).items_page()
        )

    def whoami(self) -> w.WhoAmI:
        """The app and roles this client acts as."""
        return self._backend.send(Call(ops.WHOAMI, None))

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient:
    """The uprof API over HTTP for asyncio code; the same methods as ``Client``, awaited."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        write_retries: int = DEFAULT_WRITE_RETRIES,
        in_progress_resends: int = DEFAULT_IN_PROGRESS_RESENDS,
    ) -> None:
        http = httpx.AsyncClient(
            base_url=base_url,
            headers=_headers(api_key),
            timeout=_timeout_of(timeout_s),
            transport=transport,
        )
        self._backend = AsyncHttpBackend(http, write_retries, in_progress_resends)

    async def capture(
        self,
        subject: str,
        *,
        agent_id: str,
        user_input: str = "",
        agent_response: str = "",
        occurred_at: datetime | None = None,
        session_id: str = "",
        actor: str = "",
        source_ref: str = "",
        purpose: str = "personalization",
        sharing: str = "private",
        agent_type: str = "",
        context: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> w.CaptureAck:
        fields = ops.interaction(
            agent_id=agent_id,
            user_input=user_input,
            agent_response=agent_response,
            occurred_at=occurred_at,
            session_id=session_id,
            actor=actor,
            source_ref=source_ref,
            purpose=purpose,
            sharing=sharing,
            agent_type=agent_type,
            context=context,
        )
        return await self._backend.send(_capture(subject, fields, idempotency_key))

    async def capture_many(
        self,
        subject: str,
        interactions: Sequence[InteractionLike],
        *,
        idempotency_key: str | None = None,
    ) -> list[w.CaptureAck]:
        call = _capture_many(subject, interactions, idempotency_key)
        return (await self._backend.send(call)).acks

    async def submit_proposals(
        self,
        subject: str,
        proposals: Sequence[ProposalLike],
        *,
        agent_id: str,
        sharing: str = "private",
        purpose: str = "personalization",
        observed_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        call = _proposals(
            subject, proposals, agent_id, sharing, purpose, observed_at, idempotency_key
        )
        return (await self._backend.send(call)).applied

    async def grant_consent(
        self,
        subject: str,
        *,
        categories: Sequence[str],
        purposes: Sequence[str],
        collected_by: str,
        legal_basis: str = "consent",
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        call = _grant(
            subject, categories, purposes, legal_basis, expires_at, collected_by, idempotency_key
        )
        return (await self._backend.send(call)).consent_id

    async def withdraw_consent(
        self,
        subject: str,
        consent_id: str,
        *,
        erase: bool = False,
        idempotency_key: str | None = None,
    ) -> w.ConsentWithdrawn:
        return await self._backend.send(_withdraw(subject, consent_id, erase, idempotency_key))

    async def erase_subject(
        self, subject: str, *, basis: str = "GDPR-Art.17(1)"
    ) -> w.ErasureReceipt:
        body = ops.build(w.SubjectErasureIn, subject=subject, basis=basis)
        return await self._backend.send(Call(ops.ERASE_SUBJECT, body))

    async def erase_item(
        self, subject: str, item_id: str, *, with_evidence: bool = False
    ) -> w.ErasureReceipt:
        body = ops.build(
            w.ItemErasureIn, subject=subject, item_id=item_id, with_evidence=with_evidence
        )
        return await self._backend.send(Call(ops.ERASE_ITEM, body))

    async def erase_capture(self, subject: str, capture_id: str) -> w.ErasureReceipt:
        body = ops.build(w.CaptureErasureIn, subject=subject, capture_id=capture_id)
        return await self._backend.send(Call(ops.ERASE_CAPTURE, body))

    async def export_subject(self, subject: str) -> dict[str, JsonValue]:
        body = ops.build(w.SubjectExportIn, subject=subject)
        return (await self._backend.send(Call(ops.EXPORT_SUBJECT, body))).export

    async def export_subject_to(self, subject: str, dest: str | PathLike[str] | TextIO) -> None:
        body = ops.build(w.SubjectExportIn, subject=subject)
        document = _ExportDocument()
        with _target(dest) as out:
            chunks = self._backend.stream_text(Call(ops.EXPORT_SUBJECT, body))
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    out.write(document.feed(chunk))
            document.end()

    async def audit_export(
        self,
        *,
        format: str = "jsonl",
        subject: str | None = None,
        for_app: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> w.AuditExport:
        call = _audit_export(format, subject, for_app, action, since, until)
        body = _Collected()
        async with contextlib.aclosing(self._backend.stream_text(call)) as chunks:
            async for chunk in chunks:
                body.add(chunk)
        return body.assembled(format)

    async def audit_export_to(
        self,
        dest: str | PathLike[str] | TextIO,
        *,
        format: str = "jsonl",
        subject: str | None = None,
        for_app: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> w.AuditExportSummary:
        call = _audit_export(format, subject, for_app, action, since, until)
        # A second copy, spilled to disk past 1 MiB, is read back for the summary: memory
        # stays flat however long the trail is, and dest need not be readable.
        with (
            _target(dest) as out,
            tempfile.SpooledTemporaryFile(
                max_size=1 << 20, mode="w+", encoding="utf-8", newline=TEXT_NEWLINE
            ) as copy,
        ):
            async with contextlib.aclosing(self._backend.stream_text(call)) as chunks:
                async for text in chunks:
                    out.write(text)
                    copy.write(text)
            copy.seek(0)
            # A line at a time, never more than the cap of one (bug LU).
            return _summary_of(capped_lines(copy.readline), format)

    async def audit_verify(self, content: str, *, kind: str = "export") -> w.AuditVerification:
        body = ops.build(w.AuditVerifyIn, kind=kind, content=content)
        return await self._backend.send(Call(ops.AUDIT_VERIFY, body))

    async def audit_key(self) -> w.AuditKey:
        return await self._backend.send(Call(ops.AUDIT_KEY, None))

    async def audit_proof(self, old_size: int, *, leaf_index: int | None = None) -> bytes:
        body = ops.build(w.AuditProofIn, old_size=old_size, leaf_index=leaf_index)
        return await self._backend.send_for_bytes(Call(ops.AUDIT_PROOF, body))

    async def audit_rotation_proof(
        self, receipt: str | Mapping[str, Any] | None = None, *, checkpoint: str | None = None
    ) -> w.ReceiptRotationProof:
        return await self._backend.send(_rotation_proof(receipt, checkpoint))

    async def register_session(self, session_id: str, subject: str) -> None:
        body = ops.build(w.SessionIn, session_id=session_id, subject=subject)
        await self._backend.send(Call(ops.REGISTER_SESSION, body))

    async def register_identifier(self, identifier: str, subject: str) -> None:
        body = ops.build(w.IdentifierIn, identifier=identifier, subject=subject)
        await self._backend.send(Call(ops.REGISTER_IDENTIFIER, body))

    async def slice(
        self,
        subject: str | None,
        query: str,
        *,
        budget_tokens: int,
        purpose: str,
        agent_id: str,
        agent_type: str = "",
        session_id: str | None = None,
        identifier: str | None = None,
        lexical_only: bool = False,
        wait_timeout_s: float | None = None,
    ) -> w.ProfileSlice:
        return await self._backend.send(
            _slice(
                {
                    "subject": subject,
                    "query": query,
                    "budget_tokens": budget_tokens,
                    "purpose": purpose,
                    "agent_id": agent_id,
                    "agent_type": agent_type,
                    "session_id": session_id,
                    "identifier": identifier,
                    "lexical_only": lexical_only,
                    "wait_timeout_s": wait_timeout_s,
                }
            )
        )

    async def profile(self, subject: str, *, as_of: datetime | None = None) -> w.Profile:
        return await self._backend.send(_profile(subject, as_of))

    async def evidence(self, subject: str, item_id: str) -> w.Evidence:
        body = ops.build(w.EvidenceIn, subject=subject, item_id=item_id)
        return await self._backend.send(Call(ops.EVIDENCE, body))

    async def consents(self, subject: str) -> list[w.Consent]:
        return [c async for c in self.iter_consents(subject)]

    async def list_consents(
        self, subject: str, *, cursor: str | None = None, limit: int | None = None
    ) -> w.ConsentList:
        call = _page(ops.CONSENTS, w.ConsentListIn, subject=subject, cursor=cursor, limit=limit)
        return await self._backend.send(call)

    def iter_consents(self, subject: str, *, limit: int | None = None) -> AsyncIterator[w.Consent]:
        async def fetch(cursor: str | None) -> tuple[list[w.Consent], str | None]:
            page = await self.list_consents(subject, cursor=cursor, limit=limit)
            return page.items_page()

        return _afollow(fetch)

    async def list_memories(
        self, subject: str, *, cursor: str | None = None, limit: int | None = None
    ) -> w.MemoryPage:
        call = _page(ops.LIST_MEMORIES, w.MemoryListIn, subject=subject, cursor=cursor, limit=limit)
        return await self._backend.send(call)

    def iter_memories(
        self, subject: str, *, limit: int | None = None
    ) -> AsyncIterator[w.MemoryOut]:
        async def fetch(cursor: str | None) -> tuple[list[w.MemoryOut], str | None]:
            page = await self.list_memories(subject, cursor=cursor, limit=limit)
            return page.items_page()

        return _afollow(fetch)

    async def list_subjects(
        self, *, cursor: str | None = None, limit: int | None = None
    ) -> w.SubjectPage:
        return await self._backend.send(
            _page(ops.LIST_SUBJECTS, w.SubjectListIn, cursor=cursor, limit=limit)
        )

    def iter_subjects(self, *, limit: int | None = None) -> AsyncIterator[w.SubjectOut]:
        async def fetch(cursor: str | None) -> tuple[list[w.SubjectOut], str | None]:
            return (await self.list_subjects(cursor=cursor, limit=limit)).items_page()

        return _afollow(fetch)

    async def audit_entries(
        self,
        *,
        subject: str | None = None,
        for_app: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> w.AuditEntryPage:
        filters = _audit_filters(subject, for_app, action, since, until)
        return await self._backend.send(
            _page(ops.AUDIT_ENTRIES, w.AuditEntriesIn, **filters, cursor=cursor, limit=limit)
        )

    def iter_audit_entries(
        self,
        *,
        subject: str | None = None,
        for_app: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[w.AuditEntryOut]:
        async def fetch(cursor: str | None) -> tuple[list[w.AuditEntryOut], str | None]:
            page = await self.audit_entries(
                subject=subject,
                for_app=for_app,
                action=action,
                since=since,
                until=until,
                cursor=cursor,
                limit=limit,
            )
            return page.items_page()

        return _afollow(fetch)

    async def audit_receipts(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> w.ReceiptPage:
        call = _page(
            ops.AUDIT_RECEIPTS,
            w.ReceiptListIn,
            since=since,
            until=until,
            cursor=cursor,
            limit=limit,
        )
        return await self._backend.send(call)

    def iter_audit_receipts(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[w.ReceiptOut]:
        async def fetch(cursor: str | None) -> tuple[list[w.ReceiptOut], str | None]:
            page = await self.audit_receipts(since=since, until=until, cursor=cursor, limit=limit)
            return page.items_page()

        return _afollow(fetch)

    async def whoami(self) -> w.WhoAmI:
        return await self._backend.send(Call(ops.WHOAMI, None))

    async def aclose(self) -> None:
        await self._backend.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


T = TypeVar("T")


def _follow(fetch: Callable[[str | None], tuple[list[T], str | None]]) -> Iterator[T]:
    """Every item of every page, following ``next_cursor`` until the server says done."""
    cursor: str | None = None
    while True:
        items, cursor = fetch(cursor)
        yield from items
        if cursor is None:
            return


async def _afollow(
    fetch: Callable[[str | None], Any],
) -> AsyncIterator[Any]:
    cursor: str | None = None
    while True:
        items, cursor = await fetch(cursor)
        for item in items:
            yield item
        if cursor is None:
            return


def _given(**fields: Any) -> dict[str, Any]:
    """The fields the caller set (None means "not given", so the server's default holds)."""
    return {k: v for k, v in fields.items() if v is not None}
