"""The authorized door (uprof.facade): every action × principal, deny by default (I3, I4).

The expectation table below restates the seed policy and the door's rules by hand, so a
change to either that changes a decision fails here. Every row runs on SQLite and
PostgreSQL. A refusal must write nothing: the log position is checked after each one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from domain.errors import (
    ConsentRequiredError,
    InvalidInputError,
    PermissionDeniedError,
    SubjectNotFoundError,
)
from domain.principal import Principal, PrincipalKind
from domain.values import AttributeProposal, Interaction, ProposalBatch
from tests.kernel.conftest import consent, say
from uprof.facade import Facade
from uprof.kernel import Uprof

TENANT = "default"

PRINCIPALS: dict[str, Principal] = {
    "planner": Principal(TENANT, "app:planner", "k1", PrincipalKind.APP, frozenset({"app"})),
    "calendar": Principal(TENANT, "app:calendar", "k2", PrincipalKind.APP, frozenset({"app"})),
    "rogue": Principal(TENANT, "app:rogue", "k3", PrincipalKind.APP, frozenset({"app"})),
    "dpo": Principal(TENANT, "app:privacy-console", "k4", PrincipalKind.APP, frozenset({"app"})),
    "compliance": Principal(
        TENANT, "app:compliance-console", "k5", PrincipalKind.APP, frozenset({"app"})
    ),
    "planner-operator-key": Principal(
        TENANT, "app:planner", "k6", PrincipalKind.APP, frozenset({"app", "operator"})
    ),
    "cli": Principal.local_operator(TENANT),
    "alice-link": Principal(TENANT, "privacy-center", "l1", PrincipalKind.USER, subject="alice"),
    "bob-link": Principal(TENANT, "privacy-center", "l2", PrincipalKind.USER, subject="bob"),
}

WHEN = datetime(2025, 1, 1, 9, tzinfo=UTC)


def _capture(door: Facade, subject: str) -> Any:
    return door.capture(subject, say("I want to learn the cello", app="app:ignored"))


def _propose(door: Facade, subject: str) -> Any:
    batch = ProposalBatch(
        (AttributeProposal("diet", "carnivore", (), 0.5),),
        author="agent:one",
        owner_agent="agent:one",
        sharing="shared",
        purpose="personalization",
    )
    return door.submit_proposals(subject, batch)


def _consent(door: Facade, subject: str) -> Any:
    app = "app:planner" if door.principal.kind is not PrincipalKind.APP else None
    return door.grant_consent(
        subject,
        categories=["diet"],
        purposes=["personalization"],
        collected_by="consent-ui:1",
        app_id=app,
    )


def _slice(door: Facade, subject: str) -> Any:
    return door.slice(
        subject,
        "what do I like?",
        budget_tokens=200,
        purpose="personalization",
        agent_id="agent:one",
    )


def _erase(door: Facade, subject: str) -> Any:
    return door.erase_subject(subject)


def _audit(door: Facade, subject: str) -> Any:
    import io

    return door.export_audit(io.StringIO())


ACTIONS: dict[str, Callable[[Facade, str], Any]] = {
    "capture": _capture,
    "propose": _propose,
    "consent": _consent,
    "slice": _slice,
    "profile": lambda door, subject: door.profile(subject),
    "export": lambda door, subject: door.export_subject(subject),
    "erase": _erase,
    "audit": _audit,
    "residue": lambda door, subject: door.residue_scan(["cello"]),
    "rebuild": lambda door, subject: door.rebuild(),
}

#: Who may do what to subject "alice" (planner and calendar hold consents for her).
ALLOWED: dict[str, set[str]] = {
    # role:assistant: capture, propose and consent for personalization; reads via slices.
    "planner": {"capture", "propose", "consent", "slice"},
    # role:scheduler: nothing for purpose personalization, but slices are always served
    # (every item withheld by the kernel's gate instead of a refusal).
    "calendar": {"slice"},
    # No consent of the subject at all: answered as for an unknown subject (404), so it
    # cannot learn that the subject exists.
    "rogue": set(),
    # role:dpo: erase and export, nothing else (no consent of alice: no slices).
    "dpo": {"export", "erase"},
    # role:compliance: the audit trail and residue scans.
    "compliance": {"audit", "residue"},
    # An operator key is an operator for whole-profile work, and planner for app work.
    "planner-operator-key": {
        "capture",
        "propose",
        "consent",
        "slice",
        "profile",
        "export",
        "erase",
        "audit",
        "residue",
        "rebuild",
    },
    # The CLI is the operator; app work needs --app (it is no app itself).
    # Recording consent for an app is decided by that app's policy (here: planner's).
    "cli": {"consent", "profile", "export", "erase", "audit", "residue", "rebuild"},
    # A data subject: consent for any app, export and erase, for its own subject only.
    "alice-link": {"consent", "export", "erase"},
    "bob-link": set(),
}

REFUSALS = (PermissionDeniedError, InvalidInputError, SubjectNotFoundError)


def _prepare(kernel: Uprof, subject: str) -> None:
    consent(kernel, subject)
    kernel.grant_consent(subject, app_id="app:calendar", categories=["*"], purposes=["scheduling"])
    kernel.capture(subject, say("I want to run a marathon"))
    kernel.process()


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_every_action_for_every_principal_is_decided_by_the_policy(
    kernel: Uprof, action: str
) -> None:
    for name, principal in PRINCIPALS.items():
        # A fresh subject per principal: erasures must not change the next row.
        subject = f"alice-{name}"
        _prepare(kernel, subject)
        if principal.kind is PrincipalKind.USER:  # alice's link is hers; bob's is not
            principal = replace(principal, subject=subject if name == "alice-link" else "bob")
        door = Facade(kernel, principal)
        kernel.reads.drain()  # reads served to earlier rows are recorded before counting
        before = kernel.lag().log_position
        expected = action in ALLOWED[name]
        try:
            ACTIONS[action](door, subject)
        except REFUSALS as refused:
            assert not expected, f"{name} was refused {action}: {refused}"
            kernel.reads.drain()
            assert kernel.lag().log_position == before, f"{name}'s refused {action} wrote"
            continue
        except ConsentRequiredError as refused:
            raise AssertionError(f"{name}/{action}: unexpected {refused!r}") from None
        assert expected, f"{name} was allowed {action}"


def test_a_denial_is_audited_with_the_principal(kernel: Uprof) -> None:
    _prepare(kernel, "alice")
    door = Facade(kernel, PRINCIPALS["rogue"])
    with pytest.raises(PermissionDeniedError):
        door.capture("alice", say("I eat only meat", app="app:rogue"))
    kernel.reads.drain()
    denied = [e.entry for e in kernel.audit_log.entries(action="access.denied")]
    assert denied and denied[-1]["principal"] == "app:rogue#k3"
    assert denied[-1]["app_id"] == "app:rogue"


def test_every_audit_entry_of_a_call_names_who_asked(kernel: Uprof) -> None:
    _prepare(kernel, "alice")
    Facade(kernel, PRINCIPALS["dpo"]).export_subject("alice")
    result = Facade(kernel, PRINCIPALS["cli"]).erase_subject("alice")
    kernel.reads.drain()
    entries = [e.entry for e in kernel.audit_log.entries()]
    exported = [e for e in entries if e["action"] == "subject.exported"]
    assert exported[-1]["principal"] == "app:privacy-console#k4"
    erasure = [e for e in entries if e["action"] in ("erasure.requested", "key.destroyed")]
    assert {e["action"] for e in erasure} == {"erasure.requested", "key.destroyed"}
    assert {e.get("principal") for e in erasure} == {"operator:local#cli"}
    # The signed receipt's entry is derived from its body alone; the body names the
    # request, and the request's entry names who asked.
    requested = next(e for e in erasure if e["action"] == "erasure.requested")
    assert result.receipt["body"]["request"]["request_id"] == requested["request_id"]


def test_an_operator_acting_for_an_app_is_decided_by_that_app_and_audited_as_both(
    kernel: Uprof,
) -> None:
    _prepare(kernel, "alice")
    cli = Facade(kernel, PRINCIPALS["cli"])
    with pytest.raises(PermissionDeniedError):
        cli.capture("alice", say("no app named"))
    cli.for_app("app:planner").capture("alice", say("I want to swim"))
    with pytest.raises(PermissionDeniedError):
        cli.for_app("app:rogue").capture("alice", say("I want to swim"))
    kernel.reads.drain()
    accepted = [e.entry for e in kernel.audit_log.entries(action="capture.accepted")]
    assert accepted[-1]["principal"] == "operator:local#cli/as/app:planner"


def test_withdrawal_with_erase_by_an_operator_is_an_erasure_the_policy_decides(
    kernel: Uprof,
) -> None:
    """The planner may erase what it collected itself by withdrawing its consent (it has
    no ``erase`` rule); an operator that the policy denies ``erase`` cannot destroy the
    planner's data by withdrawing for it: refused before anything is written."""
    _prepare(kernel, "alice")
    _prepare(kernel, "bob")
    kernel.policy.revoke(
        requested_by="operator:test",
        role="role:operator",
        actions=["erase"],
        categories=["any"],
        purpose="erasure",
    )
    cli = Facade(kernel, PRINCIPALS["cli"])
    with pytest.raises(PermissionDeniedError):
        cli.erase_subject("alice")  # the narrowing is in force
    planner_consent = next(c for c in cli.consents("alice") if c.app_id == "app:planner")
    kernel.reads.drain()
    before = kernel.lag().log_position

    with pytest.raises(PermissionDeniedError):
        cli.withdraw_consent("alice", planner_consent.consent_id, erase=True)
    with pytest.raises(PermissionDeniedError):  # acting for another app: that app decides
        cli.for_app("app:calendar").withdraw_consent(
            "alice", planner_consent.consent_id, erase=True
        )

    kernel.reads.drain()
    assert kernel.lag().log_position == before
    assert cli.consents("alice")[0].withdrawn_at is None
    assert [m.text for m in kernel.profile("alice").memories] == ["I want to run a marathon"]
    # Withdrawing without erase is still the operator's to do; and the app itself (or
    # the operator acting for it) may withdraw its own consent with erase.
    assert cli.withdraw_consent("alice", planner_consent.consent_id) is None
    calendar = next(c for c in cli.consents("bob") if c.app_id == "app:calendar")
    assert (
        cli.for_app("app:calendar").withdraw_consent("bob", calendar.consent_id, erase=True) is None
    )
    planner = Facade(kernel, PRINCIPALS["planner"])
    own = next(c for c in planner.consents("bob") if c.app_id == "app:planner")
    assert planner.withdraw_consent("bob", own.consent_id, erase=True) is not None
    assert kernel.profile("bob").memories == ()


