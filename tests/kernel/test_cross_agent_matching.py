"""A proposal matches only items its agent may see (I4), through the door and the pipeline.

The aggregate matched a proposal among all of the subject's items: another agent's
private attribute was retracted or superseded by a proposal that could not see it, and the
answer (``applied`` 1 or 0) told the proposer whether that private value existed; a
capture of another agent reinforced a private intent with its evidence and left that agent
no intent of its own. Here agent:one and agent:two are two agents of the same app
(app:planner), so the policy and the consent allow both: only visibility tells them apart.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from domain.errors import EvidenceError, IntentTransitionError
from domain.values import (
    AttributeProposal,
    IntentProposal,
    IntentStatus,
    IntentUpdateProposal,
    ProposalBatch,
)
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import consent, say, settings_for
from tests.kernel.test_door import PRINCIPALS
from uprof.adapters.embeddings import HashingEmbedder
from uprof.adapters.extraction import RuleBasedExtractor
from uprof.bootstrap import bootstrap
from uprof.facade import Facade
from uprof.kernel import Uprof

ONE, TWO = "app:planner/agent:one", "app:planner/agent:two"


@pytest.fixture
def rules_kernel(backend: Backend, clock: FakeClock) -> Iterator[Uprof]:
    """The pipeline with the product's rule extractor (the test fake finds no updates)."""
    k = bootstrap(
        settings_for(backend),
        clock=clock,
        embedder=HashingEmbedder(),
        extractor=RuleBasedExtractor(),
    )
    try:
        yield k
    finally:
        k.close()


def _propose(kernel: Uprof, agent: str, *proposals: object, sharing: str = "private") -> int:
    planner = Facade(kernel, PRINCIPALS["planner"])
    batch = ProposalBatch(
        tuple(proposals),  # type: ignore[arg-type]
        author=agent,
        owner_agent=agent,
        sharing=sharing,
        purpose="personalization",
    )
    applied = planner.submit_proposals("alice", batch)
    kernel.process()
    return applied


def _diets(kernel: Uprof) -> set[tuple[str, str, str]]:
    return {
        (a.value, a.owner_agent, a.status)
        for a in kernel.profile("alice").attributes
        if a.key == "diet"
    }


def test_another_agents_retraction_neither_removes_nor_reveals_a_private_value(
    kernel: Uprof,
) -> None:
    consent(kernel)
    assert _propose(kernel, "agent:one", AttributeProposal("diet", "vegan", (), 0.9)) == 1
    answers = {
        value: _propose(
            kernel, "agent:two", AttributeProposal("diet", value, (), 0.9, negated=True)
        )
        for value in ("vegan", "keto")  # held privately by agent:one / held by nobody
    }
    assert answers == {"vegan": 0, "keto": 0}  # the same answer: nothing learnt
    assert _diets(kernel) == {("vegan", ONE, "current")}
    # Its owner still retracts it.
    assert _propose(kernel, "agent:one", AttributeProposal("diet", "vegan", (), 0.9, negated=True))
    assert _diets(kernel) == {("vegan", ONE, "superseded")}


@pytest.mark.parametrize("supersedes", [True, False])
def test_another_agents_value_neither_supersedes_nor_conflicts_with_a_private_one(
    kernel: Uprof, supersedes: bool
) -> None:
    consent(kernel)
    _propose(kernel, "agent:one", AttributeProposal("diet", "vegan", (), 0.9))
    _propose(kernel, "agent:two", AttributeProposal("diet", "keto", (), 0.9, supersedes=supersedes))
    assert _diets(kernel) == {("vegan", ONE, "current"), ("keto", TWO, "current")}
    [keto] = [a for a in kernel.profile("alice").attributes if a.value == "keto"]
    assert keto.conflicts_with == ()


def test_a_shared_value_is_matched_by_another_agent(kernel: Uprof) -> None:
    """What an agent may see it still reinforces and supersedes (the rule is visibility,
    not ownership)."""
    consent(kernel)
    _propose(kernel, "agent:one", AttributeProposal("diet", "vegan", (), 0.9), sharing="shared")
    _propose(kernel, "agent:two", AttributeProposal("diet", "keto", (), 0.9, supersedes=True))
    assert _diets(kernel) == {("vegan", ONE, "superseded"), ("keto", TWO, "current")}


