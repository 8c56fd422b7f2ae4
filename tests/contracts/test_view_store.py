"""ViewStore contract, differential: the same event histories go into the in-memory fake
and the SQL adapter (SQLite, PostgreSQL), and every query must answer alike.

The histories are built with the domain's own commands (the events the projector sees
in production), numbered as a log would number them. ``TestViewStoreInMemory`` runs each
history on the fake alone against the expectations written here; ``TestViewStoreOnDatabase``
runs it on the SQL adapter and, beside it, on a fresh fake over the same key store, and
every query compares the two answers (``Views.ask``) before checking the expectations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from domain.errors import PositionMovedError
from domain.profile import SubjectProfile
from domain.values import (
    AttributeProposal,
    ExperienceProposal,
    IntentProposal,
    IntentStatus,
    Interaction,
    MemoryProposal,
    ProposalBatch,
)
from projections.profile.projector import ProfileProjector
from projections.profile.views import SqlViewStore
from tests.contracts.conftest import Stores
from tests.fakes.keystore import InMemoryKeyStore
from tests.fakes.views import InMemoryViewStore
from uprof.crypto.fields import ViewSealer
from uprof.ports import ViewStore

TENANT = "default"
APP = "app:planner"
LOG = "profiles"
T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _canonical(name: str, answer: Any) -> Any:
    """Order-free where the port promises no order (ties, sets, unordered lists)."""
    if name == "attributes":
        return sorted(answer, key=lambda r: (r.category, r.key, r.item_id))
    if name == "consents":
        return sorted(answer, key=lambda r: (r.granted_at, r.consent_id))
    if name in ("captures_by", "item_reads"):
        return sorted(answer)
    if name == "memories":
        rows, vectors = answer
        return rows, None if vectors is None else vectors.tolist()
    return answer


@dataclass
class Views:
    """The flavour under test, plus (on a database) a fake fed the same batches."""

    keys: InMemoryKeyStore
    stores: list[ViewStore]
    position: int = 0
    clock: list[datetime] = field(default_factory=lambda: [T0])
    #: Every batch ``project`` applied, with its position and vectors (for ``replay``).
    history: list[tuple[list[tuple[int, Any]], int, dict[str, bytes] | None]] = field(
        default_factory=list
    )

    def now(self) -> datetime:
        self.clock[0] += timedelta(seconds=1)
        return self.clock[0]

    def project(self, *profiles: SubjectProfile, embed: bool = False) -> int:
        """Apply the profiles' pending events as the next notifications of the log.

        ``embed``: give each memory a made-up 4-float vector (its text's length; no model).
        """
        events = [e for p in profiles for e in p.collect_events()]
        batch = [(self.position + i + 1, e) for i, e in enumerate(events)]
        self.position += len(events)
        vectors = None
        if embed:
            vectors = {
                e.item_id: np.full(4, len(e.text), dtype=np.float32).tobytes()
                for e in events
                if isinstance(e, SubjectProfile.MemoryRecorded)
            }
        self.history.append((batch, self.position, vectors))
        applied = [s.apply_batch(LOG, batch, self.position, vectors) for s in self.stores]
        assert len(set(applied)) == 1, applied
        return applied[0]

    def replay(self) -> int:
        """Apply every batch ``project`` applied so far again, as a rebuild reads the log."""
        return sum(self.ask("apply_batch", LOG, *applied) for applied in self.history)

    def ask(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Ask every store; they must agree. Returns the answer."""
        answers = [getattr(s, name)(*args, **kwargs) for s in self.stores]
        first = _canonical(name, answers[0])
        for other in answers[1:]:
            assert _canonical(name, other) == first, f"{name} differs between the stores"
        return answers[0]

    def subject(self, ref: str = "alice") -> SubjectProfile:
        handle = self.keys.resolve_or_create(TENANT, ref, now=T0)
        profile = SubjectProfile(id=handle.stream_id, tenant=TENANT)
        profile.grant_consent(
            app_id=APP,
            categories=("*",),
            purposes=("personalization", "support"),
            legal_basis="consent",
            granted_at=self.now(),
        )
        return profile


def capture(
    views: Views,
    profile: SubjectProfile,
    text: str,
    *,
    session: str = "s1",
    source_ref: str = "",
    purpose: str = "personalization",
) -> str:
    return profile.capture(
        Interaction(
            app_id=APP,
            agent_id="agent:one",
            occurred_at=views.now(),
            user_input=text,
            agent_response="noted",
            session_id=session,
            actor="Alice",
            source_ref=source_ref,
            purpose=purpose,
        ),
        now=views.now(),
    )


def propose(views: Views, profile: SubjectProfile, *proposals: Any) -> int:
    batch = ProposalBatch(tuple(proposals), author="fake", owner_agent="agent:one", app_id=APP)
    when = views.now()
    return profile.apply_proposals(batch, observed_at=when, now=when)


def stream(profile: SubjectProfile) -> str:
    return str(profile.id)


class ViewStoreContract:
    """What every ViewStore must answer after the same events."""

    def test_captures_are_found_by_id_across_subjects_and_by_subject(self, views: Views) -> None:
        alice, bob = views.subject("alice"), views.subject("bob")
        a1 = capture(views, alice, "hello", session="s1", source_ref="msg-1")
        a2 = capture(views, alice, "again", session="s1", source_ref="msg-2", purpose="support")
        a3 = capture(views, alice, "other session", session="s2")
        b1 = capture(views, bob, "bob here", session="s1")
        views.project(alice, bob)
        found = views.ask("captures", [a1, b1, "missing"])
        assert set(found) == {a1, b1}
        assert found[a1].stream_id == stream(alice) and found[b1].stream_id == stream(bob)
        assert found[a1].user_input == "hello" and found[a1].source_ref == "msg-1"
        rows = views.ask("all_captures", stream(alice))
        assert [r.capture_id for r in rows] == [a1, a2, a3]
        assert [r.notification_id for r in rows] == sorted(r.notification_id for r in rows)
        assert sorted(
            views.ask("captures_by", stream(alice), app_id=APP, purposes=["support"], since=T0)
        ) == [a2]
        assert (
            len(views.ask("captures_by", stream(alice), app_id=APP, purposes=["*"], since=T0)) == 3
        )
        assert (
            views.ask("captures_by", stream(alice), app_id="app:x", purposes=["*"], since=T0) == []
        )
        assert sorted(views.ask("session_activity", stream(alice)).values()) == [1, 2]
        assert views.ask("captured_source_refs", stream(alice), APP, ["msg-1", "msg-3", ""]) == {
            "msg-1"
        }
        assert views.ask("captured_source_refs", stream(bob), APP, ["msg-1"]) == set()

    def test_extraction_results_make_a_profile(self, views: Views) -> None:
        alice = views.subject()
        c1 = capture(views, alice, "I live in Paris and want to learn Italian", source_ref="r1")
        assert (
            propose(
                views,
                alice,
                AttributeProposal("home_location", "Paris", (c1,), 0.9),
                MemoryProposal("Alice lives in Paris", (c1,), source_refs=("r1",), span=(0, 15)),
                IntentProposal("learn Italian", (c1,), expires_at=T0 + timedelta(days=30)),
                ExperienceProposal("moving", "packed", "tired", "hire movers", (c1,)),
            )
            == 4
        )
        views.project(alice)
        sid = stream(alice)
        (attribute,) = views.ask("attributes", sid)
        assert (attribute.key, attribute.value, attribute.status) == (
            "home_location",
            "Paris",
            "current",
        )
        assert attribute.evidence == (c1,)
        memories, vectors = views.ask("memories", sid, with_vectors=True)
        assert sorted(m.kind for m in memories) == ["experience", "memory"]
        memory = next(m for m in memories if m.kind == "memory")
        assert memory.text == "Alice lives in Paris" and memory.source_refs == ("r1",)
        assert memory.session_id == "s1" and memory.actor == "Alice" and memory.session_key
        assert memory.detail == {"span": "0-15"}
        experience = next(m for m in memories if m.kind == "experience")
        assert experience.detail["insight"] == "hire movers"
        assert vectors is None  # no embedder wired
        (intent,) = views.ask("intents", sid, status="active")
        assert intent.description == "learn Italian" and intent.expires_at is not None
        first = views.ask("memories_after", sid, after=None, limit=1)
        rest = views.ask(
            "memories_after", sid, after=(first[0].occurred_at, first[0].item_id), limit=10
        )
        assert [m.item_id for m in first + rest] == [m.item_id for m in memories]

    def test_memory_vectors_come_back_stacked_in_memory_order(self, views: Views) -> None:
        alice = views.subject()
        c1 = capture(views, alice, "one")
        propose(views, alice, MemoryProposal("first", (c1,)), MemoryProposal("second", (c1,)))
        views.project(alice, embed=True)
        memories, vectors = views.ask("memories", stream(alice), with_vectors=True)
        assert vectors is not None and vectors.shape == (2, 4)
        assert vectors[:, 0].tolist() == [len(m.text) for m in memories]  # row i: memory i
        assert views.ask("memories", stream(alice))[1] is None  # not asked for
        views.keys.destroy(stream(alice), now=views.now())
        assert views.ask("memories", stream(alice), with_vectors=True)[1] is None

    def test_a_conflict_then_a_supersession(self, views: Views) -> None:
        alice = views.subject()
        c1 = capture(views, alice, "I live in Paris")
        propose(views, alice, AttributeProposal("home_location", "Paris", (c1,)))
        views.project(alice)
        c2 = capture(views, alice, "I live in Rome")
        propose(views, alice, AttributeProposal("home_location", "Rome", (c2,)))
        views.project(alice)
        sid = stream(alice)
        rows = views.ask("attributes", sid)
        assert {r.status for r in rows} == {"conflicting"}
        assert all(len(r.conflicts_with) == 1 for r in rows)
        c3 = capture(views, alice, "I moved to Lisbon")
        propose(views, alice, AttributeProposal("home_location", "Lisbon", (c3,), supersedes=True))
        views.project(alice)
        rows = views.ask("attributes", sid)
        by_value = {r.value: r for r in rows}
        assert by_value["Lisbon"].status == "current"
        assert by_value["Paris"].status == by_value["Rome"].status == "superseded"
        assert by_value["Paris"].superseded_by == by_value["Lisbon"].item_id
        assert [r.value for r in views.ask("attributes", sid, include_superseded=False)] == [
            "Lisbon"
        ]

    def test_a_reinforced_attribute_and_a_fulfilled_intent(self, views: Views) -> None:
        alice = views.subject()
        c1 = capture(views, alice, "I live in Paris, I want to learn Italian")
        propose(
            views,
            alice,
            AttributeProposal("home_location", "Paris", (c1,), 0.6),
            IntentProposal("learn Italian", (c1,)),
        )
        views.project(alice)
        c2 = capture(views, alice, "Paris again")
        propose(views, alice, AttributeProposal("home_location", "Paris", (c2,), 0.6))
        (intent_id,) = list(alice.intents)
        alice.change_intent_status(
            intent_id, IntentStatus.FULFILLED, evidence=(c2,), observed_at=views.now()
        )
        views.project(alice)
        sid = stream(alice)
        (attribute,) = views.ask("attributes", sid)
        assert attribute.evidence == (c1, c2) and attribute.confidence > 0.6
        assert views.ask("intents", sid, status="active") == []
        (intent,) = views.ask("intents", sid)
        assert intent.status == "fulfilled" and intent.evidence == (c1, c2)

    def test_consents_withdrawn_and_paged(self, views: Views) -> None:
        alice = views.subject()
        second = alice.grant_consent(
            app_id="app:calendar",
            categories=("schedule",),
            purposes=("scheduling",),
            legal_basis="consent",
            granted_at=views.now(),
        )
        views.project(alice)
        alice.withdraw_consent(consent_id=second, withdrawn_at=views.now(), erase_requested=True)
        views.project(alice)
        sid = stream(alice)
        rows = views.ask("consents", sid)
        assert [r.app_id for r in rows] == [APP, "app:calendar"]
        assert rows[0].withdrawn_at is None and rows[1].withdrawn_at is not None
        assert rows[1].erase_requested
        page = views.ask("consents_after", sid, app_id=None, after=None, limit=1)
        key = (page[0].granted_at, page[0].consent_id)
        rest = views.ask("consents_after", sid, app_id=None, after=key, limit=5)
        assert [r.consent_id for r in page + rest] == [r.consent_id for r in rows]
        only = views.ask("consents_after", sid, app_id="app:calendar", after=None, limit=5)
        assert [r.consent_id for r in only] == [second]

    def test_what_a_consent_collected_lies_between_its_grant_and_its_withdrawal(
        self, views: Views
    ) -> None:
        """A consent row carries the log positions of its grant and withdrawal;
        ``captures_by`` takes them as exclusive bounds, and times as inclusive ones (the
        fallback for rows projected before migration 0005, which have no positions)."""
        alice = views.subject()
        capture(views, alice, "under the first consent", purpose="support")
        views.project(alice)
        second = alice.grant_consent(
            app_id=APP,
            categories=("*",),
            purposes=("support",),
            legal_basis="consent",
            granted_at=views.now(),
        )
        during = [
            capture(views, alice, "one", purpose="support"),
            capture(views, alice, "two", purpose="support"),
        ]
        stamped = {
            e.capture_id: e.timestamp
            for e in alice.pending_events
            if isinstance(e, SubjectProfile.InteractionCaptured)
        }
        alice.withdraw_consent(consent_id=second, withdrawn_at=views.now(), erase_requested=True)
        views.project(alice)
        later = capture(views, alice, "under a later consent", purpose="support")
        views.project(alice)
        sid = stream(alice)
        (row,) = [r for r in views.ask("consents", sid) if r.consent_id == second]
        first = next(r for r in views.ask("consents", sid) if r.consent_id != second)
        assert first.granted_position is not None and first.withdrawn_position is None
        assert row.granted_position is not None and row.withdrawn_position is not None
        at = {c.capture_id: c.notification_id for c in views.ask("all_captures", sid)}
        assert row.granted_position < at[during[0]] < at[during[1]] < row.withdrawn_position

        def by(**bounds: Any) -> list[str]:
            return sorted(views.ask("captures_by", sid, app_id=APP, purposes=["*"], **bounds))

        assert by(
            after_position=row.granted_position, before_position=row.withdrawn_position
        ) == sorted(during)
        assert by(after_position=at[during[0]], before_position=at[later]) == [during[1]]
        assert by(after_position=row.granted_position) == sorted([*during, later])
        assert by(before_position=at[during[0]]) == [c for c in sorted(at) if at[c] < at[during[0]]]
        t0, t1 = stamped[during[0]], stamped[during[1]]
        assert by(since=t0, until=t1) == sorted(during)
        assert by(since=t0, until=t0) == [during[0]]
        assert by(since=t1) == sorted([during[1], later])
        assert by(after_position=row.granted_position, until=t0) == [during[0]]

    def test_served_slices_count_visits_and_archived_memories_hide(self, views: Views) -> None:
        alice = views.subject()
        c1 = capture(views, alice, "one")
        propose(views, alice, MemoryProposal("first", (c1,)), MemoryProposal("second", (c1,)))
        views.project(alice)
        sid = stream(alice)
        memories, _ = views.ask("memories", sid)
        ids = [m.item_id for m in memories]
        for _ in range(2):
            alice.record_slice_served(
                app_id=APP,
                agent_id="agent:one",
                purpose="personalization",
                item_ids=ids[:1],
                served_at=views.now(),
                budget_tokens=100,
                n_tokens=10,
            )
        alice.archive_memories(ids[1:], reason="stale")
        views.project(alice)
        visible, _ = views.ask("memories", sid)
        assert [(m.item_id, m.visits) for m in visible] == [(ids[0], 2)]
        everything, _ = views.ask("memories", sid, include_archived=True)
        assert [m.archived for m in everything] == [False, True]
        ((item, app, purpose, reads, _),) = views.ask("item_reads", sid)
        assert (item, app, purpose, reads) == (ids[0], APP, "personalization", 2)

    def test_an_erased_capture_takes_what_only_it_backs(self, views: Views) -> None:
        alice = views.subject()
        c1 = capture(views, alice, "I live in Paris", session="s1")
        c2 = capture(views, alice, "Paris, yes", session="s1")
        propose(
            views,
            alice,
            AttributeProposal("home_location", "Paris", (c1,)),
            MemoryProposal("lives in Paris", (c1,)),
            IntentProposal("see Paris", (c1,)),
        )
        propose(views, alice, AttributeProposal("home_location", "Paris", (c2,)))
        views.project(alice)
        sid = stream(alice)
        memories, _ = views.ask("memories", sid)
        cited = [m.item_id for m in memories] + [i.item_id for i in views.ask("intents", sid)]
        alice.erase_capture(c1, cited_by=cited, now=views.now())
        views.project(alice)
        assert views.ask("captures", [c1]) == {}
        assert [c.capture_id for c in views.ask("all_captures", sid)] == [c2]
        assert list(views.ask("session_activity", sid).values()) == [1]
        (attribute,) = views.ask("attributes", sid)
        assert attribute.evidence == (c2,)  # restated without the erased capture
        assert views.ask("memories", sid, include_archived=True)[0] == []
        assert views.ask("intents", sid) == []

    def test_an_erased_subject_leaves_no_rows(self, views: Views) -> None:
        alice, bob = views.subject("alice"), views.subject("bob")
        c1 = capture(views, alice, "I live in Paris", source_ref="r1")
        propose(
            views,
            alice,
            AttributeProposal("home_location", "Paris", (c1,)),
            MemoryProposal("lives in Paris", (c1,)),
        )
        b1 = capture(views, bob, "bob stays")
        views.project(alice, bob)
        alice.erase(request_id="req-1", basis="art17", now=views.now())
        views.project(alice)
        views.keys.destroy(stream(alice), now=views.now())
        sid = stream(alice)
        assert views.ask("attributes", sid) == []
        assert views.ask("memories", sid, include_archived=True)[0] == []
        assert views.ask("intents", sid) == []
        assert views.ask("consents", sid) == []
        assert views.ask("all_captures", sid) == []
        assert views.ask("captures", [c1]) == {}
        assert views.ask("session_activity", sid) == {}
        assert views.ask("item_reads", sid) == []
        assert views.ask("captured_source_refs", sid, APP, ["r1"]) == set()
        assert list(views.ask("captures", [b1])) == [b1]  # the other subject untouched

    def test_a_subject_shredded_before_projection_gets_no_sealed_rows(self, views: Views) -> None:
        alice = views.subject()
        c1 = capture(views, alice, "I live in Paris")
        propose(views, alice, AttributeProposal("home_location", "Paris", (c1,)))
        views.keys.destroy(stream(alice), now=views.now())
        assert views.project(alice) == 4  # applied, though the sealed rows are skipped
        sid = stream(alice)
        assert views.ask("attributes", sid) == []
        assert views.ask("all_captures", sid) == []
        assert [c.app_id for c in views.ask("consents", sid)] == [APP]  # nothing sealed there

    def test_a_replayed_batch_applies_nothing_twice(self, views: Views) -> None:
        alice = views.subject()
        capture(views, alice, "hello")
        events = alice.collect_events()
        batch = [(i + 1, e) for i, e in enumerate(events)]
        for store in views.stores:
            assert store.apply_batch(LOG, batch, len(batch)) == len(batch)
            assert store.apply_batch(LOG, batch, len(batch)) == 0
            assert store.position("profile", LOG) == len(batch)
            assert store.position("profile", "elsewhere") == 0
        assert list(views.ask("session_activity", stream(alice)).values()) == [1]

    def test_a_batch_read_before_a_reset_is_refused(self, views: Views) -> None:
        """A batch read after position ``read_after`` is refused, nothing written, once
        the stored position is below it (a rebuild reset the views meanwhile): the
        events between would be in neither the views nor the batch."""
        alice = views.subject()
        capture(views, alice, "hello")
        capture(views, alice, "again")
        events = alice.collect_events()
        batch = [(i + 1, e) for i, e in enumerate(events)]
        for store in views.stores:
            with pytest.raises(PositionMovedError):
                store.apply_batch(LOG, batch[2:], len(batch), read_after=2)
            assert store.position("profile", LOG) == 0
            assert store.apply_batch(LOG, batch[:2], 2, read_after=0) == 2
            # Read after 1 and applied at 2 (another runner went ahead): the rest goes on.
            assert store.apply_batch(LOG, batch[1:], len(batch), read_after=1) == len(batch) - 2
            assert store.position("profile", LOG) == len(batch)

    # ------------------------------------------------- what ProjectionRunner drives

    def test_positions_created_up_front_never_move_back(self, views: Views) -> None:
        names = ["profile.p0of2", "profile.p1of2"]
        assert {store.name for store in views.stores} == {"profile"}
        assert views.ask("lowest_position", names, LOG) == 0  # none exists yet
        views.ask("ensure_positions", names, LOG)
        assert [views.ask("position", n, LOG) for n in names] == [0, 0]
        assert views.ask("apply_batch", LOG, [], 5, projection_name=names[0]) == 0
        # A second runner starting (another process, or this one again) moves nothing back.
        views.ask("ensure_positions", names, LOG)
        assert views.ask("position", names[0], LOG) == 5
        # The other partition's position exists, at 0: the log is projected up to 0 only.
        assert views.ask("lowest_position", names, LOG) == 0
        views.ask("apply_batch", LOG, [], 7, projection_name=names[1])
        assert views.ask("lowest_position", names, LOG) == 5
        assert views.ask("lowest_position", names[1:], LOG) == 7
        assert views.ask("lowest_position", names, "elsewhere") == 0  # one application's
        assert views.ask("position", names[0], "elsewhere") == 0

    def test_a_reset_drops_every_view_and_a_replay_rebuilds_them(self, views: Views) -> None:
        alice, bob = views.subject("alice"), views.subject("bob")
        c1 = capture(views, alice, "I live in Paris, I want to learn Italian", source_ref="r1")
        propose(
            views,
            alice,
            AttributeProposal("home_location", "Paris", (c1,)),
            MemoryProposal("lives in Paris", (c1,)),
            IntentProposal("learn Italian", (c1,)),
        )
        b1 = capture(views, bob, "bob here", session="s9")
        views.project(alice, bob, embed=True)
        memories, _ = views.ask("memories", stream(alice))
        alice.record_slice_served(
            app_id=APP,
            agent_id="agent:one",
            purpose="personalization",
            item_ids=[m.item_id for m in memories],
            served_at=views.now(),
            budget_tokens=100,
            n_tokens=10,
        )
        views.project(alice)
        views.ask("apply_batch", "elsewhere", [], 3)  # another application's position
        views.ask("apply_batch", LOG, [], 4, projection_name="unrelated")
        subjects = [stream(alice), stream(bob)]
        live = _every_answer(views, subjects, [c1, b1])
        assert live["memories", stream(alice)][1] is not None  # the vectors are in it

        views.ask("reset", ["profile"])
        assert views.ask("position", "profile", LOG) == 0
        assert views.ask("position", "profile", "elsewhere") == 0  # every application's
        assert views.ask("position", "unrelated", LOG) == 4  # not named: left as it is
        nothing = {key: _canonical(key[0], _EMPTY[key[0]]) for key in live}
        assert _every_answer(views, subjects, [c1, b1]) == nothing

        assert views.replay() == sum(len(batch) for batch, _, _ in views.history)
        assert _every_answer(views, subjects, [c1, b1]) == live
        assert views.ask("position", "profile", LOG) == views.position


def _every_answer(views: Views, subjects: list[str], capture_ids: list[str]) -> dict[Any, Any]:
    """Every query's answer about these subjects, by (query, subject)."""

    def ask(name: str, *args: Any, **kwargs: Any) -> Any:
        return _canonical(name, views.ask(name, *args, **kwargs))

    answers: dict[Any, Any] = {("captures",): ask("captures", capture_ids)}
    for sid in subjects:
        answers["attributes", sid] = ask("attributes", sid)
        answers["memories", sid] = ask("memories", sid, include_archived=True, with_vectors=True)
        answers["intents", sid] = ask("intents", sid)
        answers["consents", sid] = ask("consents", sid)
        answers["all_captures", sid] = ask("all_captures", sid)
        answers["session_activity", sid] = ask("session_activity", sid)
        answers["item_reads", sid] = ask("item_reads", sid)
    return answers


#: What each query of ``_every_answer`` answers on a store nothing was projected into.
_EMPTY: dict[str, Any] = {
    "captures": {},
    "attributes": [],
    "memories": ([], None),
    "intents": [],
    "consents": [],
    "all_captures": [],
    "session_activity": {},
    "item_reads": [],
}


def _fake(keys: InMemoryKeyStore) -> ViewStore:
    return InMemoryViewStore(keys)


class TestViewStoreInMemory(ViewStoreContract):
    @pytest.fixture
    def views(self) -> Views:
        keys = InMemoryKeyStore()
        return Views(keys, [_fake(keys)])


class TestViewStoreOnDatabase(ViewStoreContract):
    @pytest.fixture
    def views(self, database_stores: Stores) -> Views:
        keys = InMemoryKeyStore()
        sealer = ViewSealer(keys)  # type: ignore[arg-type]
        engine = database_stores._engine("views")
        real = SqlViewStore(engine, sealer, ProfileProjector(None, sealer))
        return Views(keys, [real, _fake(keys)])
