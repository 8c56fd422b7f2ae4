"""Intent updates through the door (I2, I3, I4).

An ``intent_update`` proposal names no category (the intent it moves has one), so the door
asked no policy and no consent for a batch of only such updates, and the aggregate matched
the intent by description among all of the subject's intents: an app with no policy role,
no consent of the subject, and no sight of another agent's private intent could move that
intent to "abandoned", and the answer told it whether the subject existed.
"""

from __future__ import annotations

from typing import Any

import pytest

from domain.errors import ConsentRequiredError, PermissionDeniedError, SubjectNotFoundError
from domain.values import (
    AttributeProposal,
    IntentProposal,
    IntentStatus,
    IntentUpdateProposal,
    ProposalBatch,
)
from tests.kernel.conftest import consent, say
from tests.kernel.test_door import PRINCIPALS
from uprof.facade import Facade
from uprof.kernel import Uprof

GOAL = "run a marathon"


def _update(door: Facade, subject: str, *, agent: str = "agent:one", **target: Any) -> int:
    batch = ProposalBatch(
        (IntentUpdateProposal(IntentStatus.ABANDONED, **target),),
        author=agent,
        owner_agent=agent,
        sharing="shared",
        purpose="personalization",
    )
    return door.submit_proposals(subject, batch)


def _with_goal(kernel: Uprof, *, sharing: str) -> str:
    """alice with planner's consent and a goal owned by planner's agent:one."""
    consent(kernel)
    kernel.grant_consent("alice", app_id="app:calendar", categories=["*"], purposes=["scheduling"])
    ack = kernel.capture("alice", say(f"I want to {GOAL}", sharing=sharing))
    planner = Facade(kernel, PRINCIPALS["planner"])
    planner.submit_proposals(
        "alice",
        ProposalBatch(
            (IntentProposal(GOAL, (ack.capture_id,)),),
            author="agent:one",
            owner_agent="agent:one",
            sharing=sharing,
            purpose="personalization",
        ),
    )
    kernel.process()
    [goal] = [i for i in kernel.profile("alice").intents if i.description == GOAL]
    assert (goal.owner_agent, goal.sharing) == ("app:planner/agent:one", sharing)
    return str(goal.item_id)


def _still_active(kernel: Uprof, item_id: str) -> bool:
    return any(
        i.item_id == item_id and i.status == "active" for i in kernel.profile("alice").intents
    )


def test_an_app_with_no_role_and_no_consent_cannot_move_an_intent(kernel: Uprof) -> None:
    item_id = _with_goal(kernel, sharing="shared")
    rogue = Facade(kernel, PRINCIPALS["rogue"])
    for target in ({"intent_id": item_id}, {"description": GOAL}):
        with pytest.raises(SubjectNotFoundError):  # as for a subject it cannot know
            _update(rogue, "alice", **target)
    assert _still_active(kernel, item_id)


def test_an_app_whose_policy_denies_proposals_cannot_move_an_intent(kernel: Uprof) -> None:
    item_id = _with_goal(kernel, sharing="shared")
    calendar = Facade(kernel, PRINCIPALS["calendar"])  # consent of alice; no propose role
    with pytest.raises(PermissionDeniedError):
        _update(calendar, "alice", intent_id=item_id)
    assert _still_active(kernel, item_id)


def test_another_agent_cannot_move_a_private_intent_it_cannot_see(kernel: Uprof) -> None:
    item_id = _with_goal(kernel, sharing="private")
    planner = Facade(kernel, PRINCIPALS["planner"])
    for target in ({"intent_id": item_id}, {"description": GOAL}):
        with pytest.raises(SubjectNotFoundError, match="intent"):
            _update(planner, "alice", agent="agent:two", **target)
    assert _still_active(kernel, item_id)
    assert _update(planner, "alice", intent_id=item_id) == 1  # its owner can
    assert not _still_active(kernel, item_id)


def test_an_update_needs_the_apps_consent_for_the_intents_category(kernel: Uprof) -> None:
    item_id = _with_goal(kernel, sharing="shared")
    [planner_consent] = [c for c in kernel.profile("alice").consents if c.app_id == "app:planner"]
    kernel.withdraw_consent("alice", planner_consent.consent_id)
    planner = Facade(kernel, PRINCIPALS["planner"])
    with pytest.raises((ConsentRequiredError, SubjectNotFoundError)):
        _update(planner, "alice", intent_id=item_id)
    assert _still_active(kernel, item_id)


def test_an_unknown_subject_and_a_subject_without_consent_answer_alike(kernel: Uprof) -> None:
    _with_goal(kernel, sharing="shared")
    rogue = Facade(kernel, PRINCIPALS["rogue"])
    answers = []
    for subject in ("alice", "nobody"):
        with pytest.raises(Exception) as refused:
            _update(rogue, subject, description=GOAL)
        answers.append((type(refused.value), str(refused.value)))
    assert answers[0] == answers[1]


def test_an_app_with_the_role_but_no_consent_learns_nothing_from_a_proposal(
    kernel: Uprof,
) -> None:
    """Attribute proposals too: planner holds the role, not a consent of bob. It got
    403 consent_required for bob, who exists, and 404 for a subject that does not."""
    kernel.grant_consent("bob", app_id="app:calendar", categories=["*"], purposes=["scheduling"])
    planner = Facade(kernel, PRINCIPALS["planner"])
    answers = []
    for subject in ("bob", "nobody"):
        batch = ProposalBatch(
            (AttributeProposal("diet", "vegan", (), 0.5),),
            author="agent:one",
            owner_agent="agent:one",
            sharing="shared",
            purpose="personalization",
        )
        with pytest.raises(SubjectNotFoundError) as refused:
            planner.submit_proposals(subject, batch)
        answers.append(str(refused.value))
    assert answers[0] == answers[1]
