"""A capture dated at the end of the calendar does not stop the pipeline for everyone.

Found in a hostile-caller review (2026-12-05): REST, MCP and import accept any instant the
calendar holds, ``9999-12-31T23:00:00Z`` included. The rule-based extractor reads a plan's
deadline relative to the capture's time ("next week", "in 3 days", "next Monday"), and
that date fell off the calendar: ``OverflowError`` in the extractor, for every attempt. The
extraction position never passed the capture, so no capture after it, of any subject and
any app, was extracted again: on the code before the fix ``process()`` raised for bob's
"I am vegetarian" too and four captures stayed pending (SQLite and PostgreSQL). One app
holding a consent of one subject, its own made-up user included, could halt extraction
for the whole deployment.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, say, settings_for
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.extraction.temporal import find_deadline
from uprof.bootstrap import bootstrap
from uprof.kernel import Uprof

END = datetime(9999, 12, 31, 23, tzinfo=UTC)
PLANS = (
    "I plan to visit Rome next week",
    "I need to renew my passport in 3 days",
    "My dentist appointment is next Monday",
    "I will finish the report by the end of the month",
)


@pytest.fixture
def rules_kernel(backend: Backend) -> Iterator[Uprof]:
    """The deployment's own extractor (rules), not the tests' fake."""
    k = bootstrap(settings_for(backend), clock=FakeClock(), embedder=HashingEmbedder())
    try:
        yield k
    finally:
        k.close()


def test_a_plan_dated_at_the_end_of_the_calendar_leaves_the_pipeline_running(
    rules_kernel: Uprof,
) -> None:
    k = rules_kernel
    for subject in ("mallory", "bob"):
        k.grant_consent(subject, app_id=APP, categories=["*"], purposes=["personalization"])
    for text in PLANS:
        k.capture("mallory", replace(say(text), occurred_at=END))
    k.capture("bob", say("I am vegetarian"))

    k.process()

    assert k.lag().extraction_pending == 0
    assert [a.value for a in k.profile("bob").attributes if a.key == "diet"] == ["vegetarian"]


def test_a_deadline_past_the_calendar_is_no_deadline() -> None:
    for text in PLANS:
        assert find_deadline(text, END) is None, text
    # Within the calendar it is read as before.
    found = find_deadline("next week", datetime(2026, 12, 5, tzinfo=UTC))
    assert found is not None and found.expires_at == datetime(2026, 12, 14, tzinfo=UTC)
