"""Review of decision 0181 (text no store keeps, refused naming its field at every door):
``uprof capture``'s own options, on SQLite and PostgreSQL (bug NT)."""

from __future__ import annotations

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, running, settings_for

BASE = ["capture", "--subject", "alice", "--app", "planner", "--agent", "a", "--text", "hi"]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--text", "hel\udcfflo"),  # a byte that is not UTF-8 on the command line
        ("--agent", "a\udcff"),
        ("--session", "s\udcff"),
        ("--source-ref", "r\udcff"),
        ("--session", "s" * 300),  # longer than a session id may be
    ],
    ids=["text", "agent", "session", "source-ref", "session-long"],
)
def test_capture_refuses_a_bad_option_naming_it(
    backend: Backend, clock: FakeClock, option: str, value: str
) -> None:
    """Bug NT: ``uprof capture`` built its request (``InteractionIn``) from its options
    unguarded: a value the request refuses (a byte that is not UTF-8, which Python reads
    as a lone surrogate; a session id over its length) raised pydantic's
    ``ValidationError`` as a traceback, exit 1, naming the schema's field
    (``user_input``), not the option. Now bad input, exit 2, naming the option; nothing
    is captured."""
    from tests.kernel.test_admin_audit import cli_for

    settings = settings_for(backend)
    with running(settings, clock) as k:
        consent(k)
        before = k.audit_log.size()
    run = cli_for(backend)
    # Given last: an option given twice takes its last value.
    args = [*BASE, option, value]
    said = " ".join(run(*args, code=2).split())
    assert option in said, said
    assert "Traceback" not in said and "ValidationError" not in said, said
    with running(settings, clock) as k:
        assert k.audit_log.size() == before