def test_another_agents_capture_does_not_reinforce_a_private_intent(rules_kernel: Uprof) -> None:
    """Through the pipeline: the same plan told to two agents privately is two intents,
    each with its own agent's evidence."""
    kernel = rules_kernel
    consent(kernel)
    first = kernel.capture("alice", say("I want to learn the guitar", sharing="private"))
    second = kernel.capture(
        "alice", say("I want to learn the guitar", agent="agent:two", sharing="private")
    )
    kernel.process()
    intents = {
        (i.owner_agent, tuple(i.evidence))
        for i in kernel.profile("alice").intents
        if "guitar" in i.description
    }
    assert intents == {(ONE, (first.capture_id,)), (TWO, (second.capture_id,))}


def test_another_agents_capture_does_not_move_a_private_intent(rules_kernel: Uprof) -> None:
    kernel = rules_kernel
    consent(kernel)
    kernel.capture("alice", say("I want to learn the guitar", sharing="private"))
    kernel.process()
    kernel.capture(
        "alice",
        say("I gave up on learning the guitar", agent="agent:two", sharing="private", day=2),
    )
    kernel.process()
    statuses = {
        (i.owner_agent, i.status)
        for i in kernel.profile("alice").intents
        if "guitar" in i.description
    }
    assert statuses == {(ONE, "active")}
    # The owner's own words move it.
    kernel.capture("alice", say("I gave up on learning the guitar", sharing="private", day=3))
    kernel.process()
    statuses = {
        (i.owner_agent, i.status)
        for i in kernel.profile("alice").intents
        if "guitar" in i.description
    }
    assert statuses == {(ONE, "abandoned")}


def test_an_intent_named_by_id_that_its_agent_cannot_see_is_refused_as_not_active(
    kernel: Uprof,
) -> None:
    """Below the door (which binds updates to visible intents): the aggregate itself
    answers an id it may not see as it answers an id that is not active."""
    consent(kernel)
    _propose(kernel, "agent:one", IntentProposal("learn the guitar", confidence=0.9))
    [goal] = kernel.profile("alice").intents
    answers = []
    for item_id in (goal.item_id, "no-such-intent"):
        target = ProposalBatch(
            (IntentUpdateProposal(IntentStatus.ABANDONED, intent_id=item_id),),
            author=TWO,
            owner_agent=TWO,
            sharing="private",
            app_id="app:planner",
        )
        with pytest.raises(IntentTransitionError) as refused:
            kernel.submit_proposals("alice", target)
        answers.append(str(refused.value).replace(item_id, "<id>"))
    assert answers[0] == answers[1]
    assert [i.status for i in kernel.profile("alice").intents] == ["active"]


def _cite(door: Facade, agent: str, evidence: str, purpose: str) -> int:
    key, value = ("routine", "gym at 7") if purpose == "scheduling" else ("diet", "vegan")
    batch = ProposalBatch(
        (AttributeProposal(key, value, (evidence,), 0.9),),
        author=agent,
        owner_agent=agent,
        sharing="private",
        purpose=purpose,
    )
    return door.submit_proposals("alice", batch)


def _jazz_served(door: Facade) -> bool:
    served = door.slice(
        "alice", "jazz", budget_tokens=500, purpose="personalization", agent_id="agent:one"
    )
    return [i.text for i in served.items] == ["I love jazz"]


def test_a_private_capture_is_cited_as_evidence_by_its_agent_only(kernel: Uprof) -> None:
    """Another app's agent citing a private capture (its id shows in provenance labels)
    made its own item part of what the capture reveals: the capture's memory then needed
    that item's category too, and its owner's slices withheld it (planner holds no
    consent for `schedule`). Such a citation is refused as one of a capture that does not
    exist."""
    consent(kernel, categories=("conversation", "preference", "diet"))
    kernel.grant_consent("alice", app_id="app:calendar", categories=["*"], purposes=["scheduling"])
    ack = kernel.capture("alice", say("I love jazz", sharing="private"))
    kernel.process()
    planner = Facade(kernel, PRINCIPALS["planner"])
    assert _jazz_served(planner)
    calendar = Facade(kernel, PRINCIPALS["calendar"])
    answers = []
    for evidence in (ack.capture_id, "0" * 32):
        with pytest.raises(EvidenceError) as refused:
            _cite(calendar, "agent:cal", evidence, "scheduling")
        answers.append(str(refused.value).replace(evidence, "<id>"))
    assert answers[0] == answers[1]
    kernel.process()
    assert _jazz_served(planner)
    assert {a.key for a in kernel.profile("alice").attributes} == set()
    # Its own agent cites it.
    assert _cite(planner, "agent:one", ack.capture_id, "personalization") == 1
