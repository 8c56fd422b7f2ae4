"""Log lines as text (default) or one JSON object per line (``UPROF_LOG_FORMAT=json``).

Standard library only: uprof's own loggers, uvicorn's (its access log included) and the
libraries' go through ``JsonFormatter`` when a server or worker is started with the JSON
format. A line carries the time (UTC), level, logger and message; the access log's fields
(method, path without its query string, status); the trace and span ids when tracing is
on, so a log line finds its trace; and for an error its class and traceback.

What a message holds is decided where it is logged, and no uprof log call passes captured
text, a subject reference, a session id or a source ref (tests/api/test_identifier_logs.py
captures, extracts, slices and erases with canaries in all four and finds none in the
lines at DEBUG). The formatter adds nothing a caller sent.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

from uprof import telemetry

LogFormat = Literal["text", "json"]

#: The text format of a worker's lines (uvicorn keeps its own for servers).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

# pycasbin logs its model at INFO whenever an enforcer loads and every denied request at
# WARNING: deny by default makes one slice a dozen lines. Every long-running process
# (the servers through uprof.api.logconfig, the worker here) holds it at this level.
CASBIN_LOG_LEVEL = "ERROR"


class JsonFormatter(logging.Formatter):
    """Format a record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        access = _access_fields(record)
        if access:
            entry["http"] = access
        ids = telemetry.current_ids()
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        if record.exc_info and record.exc_info[0] is not None:
            entry["error"] = record.exc_info[0].__name__
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def _access_fields(record: logging.LogRecord) -> dict[str, Any] | None:
    """uvicorn's access record (args: client, method, path, HTTP version, status) as fields.

    The path arrives without its query string: ``DropQueryString`` sits on the logger.
    """
    args = record.args
    if record.name != "uvicorn.access" or not isinstance(args, tuple) or len(args) != 5:
        return None
    client, method, path, version, status = args
    return {
        "client": client,
        "method": method,
        "path": path,
        "version": version,
        "status": status,
    }


class CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes to whatever ``sys.stderr`` is when a line is emitted.

    A plain ``StreamHandler()`` keeps the stream it was created with. When the command runs
    inside a host that swaps ``sys.stderr`` (a test runner, an embedding application) and
    later closes that stream, every later line would fail with "I/O operation on closed
    file" and the failure report lands in the host's next output.
    """

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:  # the base class assigns it in __init__
        pass


def configure_process_logging(level: str, log_format: LogFormat) -> None:
    """Send every logger's lines to stderr in the chosen format (``uprof worker``)."""
    handler = CurrentStderrHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("casbin").setLevel(CASBIN_LOG_LEVEL)
