"""Review of 0119, held: ``append_subject_tombstone`` (BX) reads only the newest stored
event's topic and version, then saves the tombstone at the next version. Another
process that captures for the subject between that read and the save must not be lost
under the tombstone nor survive it: the save's version check refuses the stale
tombstone, the erasure reads the head again and appends after the capture, and the
capture is shredded with the rest (its canary nowhere, the receipt verifies). The other
process is a second kernel on the same stores, run inside the window. Both backends.
"""

from __future__ import annotations

from typing import Any

import pytest

from audit.receipts import verify_receipt
from domain.errors import SubjectErasedError
from domain.profile import SubjectProfile
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, running, say, settings_for
from uprof.eventstore import topic_of

CANARY, LATE = "Qzxtombfirstcanary", "Qzxtomblatecanary"


def test_a_capture_between_the_tombstones_read_and_its_save_is_shredded_with_it(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(backend)
    with running(settings, clock) as k:
        consent(k, "alice")
        consent(k, "bob")
        k.capture_many("alice", [say(f"I met {CANARY} at the market", ref="a-1")])
        k.capture_many("bob", [say("I met Bert at the market", ref="b-1")])
        k.process()
        stream = k.stream_of("alice")
        recorder = k.app.recorder
        select = recorder.select_events
        wrote: list[int] = []

        def newest_then_a_capture_elsewhere(*args: Any, **kwargs: Any) -> Any:
            rows = select(*args, **kwargs)
            if kwargs.get("desc") and not wrote:
                with running(settings, clock) as other:  # another process, in the window
                    other.capture_many("alice", [say(f"I met {LATE} later", ref="a-2")])
                wrote.append(rows[-1].originator_version)
            return rows

        monkeypatch.setattr(recorder, "select_events", newest_then_a_capture_elsewhere)
        result = k.erase_subject("alice")
        monkeypatch.undo()
        assert wrote, "the window was not reached"
        verify_receipt(result.receipt, k.audit_log.public_key, origin=k.audit_log.origin)
        stored = k.app.recorder.select_events(stream)
        erased = [s for s in stored if s.topic == topic_of(SubjectProfile.SubjectErased)]
        # One tombstone, the newest event, after the capture made in the window.
        assert len(erased) == 1 and stored[-1] is erased[0]
        assert erased[0].originator_version == wrote[0] + 2
        with pytest.raises(SubjectErasedError):
            k.profile("alice")
        assert k.residue_scan([CANARY, LATE, "alice"]).clean
        assert k.profile("bob").memories
        assert k.audit_log.verify_integrity() == k.audit_log.size()
