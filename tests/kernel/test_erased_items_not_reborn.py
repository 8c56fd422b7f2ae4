"""An item erased without its evidence is not born again from the same captures.

``erase_item`` (no evidence shredded) destroys no key: after a restore of a backup taken
before the item's capture was extracted, the pipeline extracted the capture again and the
item came back under a new random id that no erasure ledger record named; an app
proposing it again citing the same capture did the same without any backup. The ledger's
``items`` record now carries a keyed fingerprint per (capture, kind, identity), and the
update engine drops a proposal an erasure took (decision 0097-erased-items-not-reborn).
Both backends; real processes where several processes matter.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from domain.errors import SubjectErasedError
from domain.values import AttributeProposal, IntentProposal, MemoryProposal, ProposalBatch
from projections.profile import tables as t
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import (
    APP,
    build_kernel,
    consent,
    other_tenant,
    running,
    say,
    settings_for,
)
from tests.kernel.other_process import run_in_another_process
from uprof.kernel import Uprof
from uprof.services.backup import backup, restore
from uprof.services.erased_items import REBIRTH_REFUSED
from uprof.settings import Settings

SAIL = "I live in Paris and I want to learn to sail"


def rows(kernel: Uprof, table: sa.Table) -> int:
    with kernel.views_engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def items_of(kernel: Uprof, subject: str = "alice") -> dict[str, list[str]]:
    p = kernel.profile(subject)
    return {
        "attribute": sorted(f"{a.key}={a.value}" for a in p.attributes),
        "intent": sorted(i.description for i in p.intents),
        "memory": sorted(m.text for m in p.memories),
    }


def item_id_of(kernel: Uprof, kind: str, subject: str = "alice") -> str:
    p = kernel.profile(subject)
    found = {"attribute": p.attributes, "intent": p.intents, "memory": p.memories}[kind]
    (item,) = found
    return str(item.item_id)


def refusals(kernel: Uprof) -> list[dict[str, object]]:
    return [e.entry for e in kernel.audit_log.entries(action=REBIRTH_REFUSED)]


def captured_then_backed_up(settings: Settings, clock: FakeClock, bk: Path, *texts: str) -> None:
    """Alice's captures, in the log only (not extracted), and a backup of that."""
    with running(settings, clock) as kernel:
        consent(kernel)
        for n, text in enumerate(texts):
            kernel.capture("alice", say(text, ref=f"r{n}"))
    backup(settings, bk)


def erase_after_extraction(settings: Settings, clock: FakeClock, kind: str) -> dict[str, list[str]]:
    """Extract, erase the one item of ``kind`` (evidence kept); what is left."""
    with running(settings, clock) as kernel:
        kernel.process()
        kernel.erase_item("alice", item_id_of(kernel, kind))
        kernel.process()
        return items_of(kernel)


@pytest.mark.parametrize("kind", ["attribute", "intent", "memory"])
def test_each_kind_erased_stays_erased_and_only_it(
    backend: Backend, clock: FakeClock, tmp_path: Path, kind: str
) -> None:
    settings = settings_for(backend)
    captured_then_backed_up(settings, clock, tmp_path / "bk", SAIL)
    left = erase_after_extraction(settings, clock, kind)
    assert left[kind] == []

    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        # The erased item is not reborn; its siblings from the same capture are back.
        assert items_of(kernel) == left
        assert all(left[k] for k in left if k != kind)
        [entry] = refusals(kernel)
        assert entry["counts"] == {kind: 1}
        assert entry["reason_code"] == "erased-item"
        assert entry["subject_ref"] == kernel.subjects.pseudonym("alice")
        assert "sail" not in json.dumps(entry) and "Paris" not in json.dumps(entry)


