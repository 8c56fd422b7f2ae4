"""A process's log handler follows ``sys.stderr`` (uprof/logs.py, ``uprof worker``).

A command run inside a host that swaps and closes ``sys.stderr`` (click's test runner,
an application embedding the CLI) once left a handler on the closed stream: every later
log line failed, and the failure report ended up in the next command's output.
"""

from __future__ import annotations

import io
import logging
import sys
import uuid
from collections.abc import Iterator

import pytest

from uprof.logs import configure_process_logging


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_lines_go_to_the_current_stderr_after_the_first_one_is_closed(
    root_logging: None, monkeypatch: pytest.MonkeyPatch, log_format: str
) -> None:
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_process_logging("info", log_format)  # type: ignore[arg-type]
    # Fresh logger names: a server started earlier in this process may have configured
    # (or disabled) the named ones; these propagate to the root as any library's do.
    first_logger = logging.getLogger(f"process-logging-test.{uuid.uuid4().hex}")
    first_logger.info("while the first stream is open")
    assert "while the first stream is open" in first.getvalue()
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger(f"process-logging-test.{uuid.uuid4().hex}").info(
        "after the first stream closed"
    )
    written = second.getvalue()
    assert "after the first stream closed" in written
    assert "Logging error" not in written and "closed file" not in written