def test_an_app_cannot_act_as_another_apps_agent(kernel: Uprof) -> None:
    _prepare(kernel, "alice")
    planner = Facade(kernel, PRINCIPALS["planner"])
    with pytest.raises(InvalidInputError, match="agent_id"):
        planner.capture(
            "alice",
            Interaction(
                app_id="app:planner",
                agent_id="app:calendar/agent:one",
                occurred_at=WHEN,
                user_input="I want to fly",
                purpose="personalization",
            ),
        )


def test_consent_recorded_by_an_app_is_its_own_and_cites_its_record(kernel: Uprof) -> None:
    _prepare(kernel, "alice")
    planner = Facade(kernel, PRINCIPALS["planner"])
    with pytest.raises(InvalidInputError, match="collected_by"):
        planner.grant_consent("alice", categories=["diet"], purposes=["personalization"])
    with pytest.raises(PermissionDeniedError, match="own consents"):
        planner.grant_consent(
            "alice",
            categories=["diet"],
            purposes=["personalization"],
            collected_by="consent-ui:1",
            app_id="app:calendar",
        )
    calendar_consent = next(
        c for c in Facade(kernel, PRINCIPALS["cli"]).consents("alice") if c.app_id == "app:calendar"
    )
    with pytest.raises(SubjectNotFoundError):
        planner.withdraw_consent("alice", calendar_consent.consent_id)
    # "*" stands for what the policy lets the app hold consent for, never more.
    planner.grant_consent(
        "alice", categories=["*"], purposes=["personalization"], collected_by="consent-ui:2"
    )
    mine = planner.consents("alice")
    assert all(c.app_id == "app:planner" for c in mine)
    assert "health" not in {cat for c in mine for cat in c.categories}


def test_proposals_after_withdrawal_are_refused_not_silently_dropped(kernel: Uprof) -> None:
    consent_id = consent(kernel, "alice")
    kernel.capture("alice", say("I want to run"))
    kernel.process()
    kernel.withdraw_consent("alice", consent_id)
    before = kernel.lag().log_position
    with pytest.raises(ConsentRequiredError):
        _propose(Facade(kernel, PRINCIPALS["planner"]), "alice")
    assert kernel.lag().log_position == before
