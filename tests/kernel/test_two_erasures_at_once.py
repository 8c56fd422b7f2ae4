"""Two processes erasing one subject at once (SQLite and PostgreSQL, real processes;
decision 0127-review-of-0121, then 0131-simultaneous-erasure-receipts).

Both processes are past the erasure's own lookup of the subject before either records
anything. Both requests finish, each with a receipt citing the one tombstone and the
destroyed key, both verifiable offline with the public key alone: a request that finds
the tombstone, or the key destruction, already written by the other request cites that
request's (``by_request``) instead of citing nothing (bug EW) or being refused with its
``erasure.requested`` entry left without an outcome (bug EY).
"""

from __future__ import annotations

from typing import Any

from audit.receipts import verify_receipt
from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, settings_for
from tests.kernel.review121_child import erase_at_once
from uprof.kernel import Uprof


def cited(body: dict[str, Any]) -> tuple[Any, ...]:
    """(tombstones, destroyed keys) a receipt body cites, without who did them."""
    actions = body["actions"]
    tombstones = [
        (a["stream"], a["notification_id"]) for a in actions if a["type"] == "tombstone_appended"
    ]
    keys = sorted(
        (a["key_version"], a["dek_commitment"]) for a in actions if a["type"] == "dek_destroyed"
    )
    return tuple(tombstones), tuple(keys)


def outcomes_of_every_request(kernel: Uprof) -> dict[str, list[str]]:
    """Each ``erasure.requested`` entry's request id -> the outcome entries naming it."""
    requested = [
        e.entry["request_id"] for e in kernel.audit_log.entries(action="erasure.requested")
    ]
    found: dict[str, list[str]] = {r: [] for r in requested}
    for action in ("projection.purged", "erasure.refused", "erasure.failed", "erasure.abandoned"):
        for e in kernel.audit_log.entries(action=action):
            if e.entry.get("request_id") in found:
                found[e.entry["request_id"]].append(action)
    return found


def test_two_erasures_of_one_subject_at_once_give_two_receipts_citing_the_same_destruction(
    backend: Backend,
) -> None:
    settings = settings_for(backend)
    setup = build_kernel(settings, FakeClock())
    try:
        consent(setup, "alice")
    finally:
        setup.close()
    ctx = children.CONTEXT
    barrier, out = ctx.Barrier(2), ctx.Queue()
    racers = [
        ctx.Process(target=erase_at_once, args=(settings, "alice", barrier, out)) for _ in range(2)
    ]
    for p in racers:
        p.start()
    answers = [out.get(timeout=120) for _ in racers]
    for p in racers:
        p.join(60)
        assert p.exitcode == 0
    # Both asked before either recorded anything: both are answered with a receipt (the
    # later one absorbed into the earlier one's erasure), never an error.
    assert [kind for kind, _ in answers] == ["ok", "ok"], answers
    first, second = (receipt for _, receipt in answers)
    assert first["body"]["request"]["request_id"] != second["body"]["request"]["request_id"]
    # One tombstone and the one destroyed key, cited by both receipts.
    assert cited(first["body"]) == cited(second["body"]), (first["body"], second["body"])
    (tombstones, keys) = cited(first["body"])
    assert len(tombstones) == 1 and tombstones[0][1] > 0, first["body"]
    assert len(keys) == 1, (first["body"], second["body"])
    after = build_kernel(settings, FakeClock())
    try:
        for receipt in (first, second):
            # An auditor holding only this receipt and the public key.
            verify_receipt(receipt, after.audit_log.public_key, origin=after.audit_log.origin)
        outcomes = outcomes_of_every_request(after)
    finally:
        after.close()
    assert len(outcomes) == 2 and all(outcomes.values()), outcomes