def test_an_item_merged_from_several_captures_stays_erased_and_is_said_anew_later(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Two captures proposed one intent (evidence: both). Erased, then restored to before
    either was extracted: neither capture brings it back. The subject saying it again in
    a capture made after the erasure is new data: that one is kept."""
    settings = settings_for(backend)
    said = "I want to learn to sail"
    captured_then_backed_up(settings, clock, tmp_path / "bk", said, f"Again: {said}")
    with running(settings, clock) as kernel:
        kernel.process()
        (intent,) = kernel.profile("alice").intents
        assert len(kernel.evidence("alice", intent.item_id).captures) == 2
        kernel.erase_item("alice", intent.item_id)

    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        assert kernel.profile("alice").intents == ()
        kernel.capture("alice", say(f"Still: {said}", ref="later"))
        kernel.process()
        assert [i.description for i in kernel.profile("alice").intents] == ["learn to sail"]


def test_a_backup_with_one_of_two_captures_extracted(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The backup's log holds the intent from the first capture (re-erased by id at the
    start) and the second capture unextracted: extracted after the start's re-erasure, it
    would have recorded the intent anew (the aggregate no longer held one to reinforce)."""
    settings = settings_for(backend)
    said = "I want to learn to sail"
    with running(settings, clock) as kernel:
        consent(kernel)
        kernel.capture("alice", say(said, ref="one"))
        kernel.process()
        kernel.capture("alice", say(f"Again: {said}", ref="two"))
    backup(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        (intent,) = kernel.profile("alice").intents
        kernel.erase_item("alice", intent.item_id)

    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        assert kernel.profile("alice").intents == ()
        assert rows(kernel, t.intents) == 0


def test_a_conflict_keeps_the_value_not_erased(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    captured_then_backed_up(settings, clock, tmp_path / "bk", "I live in Paris", "I live in Berlin")
    with running(settings, clock) as kernel:
        kernel.process()
        homes = {a.value: a for a in kernel.profile("alice").attributes}
        assert set(homes) == {"Paris", "Berlin"}
        assert {a.status for a in homes.values()} == {"conflicting"}
        kernel.erase_item("alice", homes["Paris"].item_id)

    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        assert [a.value for a in kernel.profile("alice").attributes] == ["Berlin"]


def test_other_subjects_and_other_tenants_saying_the_same_keep_it(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    # The other tenant's policy lets the app capture (the worker decides its captures by
    # it since the review of 2026-12-05; before, by the worker's tenant's).
    other = other_tenant(settings, tmp_path)
    with running(settings, clock) as kernel:
        consent(kernel)
        consent(kernel, "bob")
        kernel.capture("alice", say(SAIL))
        kernel.capture("bob", say(SAIL))
    with running(other, clock) as kernel:
        consent(kernel)
        kernel.capture("alice", say(SAIL))
    backup(settings, tmp_path / "bk")
    erase_after_extraction(settings, clock, "intent")

    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        assert kernel.profile("alice").intents == ()
        assert [i.description for i in kernel.profile("bob").intents] == ["learn to sail"]
    with running(other, clock) as kernel:
        kernel.process()
        assert [i.description for i in kernel.profile("alice").intents] == ["learn to sail"]


def test_a_subject_erased_after_its_item_stays_erased(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    settings = settings_for(backend)
    captured_then_backed_up(settings, clock, tmp_path / "bk", SAIL)
    erase_after_extraction(settings, clock, "intent")
    with running(settings, clock) as kernel:
        kernel.erase_subject("alice")

    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        with pytest.raises(SubjectErasedError):
            kernel.profile("alice")
        assert rows(kernel, t.intents) == rows(kernel, t.attributes) == 0


def test_an_app_proposing_the_erased_item_again_from_its_capture_is_refused(
    backend: Backend, clock: FakeClock
) -> None:
    """No backup needed: an app citing the erased item's capture again (the capture is
    kept: only the item was erased) recorded it anew under a new id. The same item from
    a capture made after the erasure is new data, and kept."""
    with running(settings_for(backend), clock) as kernel:
        consent(kernel)
        first = kernel.capture("alice", say(SAIL, ref="one")).capture_id
        kernel.process()
        kernel.erase_item("alice", item_id_of(kernel, "intent"))
        kernel.erase_item("alice", item_id_of(kernel, "attribute"))

        def again(capture_id: str) -> int:
            return kernel.submit_proposals(
                "alice",
                ProposalBatch(
                    (
                        IntentProposal("Learn to sail", (capture_id,)),
                        AttributeProposal("home_location", "paris", (capture_id,)),
                        MemoryProposal("sailing lessons booked", evidence=(capture_id,)),
                    ),
                    author="app",
                    owner_agent="agent:one",
                    sharing="shared",
                    app_id=APP,
                    purpose="personalization",
                ),
            )

        assert again(first) == 1  # the memory only: a new one
        kernel.process()
        left = items_of(kernel)
        assert left["intent"] == [] and left["attribute"] == []
        assert "sailing lessons booked" in left["memory"]
        assert refusals(kernel)[-1]["counts"] == {"attribute": 1, "intent": 1}

        later = kernel.capture("alice", say("Nothing new", ref="two")).capture_id
        kernel.process()
        assert again(later) == 3
        kernel.process()
        assert items_of(kernel)["intent"] == ["Learn to sail"]


def test_two_processes_extracting_after_the_restore_reborn_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Two real processes extract the restored log at once: whichever commits the batch,
    its update engine dropped the erased item; the other's save loses the race."""
    settings = settings_for(backend)
    texts = [SAIL] + [f"note {i}" for i in range(30)]
    captured_then_backed_up(settings, clock, tmp_path / "bk", *texts)
    erase_after_extraction(settings, clock, "intent")
    restore(settings, tmp_path / "bk")
    build_kernel(settings, clock).close()  # the start re-applies the ledger once

    # Each process decides the batch, then waits before its save until the other has
    # decided it too: both decided the same captures, only one save commits (the other
    # loses on the position or on the subject's version, and redoes from what the first
    # committed).
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    body = f"""
    import time
    save = kernel.app.save_tracked
    def save_when_both_decided(*args, **kwargs):
        if not getattr(save_when_both_decided, "done", False):
            save_when_both_decided.done = True
            Path({str(barrier)!r}, str(os.getpid())).touch()
            deadline = time.monotonic() + 60
            while len(list(Path({str(barrier)!r}).iterdir())) < 2:
                assert time.monotonic() < deadline, "the other process never decided"
                time.sleep(0.05)
        return save(*args, **kwargs)
    kernel.app.save_tracked = save_when_both_decided
    kernel.process()
    print(json.dumps(kernel.extraction.moved_conflicts))
    """
    results: list[int] = []

    def one() -> None:
        done = run_in_another_process(backend, body)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(int(done.stdout.strip().splitlines()[-1]))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(results) == 2
    assert len(list(barrier.iterdir())) == 2  # both decided the batch before a save
    with running(settings, clock) as kernel:
        kernel.process()
        assert kernel.profile("alice").intents == ()
        assert rows(kernel, t.intents) == 0
        assert len(kernel.profile("alice").memories) == len(texts)  # each once
        assert sum(e["counts"]["intent"] for e in refusals(kernel)) == 1  # type: ignore[index]


@pytest.mark.parametrize("dies_at", ["kernel.app.save_tracked", "erased_items.recorded"])
def test_a_process_killed_around_the_save_reborn_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path, dies_at: str
) -> None:
    """kill -9 before the batch's save (nothing committed: the next process extracts it
    again and drops the item again) or after it, before the refusal's audit entry (the
    item is not born; that entry is lost, as the decision says)."""
    settings = settings_for(backend)
    captured_then_backed_up(settings, clock, tmp_path / "bk", SAIL)
    erase_after_extraction(settings, clock, "intent")
    restore(settings, tmp_path / "bk")
    owner, name = dies_at.rsplit(".", 1)
    if owner == "erased_items":
        owner = "kernel.extraction._erased_items"
    done = run_in_another_process(
        backend,
        f"""
        setattr({owner}, {name!r}, lambda *args, **kwargs: os._exit(9))
        kernel.process()
        """,
    )
    assert done.returncode == 9, done.stderr[-3000:]
    with running(settings, clock) as kernel:
        kernel.process()
        assert kernel.profile("alice").intents == ()
        assert rows(kernel, t.intents) == 0
        expected = 1 if dies_at == "kernel.app.save_tracked" else 0
        assert len(refusals(kernel)) == expected


def test_a_quarantine_retry_after_the_restore_reborn_nothing(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The backup holds the capture quarantined; the operator's retry extracted it and
    the intent was erased; after the restore the capture is quarantined again, and the
    operator's retry (same path) must not bring the intent back."""
    from tests.fakes.ports import FakeExtractor
    from tests.kernel.poison import MARK, PoisonExtractor
    from uprof.adapters.embeddings import HashingEmbedder
    from uprof.bootstrap import bootstrap

    settings = settings_for(backend)
    extractor = PoisonExtractor(FakeExtractor())

    def start() -> Uprof:
        return bootstrap(settings, clock=clock, embedder=HashingEmbedder(), extractor=extractor)

    kernel = start()
    try:
        consent(kernel)
        poison = kernel.capture("alice", say(f"{MARK} I want to learn to sail")).capture_id
        kernel.process()
        assert [q.capture_id for q in kernel.quarantined()] == [poison]
    finally:
        kernel.close()
    backup(settings, tmp_path / "bk")
    extractor.poisoned = False
    kernel = start()
    try:
        [outcome] = kernel.retry_quarantined([poison])
        assert outcome.outcome == "released"
        kernel.process()
        (intent,) = kernel.profile("alice").intents
        kernel.erase_item("alice", intent.item_id)
    finally:
        kernel.close()

    restore(settings, tmp_path / "bk")
    kernel = start()
    try:
        kernel.process()
        [outcome] = kernel.retry_quarantined([poison])
        assert outcome.outcome == "released"
        kernel.process()
        assert kernel.profile("alice").intents == ()
        assert [e["counts"] for e in refusals(kernel)] == [{"intent": 1}]
    finally:
        kernel.close()


def test_the_ledger_names_no_erased_value(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """The fingerprints are keyed: the key folder's ledger holds neither the value nor an
    unkeyed hash of it."""
    import hashlib

    settings = settings_for(backend)
    captured_then_backed_up(settings, clock, tmp_path / "bk", SAIL)
    erase_after_extraction(settings, clock, "intent")
    with running(settings, clock) as kernel:
        ledger = kernel.keystore.ledger
        assert ledger is not None
        [record] = [r for r in ledger._store.erasure_records() if r.kind == "items"]
        assert record.fingerprints
        text = json.dumps(record.__dict__)
        for needle in ("sail", "learn to sail", hashlib.sha256(b"learn to sail").hexdigest()):
            assert needle not in text


def test_an_item_erased_before_fingerprints_gets_them_at_the_next_start(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Ledger records written before this change name the item's id only. The next start
    adds its fingerprints from the stream's events (once), and a restore of data that had
    not extracted its capture then keeps it erased."""
    from uprof.crypto.keydir import LEDGER_FILE

    settings = settings_for(backend)
    captured_then_backed_up(settings, clock, tmp_path / "bk", SAIL, f"Again: {SAIL}")
    erase_after_extraction(settings, clock, "intent")
    with running(settings, clock) as kernel:
        path = Path(kernel.keystore.ledger._store.path) / LEDGER_FILE  # type: ignore[union-attr, attr-defined]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        line.pop("fingerprints", None)  # as an older uprof wrote it
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    with running(settings, clock) as kernel:
        ledger = kernel.keystore.ledger
        assert ledger is not None
        items = [r for r in ledger._store.erasure_records() if r.kind == "items"]  # type: ignore[attr-defined]
        assert [bool(r.fingerprints) for r in items] == [False, True]
        assert len(items[-1].fingerprints) == 2  # the intent cited both captures
        assert ledger.state().unfingerprinted == {}
    with running(settings, clock) as kernel:  # once: the next start adds nothing
        assert kernel.keystore.ledger is not None
        records = kernel.keystore.ledger._store.erasure_records()  # type: ignore[attr-defined]
        assert [r.kind for r in records].count("items") == 2

    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:
        kernel.process()
        assert kernel.profile("alice").intents == ()
        assert len(kernel.profile("alice").memories) == 2


def test_an_experience_erased_is_not_proposed_again_from_its_capture(
    backend: Backend, clock: FakeClock
) -> None:
    """Experiences come from apps only; the views hold their four fields, which the
    erasure fingerprints as the update engine identifies the proposal."""
    from domain.values import ExperienceProposal

    with running(settings_for(backend), clock) as kernel:
        consent(kernel)
        first = kernel.capture("alice", say("We fixed the boat", ref="one")).capture_id
        kernel.process()

        def propose(capture_id: str) -> int:
            return kernel.submit_proposals(
                "alice",
                ProposalBatch(
                    (
                        ExperienceProposal(
                            " The mast broke ", "Splinted it", "Held", "", evidence=(capture_id,)
                        ),
                    ),
                    author="app",
                    owner_agent="agent:one",
                    sharing="shared",
                    app_id=APP,
                    purpose="personalization",
                ),
            )

        assert propose(first) == 1
        kernel.process()
        (experience,) = [m for m in kernel.profile("alice").memories if m.kind == "experience"]
        kernel.erase_item("alice", experience.item_id)
        assert propose(first) == 0
        assert refusals(kernel)[-1]["counts"] == {"experience": 1}
        later = kernel.capture("alice", say("Another day", ref="two")).capture_id
        kernel.process()
        assert propose(later) == 1


def test_a_refusal_citing_more_captures_than_an_entry_lists_is_still_audited(
    backend: Backend, clock: FakeClock
) -> None:
    """An app's proposals of an erased item, each citing its capture and 31 others: the
    refusal named every cited capture, more than the 1,000 an audit entry's list holds,
    so its append was refused after the save had committed. The app got an error
    (``invalid_input``) for a request that had written its other proposals, and neither
    ``item.rebirth_refused`` nor ``proposal.applied`` was on the log. Now the entry names
    the captures the erased item came from (at most 1,000)."""
    with running(settings_for(backend), clock) as kernel:
        consent(kernel)
        first = kernel.capture("alice", say(SAIL, ref="one")).capture_id
        others = [
            a.capture_id
            for a in kernel.capture_many("alice", [say(f"ok {n}") for n in range(31 * 33)])
        ]
        kernel.process()
        kernel.erase_item("alice", item_id_of(kernel, "intent"))
        proposals: list[object] = [
            IntentProposal("learn to sail", (first, *others[31 * n : 31 * (n + 1)]))
            for n in range(33)
        ]
        proposals.append(MemoryProposal("sailing lessons booked", evidence=(first,)))
        size = kernel.audit_log.size()
        applied = kernel.submit_proposals(
            "alice",
            ProposalBatch(
                tuple(proposals),  # type: ignore[arg-type]
                author="app",
                owner_agent="agent:one",
                sharing="shared",
                app_id=APP,
                purpose="personalization",
            ),
        )
        assert applied == 1
        kernel.process()
        assert items_of(kernel)["intent"] == []
        assert "sailing lessons booked" in items_of(kernel)["memory"]
        after = size - 1
        refused = kernel.audit_log.entries(action=REBIRTH_REFUSED, after_leaf=after)
        [entry] = [e.entry for e in refused]
        assert entry["counts"] == {"intent": 33}
        assert entry["event_ids"] == [first]  # the capture the erased item came from
        applied_entries = kernel.audit_log.entries(action="proposal.applied", after_leaf=after)
        assert [e.entry["counts"] for e in applied_entries] == [{"items": 1}]


def test_a_refusal_of_more_captures_than_an_entry_lists_names_the_first_thousand() -> None:
    """An extraction batch (up to 10,000 captures) re-extracting more than 1,000 captures
    an erasure took items from, for one subject: one entry, valid, naming 1,000."""
    import uuid

    from audit.entry import validate_entry
    from uprof.services.erased_items import ErasedItemGuard, Refused

    written: list[tuple[str, dict[str, object]]] = []

    class Trail:
        def record_many(self, entries: list[tuple[str, dict[str, object]]]) -> None:
            for action, fields in entries:
                validate_entry({"action": action, **fields})
            written.extend(entries)

    guard = ErasedItemGuard(
        lambda: None,
        Trail(),  # type: ignore[arg-type]
        lambda streams: dict.fromkeys(streams, ("default", "ps-1")),
    )
    stream = uuid.uuid4()
    guard.recorded([Refused(stream, "memory", (f"c{n:05d}",)) for n in range(1500)])
    [(action, entry)] = written
    assert action == REBIRTH_REFUSED
    assert entry["event_ids"] == [f"c{n:05d}" for n in range(1000)]
    assert entry["counts"] == {"memory": 1500}


def test_a_refusal_by_another_tenants_worker_names_the_subjects_tenant(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    """Tenants on one set of stores share the event log, and a worker extracts every
    tenant's captures. The refusal it wrote for another tenant's subject named the
    worker's tenant and no subject (the pseudonym was looked up in the worker's tenant
    only): that tenant's auditors never saw it, and the worker's saw a refusal of a
    subject not theirs. It names the subject's tenant and pseudonym, as the worker's late
    ``capture.accepted`` does (decision 0101)."""
    settings = settings_for(backend)
    other = other_tenant(settings, tmp_path)
    with running(other, clock) as kernel:
        consent(kernel)
        kernel.capture("alice", say(SAIL))
        pseudonym = kernel.subjects.pseudonym("alice")
    backup(settings, tmp_path / "bk")
    with running(other, clock) as kernel:
        kernel.process()
        kernel.erase_item("alice", item_id_of(kernel, "intent"))
    restore(settings, tmp_path / "bk")
    with running(settings, clock) as kernel:  # the default tenant's worker extracts it
        kernel.process()
        [entry] = refusals(kernel)
        assert (entry["tenant"], entry.get("subject_ref")) == ("other-tenant", pseudonym)
        assert entry["counts"] == {"intent": 1}
    with running(other, clock) as kernel:
        assert items_of(kernel)["intent"] == []


def test_a_refusal_for_a_subject_erased_since_its_save_names_no_tenant() -> None:
    """Review of decisions 0104 and 0105 (2026-12-05): the entry takes its tenant from the
    subject index after the save; a subject erased in between (by any tenant's process)
    was written under the worker's tenant, naming another tenant's captures. A subject
    erased since gets no entry (its erasure's entries speak for its data)."""
    import uuid

    from tests.fakes.ports import InMemoryAuditTrail
    from uprof.services.erased_items import ErasedItemGuard, Refused

    trail = InMemoryAuditTrail()
    live, erased = uuid.uuid4(), uuid.uuid4()
    guard = ErasedItemGuard(lambda: None, trail, lambda streams: {str(live): ("other", "ps-live")})
    guard.recorded(
        [Refused(erased, "attribute", ("c-erased",)), Refused(live, "attribute", ("c-live",))]
    )
    assert [(e["tenant"], e["subject_ref"], e["event_ids"]) for e in trail.entries] == [
        ("other", "ps-live", ["c-live"])
    ]
