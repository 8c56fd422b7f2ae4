"""What a capture becomes once its consent is withdrawn before it was extracted (I2).

A capture acknowledged under a consent is kept (the words were given under it), but a
withdrawal acknowledged before the worker reached it leaves nothing to extract: items are
made only under a consent in force when they are made. Until 2026-12-04 a withdrawal first
waited for the views, so extraction (in this process, or a worker it waited for) ran ahead
of it and turned the pending captures into attributes and memories after the user had asked
to withdraw; with the worker down or busy it was refused instead (tests/api/
test_withdrawal_pipeline_lag.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from uprof.kernel import Uprof


@pytest.fixture
def second(backend: Backend, clock: FakeClock) -> Iterator[Uprof]:
    """Another process on the same stores: the worker that reaches the capture."""
    k = build_kernel(settings_for(backend), clock)
    try:
        yield k
    finally:
        k.close()


def test_a_capture_not_yet_extracted_yields_nothing_after_the_withdrawal(
    kernel: Uprof, second: Uprof
) -> None:
    grant = consent(kernel)
    kernel.capture("alice", say("I live in Lisbon and I want to learn the piano"))

    kernel.withdraw_consent("alice", grant)
    second.process()  # a worker process reaches the capture after the withdrawal

    view = kernel.profile("alice")
    assert [c.consent_id for c in view.consents if c.withdrawn_at is not None] == [grant]
    assert not view.attributes and not view.memories and not view.intents
    assert kernel.app.load(kernel.stream_of("alice")).capture_count == 1  # the words stay


def test_a_worker_that_already_extracted_keeps_what_it_made_under_the_consent(
    kernel: Uprof, second: Uprof
) -> None:
    """The other side of the line: extracted before the withdrawal, made under consent."""
    grant = consent(kernel)
    kernel.capture("alice", say("I live in Lisbon"))
    second.process()
    kernel.withdraw_consent("alice", grant)
    assert [a.value for a in kernel.profile("alice").attributes] == ["Lisbon"]
