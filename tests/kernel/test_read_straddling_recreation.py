"""A read of a subject that was erased, and its name re-created, while the read ran.

docs/security.md left this from the review of 0102: the door reads the profile, then
looks the name up again to record ``subject.read``. When another process erases the
subject and an operator re-creates the name in between, the entry named the *new*
subject's pseudonym for a read of the erased one's data (linking the two incarnations
on the log, which erasure promises nobody can), and the erased subject's data was
served after its erasure's receipt. The read must be refused instead (erasure attacks,
round 3). The other process is a second kernel on the same stores (one per process it
stands for), run inside the window. Both backends.
"""

from __future__ import annotations

import pytest

from domain.errors import SubjectErasedError
from domain.principal import Principal
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    consent,
    erased_and_recreated_while_profile_is_read,
    running,
    say,
    settings_for,
)
from uprof.facade import Facade

CANARY = "Qzxstraddlecanary"


def test_a_read_straddling_an_erasure_and_a_recreation_is_refused(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(backend)
    with running(settings, clock) as k:
        consent(k, "alice")
        k.capture_many("alice", [say(f"I met {CANARY} at the market", ref="a-1")])
        k.process()
        old_pseudonym = k.subjects.find("alice").pseudonym
        new_pseudonyms = erased_and_recreated_while_profile_is_read(k, settings, clock, monkeypatch)
        door = Facade(k, Principal.local_operator(k.subjects.tenant))
        with pytest.raises(SubjectErasedError):
            door.profile("alice")
        assert new_pseudonyms and new_pseudonyms[0] != old_pseudonym
        k.reads.drain()
        reads = [e.entry for e in k.audit_log.entries(action="subject.read")]
        # No read of the erased subject's data is put on the new subject.
        assert not [e for e in reads if e.get("subject_ref") == new_pseudonyms[0]], reads
        assert k.audit_log.verify_integrity() == k.audit_log.size()
