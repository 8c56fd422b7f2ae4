"""Attack review of decision 0152-erasure-leftovers (decision XXXX-review-of-0152).

Bug JU: the history read (``profile(as_of=...)``) did not ask the ledger first, so an
item erasure killed after its ledger record (bug IP's window) stayed served there.
Bug JV: a history read at a time before an item erasure served the erased item, after
its receipt too: the replay skipped the erasure's ``ItemsErased`` as "later".
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, say, settings_for
from tests.kernel.test_erasure_leftovers import _killed_after_record
from tests.kernel.test_erasure_resume_attacks import SAIL


def test_a_history_read_does_not_serve_an_item_whose_erasure_was_killed(
    backend: Backend, clock: FakeClock
) -> None:
    """JU: a real child SIGKILLed right after the item erasure's ledger record, beside a
    running process whose history read (as of tomorrow) must not list the item."""
    settings = settings_for(backend)
    running = build_kernel(settings, clock)
    try:
        consent(running)
        running.capture("alice", say(f"I want to learn to {SAIL}", ref="sail"))
        running.process()
        (intent,) = running.profile("alice").intents
        _killed_after_record(settings, "item", intent.item_id)
        later = datetime.now(UTC) + timedelta(days=1)
        then = running.profile("alice", as_of=later)
        assert [i.item_id for i in then.intents] == [], then.intents
        assert running.profile("alice").intents == ()
    finally:
        running.close()


def test_a_history_read_from_before_an_item_erasure_does_not_serve_the_item(
    backend: Backend, clock: FakeClock
) -> None:
    """JV: the item erasure completed (receipt issued); a history read at a time before
    it must not bring the erased item back."""
    settings = settings_for(backend)
    kernel = build_kernel(settings, clock)
    try:
        consent(kernel)
        kernel.capture("alice", say(f"I want to learn to {SAIL}", ref="sail"))
        kernel.capture("alice", say("I live in Porto", ref="porto"))
        kernel.process()
        view = kernel.profile("alice")
        (intent,) = view.intents
        kept = sorted(a.item_id for a in view.attributes)
        before = datetime.now(UTC)
        assert kernel.erase_item("alice", intent.item_id).receipt
        then = kernel.profile("alice", as_of=before)
        assert [i.item_id for i in then.intents] == [], then.intents
        # The rest of the history is still there.
        assert sorted(a.item_id for a in then.attributes) == kept
    finally:
        kernel.close()
