"""Read import files into interactions: uprof's own JSONL, OpenAI-style chats, Mem0 exports.

Every record becomes zero or more ``InteractionIn`` rows, or an ``ImportProblem`` naming
where it is (``line 7``, or ``results[3]`` in a Mem0 JSON document) and the field at fault.
A bad record never stops the others from being read.

Formats:

- ``interactions``: one uprof interaction per line (``uprof.schemas.capture.InteractionIn``).
- ``openai``: one conversation per line, ``{"messages": [{"role": "user", "content": ...},
  ...]}`` as in OpenAI chat fine-tuning files. A user message and the assistant messages
  that follow it make one interaction; ``system``, ``developer`` and ``tool`` messages are
  not captured. Optional per line (top level or in ``metadata``): ``subject``/``user_id``,
  ``session_id``/``conversation_id``/``id``, and a time, ``created_at``/``timestamp``/
  ``create_time`` (RFC 3339 with a zone, or Unix seconds); a message may carry its own.
  Each turn's ``source_ref`` is ``chat:<session or line hash>:<turn>``, so a re-run skips it.
- ``mem0``: what Mem0's ``get_all`` returns (a list, or ``{"results": [...]}``), as one JSON
  document or one memory per line: ``id``, ``memory``, ``user_id``, ``created_at``, and
  optional ``agent_id``, ``run_id``, ``metadata``, ``categories``. Each memory is captured
  as a statement (``source_ref`` ``mem0:<id>``) and goes through extraction like any capture.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from domain.errors import UprofError
from uprof.schemas.capture import InteractionIn

FORMATS = ("auto", "interactions", "openai", "mem0")
#: Longest line read (a line longer than this is one problem, not a memory spike).
MAX_LINE_BYTES = 4 * 1024 * 1024
#: Largest Mem0 JSON document (parsed whole; a larger export goes one memory per line).
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
#: Context entries a Mem0 record may fill (InteractionIn allows 64).
_MAX_MEM0_CONTEXT = 64
_CHAT_SKIPPED_ROLES = frozenset({"system", "developer", "tool", "function"})


@dataclass(frozen=True)
class ImportDefaults:
    """What a foreign format does not say: whose app, which subject, agent and time."""

    app_id: str | None = None
    subject: str | None = None
    agent_id: str = "agent:import"
    occurred_at: datetime | None = None
    purpose: str = "personalization"
    sharing: str = "private"


@dataclass(frozen=True)
class ImportProblem:
    """Why one record was not imported: where it is, the field at fault, what is wrong."""

    where: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.field}: {self.message}"


@dataclass(frozen=True)
class ImportRecord:
    """One record of the file and the interactions it holds (in order)."""

    where: str
    rows: tuple[InteractionIn, ...]


Parsed = ImportRecord | ImportProblem


def read_records(
    lines: Iterable[bytes | str], fmt: str, defaults: ImportDefaults
) -> Iterator[Parsed]:
    """Every record of the file, parsed; ``fmt`` "auto" looks at the first record."""
    numbered = _decoded(lines)
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    first: tuple[int, str | ImportProblem] | None = None
    for item in numbered:
        if isinstance(item[1], ImportProblem) or item[1].strip():
            first = item
            break
    if first is None:
        return
    if fmt == "auto":
        fmt = _detect(first[1])
    if fmt == "mem0" and isinstance(first[1], str) and not _is_json_object(first[1]):
        yield from _mem0_document(first, numbered, defaults)
        return
    reader = {"interactions": _interaction, "openai": _chat, "mem0": _mem0_line}[fmt]
    for number, text in _chain(first, numbered):
        where = f"line {number}"
        if isinstance(text, ImportProblem):
            yield text
        elif text.strip():
            yield reader(where, text, defaults)


# ------------------------------------------------------------------ reading lines


class FileLines:
    """The lines of a regular file, read with at most ``MAX_LINE_BYTES`` + 1 bytes of a
    line in memory (``for line in file`` holds a whole line, and a file without newlines
    is one line). A longer line is yielded cut to ``MAX_LINE_BYTES`` + 1 bytes, so the
    reader reports it as too long, and the rest of it is skipped. Iterating again reads
    the file again from its start (a strict run checks it, then writes it), and refuses
    to when the file changed meanwhile (what was checked must be what is written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._version: tuple[int, int, int] | None = None

    def __iter__(self) -> Iterator[bytes]:
        with self.path.open("rb") as file:
            st = os.fstat(file.fileno())
            version = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._version is not None and version != self._version:
                raise UprofError(
                    f"{self.path} changed while it was being imported; nothing more was "
                    "read (run the import again: records already written are skipped)"
                )
            self._version = version
            while line := file.readline(MAX_LINE_BYTES + 1):
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    while (rest := file.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                        pass
                yield line


def _decoded(lines: Iterable[bytes | str]) -> Iterator[tuple[int, str | ImportProblem]]:
    for number, raw in enumerate(lines, start=1):
        where = f"line {number}"
        if isinstance(raw, bytes):
            if len(raw) > MAX_LINE_BYTES:
                yield number, ImportProblem(where, "(line)", f"longer than {MAX_LINE_BYTES} bytes")
                continue
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                yield (
                    number,
                    ImportProblem(
                        where, "(line)", f"not UTF-8 (byte {error.start + 1} is not valid)"
                    ),
                )
                continue
        elif len(raw) > MAX_LINE_BYTES:
            yield number, ImportProblem(where, "(line)", f"longer than {MAX_LINE_BYTES} bytes")
            continue
        yield number, raw.lstrip("\ufeff") if number == 1 else raw


def _chain(
    first: tuple[int, str | ImportProblem], rest: Iterator[tuple[int, str | ImportProblem]]
) -> Iterator[tuple[int, str | ImportProblem]]:
    yield first
    yield from rest


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose key is given twice is refused: which one counts (json keeps the last,
    other readers the first) would decide whose subject or which app a record names."""
    loaded = dict(pairs)
    if len(loaded) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return loaded


def _load(where: str, text: str) -> Any | ImportProblem:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as error:
        return ImportProblem(where, "(line)", f"not valid JSON ({error.msg})")
    except _DuplicateKeyError as error:
        return ImportProblem(where, error.key[:64], "given twice in one object")
    except RecursionError:
        return ImportProblem(where, "(line)", "JSON nested too deeply")
    except ValueError:  # an integer of more digits than Python converts (not a JSONDecodeError)
        return ImportProblem(where, "(line)", "a number with too many digits")


def _is_json_object(text: str) -> bool:
    loaded = _load("", text)
    return isinstance(loaded, dict) and "results" not in loaded


def _detect(first: str | ImportProblem) -> str:
    if isinstance(first, ImportProblem):
        return "interactions"
    stripped = first.strip()
    if not stripped.startswith("{") or not _is_json_object(stripped):
        return "mem0"  # a JSON document (a list, or {"results": [...]}) over several lines
    loaded = json.loads(stripped)
    if "messages" in loaded:
        return "openai"
    if "memory" in loaded:
        return "mem0"
    return "interactions"


def _validated(
    where: str, fields: dict[str, Any], prefix: str = ""
) -> InteractionIn | ImportProblem:
    try:
        row = InteractionIn.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(record)"
        return ImportProblem(where, prefix + field, first["msg"])
    for name in _TEXT_FIELDS:
        if "\x00" in getattr(row, name):
            return ImportProblem(where, prefix + name, "must not contain NUL characters")
    return row


#: Text fields a store cannot keep with a NUL in them (checked per record, named).
_TEXT_FIELDS = ("subject", "user_input", "agent_response", "actor", "source_ref", "session_id")


# ----------------------------------------------------------------- uprof's own


def _interaction(where: str, text: str, defaults: ImportDefaults) -> Parsed:
    loaded = _load(where, text)
    if isinstance(loaded, ImportProblem):
        return loaded
    if not isinstance(loaded, dict):
        return ImportProblem(where, "(line)", "must be a JSON object")
    row = _validated(where, loaded)
    return row if isinstance(row, ImportProblem) else ImportRecord(where, (row,))


# ----------------------------------------------------------------- OpenAI chats


def _chat(where: str, text: str, defaults: ImportDefaults) -> Parsed:
    loaded = _load(where, text)
    if isinstance(loaded, ImportProblem):
        return loaded
    if not isinstance(loaded, dict):
        return ImportProblem(where, "(line)", "must be a JSON object with messages")
    messages = loaded.get("messages")
    if not isinstance(messages, list) or not messages:
        return ImportProblem(where, "messages", "must be a non-empty list of messages")
    raw_meta = loaded.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    known = {**meta, **{k: v for k, v in loaded.items() if k != "metadata"}}
    subject = _first(known, "subject", "user_id", "user") or defaults.subject
    if not subject:
        return ImportProblem(where, "subject", "no subject: give the line a subject or --subject")
    if defaults.app_id is None:
        return ImportProblem(where, "app_id", "no app: pass --app for chat files")
    session = _first(known, "session_id", "conversation_id", "thread_id", "id")
    base_time = _time(where, known, ("created_at", "timestamp", "create_time"))
    if isinstance(base_time, ImportProblem):
        return base_time
    conversation = session or "sha256-" + hashlib.sha256(text.strip().encode()).hexdigest()[:16]
    rows: list[InteractionIn] = []
    turn: dict[str, Any] | None = None

    def close_turn() -> ImportProblem | None:
        nonlocal turn
        if turn is None:
            return None
        at = turn.pop("at") or base_time or defaults.occurred_at
        if at is None:
            return ImportProblem(
                where,
                "created_at",
                "no time for this conversation: give it created_at (or each message a "
                "timestamp), or pass --at",
            )
        number = len(rows)
        fields = {
            "subject": subject,
            "app_id": defaults.app_id,
            "agent_id": defaults.agent_id,
            "occurred_at": at,
            "session_id": session or "",
            "source_ref": f"chat:{conversation}:{number}"[:256],
            "purpose": defaults.purpose,
            "sharing": defaults.sharing,
            **turn,
        }
        row = _validated(where, fields, prefix=f"messages[{turn_index}].")
        turn = None
        if isinstance(row, ImportProblem):
            return row
        rows.append(row)
        return None

    turn_index = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return ImportProblem(where, f"messages[{index}]", "must be an object with a role")
        role = message.get("role")
        if role in _CHAT_SKIPPED_ROLES:
            continue
        if role not in ("user", "assistant"):
            return ImportProblem(
                where,
                f"messages[{index}].role",
                f"{repr(role)[:60]} is not user, assistant or system",  # not the whole line
            )
        content = _content(message.get("content"))
        if content is None:
            return ImportProblem(
                where, f"messages[{index}].content", "must be text or a list of text parts"
            )
        when = _time(where, message, ("timestamp", "created_at", "create_time"), index)
        if isinstance(when, ImportProblem):
            return when
        if role == "user" or turn is None:
            problem = close_turn()
            if problem:
                return problem
            turn_index = index
            turn = {"user_input": "", "agent_response": "", "at": when}
        key = "user_input" if role == "user" else "agent_response"
        turn[key] = f"{turn[key]}\n{content}" if turn[key] else content
    problem = close_turn()
    if problem:
        return problem
    if not rows:
        return ImportProblem(where, "messages", "no user or assistant message to capture")
    return ImportRecord(where, tuple(rows))


def _content(value: Any) -> str | None:
    """Message text: a string, or the text parts of a list of content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [
            p.get("text", "")
            for p in value
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        ]
        return "\n".join(p for p in parts if isinstance(p, str))
    return None


def _first(fields: dict[str, Any], *names: str) -> str | None:
    for name in names:
        value = fields.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def _time(
    where: str, fields: dict[str, Any], names: tuple[str, ...], index: int | None = None
) -> datetime | ImportProblem | None:
    """A time given as RFC 3339 with a zone, or as Unix seconds; None when absent."""
    for name in names:
        value = fields.get(name)
        if value is None:
            continue
        field = f"messages[{index}].{name}" if index is not None else name
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return datetime.fromtimestamp(value, tz=UTC)
            except (OverflowError, OSError, ValueError):
                return ImportProblem(where, field, "is not a usable Unix time")
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            except ValueError:
                return ImportProblem(where, field, f"{value[:40]!r} is not an ISO 8601 time")
            if parsed.tzinfo is None:
                return ImportProblem(where, field, "has no timezone (add Z or +hh:mm)")
            return parsed
        return ImportProblem(where, field, "must be an ISO 8601 time or Unix seconds")
    return None


# -------------------------------------------------------------------------- Mem0


def _mem0_document(
    first: tuple[int, str | ImportProblem],
    rest: Iterator[tuple[int, str | ImportProblem]],
    defaults: ImportDefaults,
) -> Iterator[Parsed]:
    """A whole JSON document: a list of memories, or an object with ``results``."""
    parts: list[str] = []
    size = 0
    for number, text in _chain(first, rest):
        if isinstance(text, ImportProblem):
            yield ImportProblem("document", "(file)", f"line {number}: {text.message}")
            return
        size += len(text)
        if size > MAX_DOCUMENT_BYTES:
            yield ImportProblem(
                "document",
                "(file)",
                f"longer than {MAX_DOCUMENT_BYTES} characters: give one memory per line",
            )
            return
        parts.append(text)
    loaded = _load("document", "\n".join(parts))
    if isinstance(loaded, ImportProblem):
        yield loaded
        return
    if isinstance(loaded, dict) and isinstance(loaded.get("results"), list):
        records, label = loaded["results"], "results"
    elif isinstance(loaded, list):
        records, label = loaded, "records"
    else:
        yield ImportProblem("document", "(file)", "must be a list of memories or {results: [...]}")
        return
    for index, record in enumerate(records):
        yield _mem0_record(f"{label}[{index}]", record, defaults)


def _mem0_line(where: str, text: str, defaults: ImportDefaults) -> Parsed:
    loaded = _load(where, text)
    if isinstance(loaded, ImportProblem):
        return loaded
    return _mem0_record(where, loaded, defaults)


def _mem0_record(where: str, record: Any, defaults: ImportDefaults) -> Parsed:
    if not isinstance(record, dict):
        return ImportProblem(where, "(record)", "must be a memory object")
    text = record.get("memory")
    if not isinstance(text, str) or not text.strip():
        return ImportProblem(where, "memory", "must be the memory's text")
    subject = _first(record, "user_id") or defaults.subject
    if not subject:
        return ImportProblem(where, "user_id", "no user_id: give one, or pass --subject")
    if defaults.app_id is None:
        return ImportProblem(where, "app_id", "no app: pass --app for Mem0 files")
    when = _time(where, record, ("created_at",))
    if isinstance(when, ImportProblem):
        return when
    when = when or defaults.occurred_at
    if when is None:
        return ImportProblem(where, "created_at", "no created_at: give one, or pass --at")
    memory_id = _first(record, "id") or (
        "sha256-" + hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    )
    context = {"imported_from": "mem0"}
    for name in ("agent_id", "app_id", "run_id", "hash"):
        if (value := _first(record, name)) is not None:
            context[f"mem0.{name}"] = value
    categories = record.get("categories")
    if isinstance(categories, list) and categories:
        context["mem0.categories"] = ",".join(str(c) for c in categories)
    metadata = record.get("metadata")
    if isinstance(metadata, dict):
        for key, value in metadata.items():
            context[f"mem0.metadata.{key}"] = value if isinstance(value, str) else json.dumps(value)
    elif metadata is not None:
        return ImportProblem(where, "metadata", "must be an object or null")
    if len(context) > _MAX_MEM0_CONTEXT:
        return ImportProblem(
            where, "metadata", f"too many keys (at most {_MAX_MEM0_CONTEXT} with the fields kept)"
        )
    fields = {
        "subject": subject,
        "app_id": defaults.app_id,
        "agent_id": defaults.agent_id,
        "user_input": text,
        "occurred_at": when,
        "session_id": (_first(record, "run_id") or "")[:128],
        "source_ref": f"mem0:{memory_id}"[:256],
        "purpose": defaults.purpose,
        "sharing": defaults.sharing,
        "context": context,
    }
    row = _validated(where, fields)
    return row if isinstance(row, ImportProblem) else ImportRecord(where, (row,))
