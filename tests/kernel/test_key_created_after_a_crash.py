"""A subject's first data key whose ``key.created`` entry a crash kept off the log.

``SubjectResolver.find_or_create`` commits the new key, then appends its ``key.created``
entry: a process killed (or an audit append failing) between the two leaves a key the
log never recorded as made. The retry finds the subject and writes nothing, so the
subject's consents and captures are sealed under a key with no creation entry, and its
erasure's ``key.destroyed`` cited a commitment no ``key.created`` named, which
docs/audit-format.md says an auditor finds "earlier" on the log (failed on 2e7a174, both
backends). Now the erasure writes the missing ``key.created`` before the ``key.destroyed``
(``reason_code`` recorded-at-erasure), and only when the log lacks it.
"""

from __future__ import annotations

import pytest

from domain.errors import StoreBusyError
from tests.kernel.conftest import consent
from uprof.kernel import Uprof


def test_a_destroyed_subject_key_always_has_a_key_created_entry(
    kernel: Uprof, monkeypatch: pytest.MonkeyPatch
) -> None:
    trail = kernel.consent_service._audit
    record = trail.record

    def dies_at_key_created(action: str, **fields: object) -> None:
        if action == "key.created":
            monkeypatch.setattr(trail, "record", record)
            raise StoreBusyError("the process is killed here")  # after the key committed
        record(action, **fields)

    monkeypatch.setattr(trail, "record", dies_at_key_created)
    with pytest.raises(StoreBusyError):
        consent(kernel, "alice")
    consent(kernel, "alice")  # the retry
    kernel.erase_subject("alice")

    entries = [e.entry for e in kernel.audit_log.entries()]
    destroyed = {e["dek_commitment"] for e in entries if e["action"] == "key.destroyed"}
    created = {e.get("dek_commitment") for e in entries if e["action"] == "key.created"}
    assert destroyed and destroyed <= created
    late = [e for e in entries if e.get("reason_code") == "recorded-at-erasure"]
    assert [e["dek_commitment"] for e in late] == sorted(destroyed)


def test_an_erasure_writes_no_second_key_created_when_the_first_is_on_the_log(
    kernel: Uprof,
) -> None:
    consent(kernel, "alice")
    kernel.erase_subject("alice")
    entries = [e.entry for e in kernel.audit_log.entries()]
    assert [e.get("reason_code") for e in entries if e["action"] == "key.created"] == [None]
