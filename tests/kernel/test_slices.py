"""Budgeted, gated slices on SQLite and PostgreSQL (I2, I3, I4, I5, I6, I7)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.errors import (
    ConsentRequiredError,
    IdentityError,
    InvalidInputError,
    SubjectNotFoundError,
)
from tests.kernel.conftest import APP, consent, say
from uprof.adapters.tokens import TiktokenCounter
from uprof.kernel import Uprof
from uprof.services.subjects import SubjectRequest

CALENDAR = "app:calendar"
COUNTER = TiktokenCounter()


def planner_slice(kernel: Uprof, query: str, budget: int = 512, agent: str = "agent:one", **kw):
    return kernel.slice(
        "alice",
        query,
        budget_tokens=budget,
        purpose="personalization",
        app_id=APP,
        agent_id=agent,
        **kw,
    )


@pytest.mark.parametrize("budget", [0, 7, 20, 64, 300])
def test_slice_never_exceeds_its_budget(kernel: Uprof, budget: int) -> None:
    consent(kernel)
    kernel.capture_many(
        "alice",
        [
            say(f"I want to visit place number {i} with my friends and family", day=1 + i % 20)
            for i in range(40)
        ],
    )
    result = planner_slice(kernel, "where do I want to travel?", budget)
    assert COUNTER.count(result.text) == result.n_tokens <= budget
    assert result.budget_tokens == budget


def test_slice_items_carry_provenance(kernel: Uprof) -> None:
    consent(kernel)
    ack = kernel.capture("alice", say("I want to learn the cello", ref="D1:3"))
    result = planner_slice(kernel, "what instrument am I learning?")
    memory = next(i for i in result.items if i.layer == "memory")
    assert memory.source_refs == ("D1:3",)
    assert memory.evidence == (ack.capture_id,)
    assert memory.provenance == "explicit"
    assert "cello" in result.text


def test_policy_denied_category_is_withheld_with_a_count(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I live in Paris"))
    planner = planner_slice(kernel, "where do I live?")
    assert "Paris" not in " ".join(i.text for i in planner.items if i.layer == "attribute")
    assert planner.withheld.get("policy", 0) >= 1

    kernel.grant_consent("alice", app_id=CALENDAR, categories=["location"], purposes=["scheduling"])
    calendar = kernel.slice(
        "alice",
        "where do I live?",
        budget_tokens=256,
        purpose="scheduling",
        app_id=CALENDAR,
        agent_id="agent:cal",
    )
    assert any(i.layer == "attribute" and "Paris" in i.text for i in calendar.items)


def test_an_app_with_no_consent_of_the_subject_learns_nothing_of_it(kernel: Uprof) -> None:
    """Not its items, not its pseudonym, not how much is withheld, not that it exists:
    the answer is word for word the one for a subject nobody knows."""
    consent(kernel)
    kernel.capture("alice", say("I want to run a marathon"))
    kernel.process()

    def read(subject: str) -> str:
        with pytest.raises(SubjectNotFoundError) as refused:
            kernel.slice(
                subject,
                "goals",
                budget_tokens=256,
                purpose="scheduling",
                app_id=CALENDAR,
                agent_id="agent:cal",
            )
        return str(refused.value)

    assert read("alice") == read("nobody-at-all")

    def capture(subject: str) -> str:
        with pytest.raises(ConsentRequiredError) as refused:
            kernel.capture(subject, say("I fly on Monday", app=CALENDAR, purpose="scheduling"))
        return str(refused.value)

    assert capture("alice") == capture("nobody-at-all")
    # Once it holds a consent, even one that covers nothing asked, it is served (and
    # the gate withholds by category, counting what it withheld).
    kernel.grant_consent("alice", app_id=CALENDAR, categories=["schedule"], purposes=["scheduling"])
    served = kernel.slice(
        "alice", "goals", budget_tokens=256, purpose="scheduling", app_id=CALENDAR, agent_id="a"
    )
    assert served.items == ()
    assert served.withheld.get("consent", 0) + served.withheld.get("policy", 0) >= 1


def test_wrong_purpose_is_denied_by_default(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to run a marathon"))
    result = kernel.slice(
        "alice", "goals", budget_tokens=256, purpose="advertising", app_id=APP, agent_id="a"
    )
    assert result.items == ()


def test_private_items_are_visible_only_to_their_owner_agent(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture(
        "alice", say("my secret plan is to bake bread", agent="agent:one", sharing="private")
    )
    kernel.capture("alice", say("we discussed bread recipes", agent="agent:two", sharing="shared"))
    owner = planner_slice(kernel, "bread", agent="agent:one")
    other = planner_slice(kernel, "bread", agent="agent:two")
    assert "secret plan" in owner.text
    assert "secret plan" not in other.text
    assert other.withheld.get("visibility", 0) >= 1


def test_randomized_multi_agent_histories_never_leak(kernel: Uprof) -> None:
    rng = random.Random(11)
    agents = ["agent:a", "agent:b", "agent:c"]
    consent(kernel)
    consent(kernel, subject="bob")
    owners: dict[str, tuple[str, str]] = {}
    for i in range(36):
        subject = rng.choice(["alice", "bob"])
        agent = rng.choice(agents)
        sharing = rng.choice(["private", "shared", "shared:planner", "garbage!!", ""])
        marker = f"marker{i:03d}"
        owners[marker] = (subject, agent, sharing)  # type: ignore[assignment]
        kernel.capture(
            subject, say(f"note {marker} about topic {i % 5}", agent=agent, sharing=sharing)
        )
    for reader in agents:
        for subject in ("alice", "bob"):
            for topic in range(5):
                result = kernel.slice(
                    subject,
                    f"topic {topic}",
                    budget_tokens=2048,
                    purpose="personalization",
                    app_id=APP,
                    agent_id=reader,
                    agent_type="assistant",
                )
                for marker, (owner_subject, owner_agent, sharing) in owners.items():  # type: ignore[misc]
                    if marker not in result.text:
                        continue
                    assert owner_subject == subject  # I5: never another subject's item
                    visible_to_all = sharing == "shared"
                    assert owner_agent == reader or visible_to_all  # I4


_HOBBIES = ("camping", "hiking", "swimming", "pottery", "painting", "baking", "chess")
_WHO = ("the kids", "my sister", "friends from the gym", "church friends", "the veterans group")
_NOTES = st.lists(
    st.tuples(st.sampled_from(_HOBBIES), st.sampled_from(_WHO), st.booleans()),
    min_size=2,
    max_size=9,
)
_SUBJECTS = itertools.count()


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(notes=_NOTES, asked=st.sampled_from(_HOBBIES), budget=st.sampled_from([64, 160, 512]))
def test_a_bridge_never_surfaces_or_is_steered_by_a_gated_item(
    kernel: Uprof, notes: list[tuple[str, str, bool]], asked: str, budget: int
) -> None:
    # Subject x holds every note, some private to agent:two; subject y holds only the
    # notes agent:one may see. Semantic bridges link memories by meaning, so a private
    # note about the asked hobby would make a perfect seed: it must neither appear in
    # agent:one's slice nor change it (x's slice must equal y's, word for word).
    n = next(_SUBJECTS)
    x, y = f"bridge-x{n}", f"bridge-y{n}"
    for subject in (x, y):
        consent(kernel, subject=subject)
    shown: list[str] = []
    for i, (hobby, who, private) in enumerate(notes):
        text = f"note{i} we went {hobby} with {who}"
        if private:
            kernel.capture(
                x, say(f"secret{i} {text}", agent="agent:two", sharing="private", session="s2")
            )
            continue
        shown.append(text)
        for subject in (x, y):
            kernel.capture(subject, say(text, day=1 + i))
    question = f"What {asked} or similar hobbies did I do, and with whom?"
    served = [
        kernel.slice(
            subject,
            question,
            budget_tokens=budget,
            purpose="personalization",
            app_id=APP,
            agent_id="agent:one",
        )
        for subject in (x, y)
    ]
    assert "secret" not in served[0].text
    assert served[0].text == served[1].text
    assert all(item.text in shown for item in served[0].items if item.layer == "memory")


def test_identity_resolution_order_and_ambiguity(kernel: Uprof) -> None:
    consent(kernel)
    consent(kernel, subject="bob")
    kernel.capture("alice", say("I want to learn Italian"))
    kernel.register_session("sess-1", "alice")
    kernel.register_identifier("Alice@Example.org", "alice")

    by_session = kernel.slice(
        SubjectRequest(session_id="sess-1"),
        "Italian",
        budget_tokens=128,
        purpose="personalization",
        app_id=APP,
        agent_id="agent:one",
    )
    assert "Italian" in by_session.text
    by_identifier = kernel.slice(
        SubjectRequest(identifier="alice@example.org"),
        "Italian",
        budget_tokens=128,
        purpose="personalization",
        app_id=APP,
        agent_id="agent:one",
    )
    assert "Italian" in by_identifier.text
    with pytest.raises(IdentityError, match="ambiguous"):
        kernel.slice(
            SubjectRequest(subject="bob", session_id="sess-1"),
            "x",
            budget_tokens=64,
            purpose="personalization",
            app_id=APP,
            agent_id="agent:one",
        )
    with pytest.raises(IdentityError):
        kernel.slice(
            SubjectRequest(session_id="unknown"),
            "x",
            budget_tokens=64,
            purpose="personalization",
            app_id=APP,
            agent_id="agent:one",
        )
    with pytest.raises(IdentityError):
        kernel.slice(
            SubjectRequest(),
            "x",
            budget_tokens=64,
            purpose="personalization",
            app_id=APP,
            agent_id="agent:one",
        )
    with pytest.raises(SubjectNotFoundError):
        kernel.slice(
            "nobody",
            "x",
            budget_tokens=64,
            purpose="personalization",
            app_id=APP,
            agent_id="agent:one",
        )


def test_slice_reads_its_own_writes(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    result = planner_slice(kernel, "greyhound")
    assert result.fresh
    assert "greyhound" in result.text


def test_served_slice_is_recorded_and_counts_as_a_visit(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    result = planner_slice(kernel, "greyhound")
    kernel.process()
    memories = kernel.profile("alice").memories
    served = {i.item_id for i in result.items}
    assert any(m.visits == 1 for m in memories if m.item_id in served)
    entries = [e.entry for e in kernel.audit.log.entries(action="slice.served")]  # type: ignore[attr-defined]
    assert entries and sorted(entries[-1]["item_refs"]) == sorted(served)


def test_lexical_only_mode_serves_without_vectors(kernel: Uprof) -> None:
    consent(kernel)
    kernel.capture("alice", say("I want to adopt a greyhound"))
    result = planner_slice(kernel, "greyhound", lexical_only=True)
    assert "greyhound" in result.text


def test_bad_slice_requests_are_refused(kernel: Uprof) -> None:
    consent(kernel)
    with pytest.raises(InvalidInputError, match="budget_tokens"):
        planner_slice(kernel, "x", budget=-1)
    with pytest.raises(InvalidInputError, match="purpose"):
        kernel.slice("alice", "x", budget_tokens=10, purpose=" ", app_id=APP, agent_id="a")


def test_experience_memories_are_shared_by_agent_type_through_the_gate(kernel: Uprof) -> None:
    from domain.values import ExperienceProposal, ProposalBatch

    consent(kernel)
    ack = kernel.capture("alice", say("the flight got cancelled, can you rebook?"))
    experience = ExperienceProposal(
        situation="flight cancelled on the day of travel",
        action="rebooked on the next direct flight and claimed compensation",
        outcome="user arrived four hours late, satisfied",
        insight="offer the compensation claim proactively",
        evidence=(ack.capture_id,),
    )
    batch = ProposalBatch(
        (experience,),
        author="agent:travel",
        owner_agent="agent:travel",
        sharing="shared:assistant",
        app_id=APP,
    )
    assert kernel.submit_proposals("alice", batch) == 1
    query = "flight cancelled what should I do"
    peer = planner_slice(kernel, query, agent="agent:other", agent_type="assistant")
    stranger = planner_slice(kernel, query, agent="agent:other", agent_type="scheduler")
    assert any("compensation" in i.text for i in peer.items if i.category == "experience")
    assert not any(i.category == "experience" for i in stranger.items)
    assert stranger.withheld.get("visibility", 0) >= 1
