"""Two processes erasing one subject at once (SQLite and PostgreSQL, real processes;
decision 0127-review-of-0121, held).

Decision 0121 left this as a product question: two requests, two receipts. Attacked
here with both processes past the erasure's own lookup of the subject before either
records anything: both requests finish and both receipts cite the same tombstone (the
later one may cite no destroyed key: bug EW, not fixed), or (seen in 1 or 2 of 6 runs,
SQLite) the later one finds the stream shredded when it appends its tombstone and
answers "erased". Left (decision
0127-review-of-0121): that request's ``erasure.requested`` entry then has no outcome.
"""

from __future__ import annotations

from typing import Any

from tests import children
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import build_kernel, consent, settings_for
from tests.kernel.review121_child import erase_at_once


def _cited(body: dict[str, Any]) -> tuple[Any, ...]:
    actions = body["actions"]
    tombstones = [
        (a["stream"], a["notification_id"]) for a in actions if a["type"] == "tombstone_appended"
    ]
    keys = sorted(a["dek_commitment"] for a in actions if a["type"] == "dek_destroyed")
    return tuple(tombstones), tuple(keys)


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
    receipts = [body for kind, body in answers if kind == "ok"]
    refused = [text for kind, text in answers if kind == "error"]
    # Both finish, or the later one finds the stream already shredded when it appends
    # its tombstone and is told the subject is erased (410): never a storage error, never
    # two receipts citing different tombstones or different keys.
    assert receipts, answers
    assert all(text.startswith("SubjectErasedError") for text in refused), answers
    cited = [_cited(body) for body in receipts]
    assert len({tombstones for tombstones, _ in cited}) == 1, cited
    ((tombstone,), _), *_ = cited
    assert tombstone[1] > 0
    keys = {key for _, keys in cited for key in keys}
    assert len(keys) == 1, cited
    if len(receipts) == 2:
        first, second = receipts
        assert first["request"]["request_id"] != second["request"]["request_id"]
        # Not asserted: that both cite the destroyed key. Seen in the clean-clone CI of
        # 2026-12-05 (both backends): when the other process destroyed the keys before
        # this one previewed them, this receipt cites no key at all (bug EW, not fixed:
        # docs/reliability.md). At least one receipt cites it (above).
