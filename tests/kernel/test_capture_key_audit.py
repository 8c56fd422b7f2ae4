"""A capture's data key is on the log at its creation and at its destruction, as a subject's.

Every captured event is sealed under its own key (item-level shredding), and an event
erasure's receipt cites that key's commitment (``dek_destroyed``, ``key_kind`` capture).
Until 2026-12-05 no entry recorded a capture key: not when it was made, not when an event
erasure destroyed it, so nothing in the log tied the receipt's commitment to a key that
existed (a subject's first key got ``key.created`` and ``key.destroyed`` in decision 0067).
The entries carry the subject's pseudonym and the commitments only: not the capture ids,
not the keys, not what was said; the exported trail still verifies offline. A request's
keys share one ``key.created`` entry (decision 0072: an entry per key cost ~40 % of
batched capture throughput), a further entry per 1,000 keys.
"""

from __future__ import annotations

import asyncio
import io

from audit.check import check_upload
from tests.kernel.conftest import consent, say
from uprof.kernel import Uprof

CAPTURE_KEY = (
    "capture-key"  # uprof.services.capture_writer.CAPTURE_KEY, as docs/audit-format.md names it
)


def key_entries(kernel: Uprof, action: str) -> list[dict[str, object]]:
    return [
        e.entry
        for e in kernel.audit_log.entries()
        if e.entry["action"] == action and e.entry.get("reason_code") == CAPTURE_KEY
    ]


def test_each_capture_key_is_recorded_when_made_and_when_an_event_erasure_destroys_it(
    kernel: Uprof,
) -> None:
    consent(kernel, "alice")
    acks = kernel.capture_many("alice", [say("I drink green tea"), say("I live in Lyon")])
    (third,) = asyncio.run(kernel.capture_async("alice", [say("My dog is Rex")]))  # the writer
    acks.append(third)

    created = key_entries(kernel, "key.created")
    # one entry per request: the batch's two keys, then the writer's one
    assert [len(e["dek_commitments"]) for e in created] == [2, 1]
    made = [c for e in created for c in e["dek_commitments"]]
    assert len(set(made)) == 3
    pseudonym = kernel.audit_subject_ref("alice")
    assert {e["subject_ref"] for e in created} == {pseudonym}

    result = kernel.erase_capture("alice", acks[0].capture_id)

    destroyed = key_entries(kernel, "key.destroyed")
    cited = [
        a["dek_commitment"]
        for a in result.receipt["body"]["actions"]
        if a["type"] == "dek_destroyed"
    ]
    assert len(destroyed) == 1 and cited == [destroyed[0]["dek_commitment"]]
    assert destroyed[0]["dek_commitment"] in made
    assert destroyed[0]["subject_ref"] == pseudonym

    out = io.StringIO()
    kernel.export_audit(out)
    trail = out.getvalue()
    # The key entries name the pseudonym and the commitment (the erasure request names
    # the capture ids it was asked for, as before): no text, no key, no capture id.
    for entry, commitment in [(e, "dek_commitments") for e in created] + [
        (e, "dek_commitment") for e in destroyed
    ]:
        assert set(entry) - {"principal", "request_id"} == {
            "action",
            "tenant",
            "recorded_at",
            "subject_ref",
            "reason_code",
            commitment,
        }
    assert "green tea" not in trail and "Lyon" not in trail
    log = kernel.audit_log
    assert check_upload(trail.encode(), "export", log.public_key, log.origin).ok


def test_a_request_of_more_keys_than_one_entry_lists_is_recorded_in_several(
    kernel: Uprof,
) -> None:
    """1,000 commitments is the allowlist's bound for a list: a 1,001-event request gets
    two entries, and every key it made is on the log exactly once."""
    consent(kernel, "bob")
    acks = kernel.capture_many("bob", [say(f"note {i}") for i in range(1_001)])

    created = key_entries(kernel, "key.created")
    assert [len(e["dek_commitments"]) for e in created] == [1_000, 1]
    made = [c for e in created for c in e["dek_commitments"]]
    assert len(made) == len(set(made)) == len(acks) == 1_001

    result = kernel.erase_capture("bob", acks[-1].capture_id)
    (cited,) = [
        a["dek_commitment"]
        for a in result.receipt["body"]["actions"]
        if a["type"] == "dek_destroyed"
    ]
    assert cited in made
