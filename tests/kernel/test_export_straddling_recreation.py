"""Review of 0119 (bug CV): an export of a subject that was erased, and its name
re-created, while the export was read.

BY (decision 0119) made the door's recorded reads check that the name still stands for
the stream read; ``export_subject`` records its own entry (``subject.exported``) and
looked the pseudonym up again at that moment: with an erasure in another process and
``uprof subjects recreate`` in between, the export of the erased subject's data was
answered after its erasure's receipt and its entry named the *new* subject's
pseudonym, linking the two incarnations on the log. It must be refused instead. The
other process is a second kernel on the same stores, run inside the window. Both
backends.
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

CANARY = "Qzxexportstraddlecanary"


def test_an_export_straddling_an_erasure_and_a_recreation_is_refused(
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
            door.export_subject("alice")
        assert new_pseudonyms and new_pseudonyms[0] != old_pseudonym
        exported = [e.entry for e in k.audit_log.entries(action="subject.exported")]
        # No export of the erased subject's data is put on the new subject.
        assert not [e for e in exported if e.get("subject_ref") == new_pseudonyms[0]], exported
        assert k.audit_log.verify_integrity() == k.audit_log.size()
