"""Who is asking: a principal built only from authenticated credentials (I3, I4).

Every operation on uprof runs for one ``Principal``. Surfaces build it from what
authenticated the caller (an API key, a privacy-center link, the local operator's
access to the stores) and never from a request field; the facade (``uprof.facade``)
takes it and asks the policy about each action.

Agents belong to their app: an agent id means nothing on its own, so the owner of
an item is the *qualified* agent ``app_id/agent_id`` (``qualified_agent``). App B
naming "agent:one" is ``app:b/agent:one``, never app A's "agent:one".
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from domain.errors import InvalidInputError

#: Separates an app id from one of its agent ids in an owner reference. App ids and
#: agent ids are tokens that cannot contain it (``check_token`` refuses "/").
AGENT_SEPARATOR = "/"
#: The principal the command line acts as: whoever can read the data and key stores.
LOCAL_OPERATOR = "operator:local"
#: The policy subject every operator is decided as (seed: ``g, operators, role:operator``).
OPERATORS = "operators"
#: The background pipeline (extraction, projection, maintenance) when it writes.
SYSTEM_WORKER = "system:worker"
#: The app id a data subject acts as through a privacy-center link.
PRIVACY_CENTER = "privacy-center"
#: Names of principals that are not apps. An app so named would appear in the audit
#: trail as the operators, the local operator, the pipeline or the user themselves.
RESERVED_APP_IDS = frozenset({OPERATORS, LOCAL_OPERATOR, SYSTEM_WORKER, PRIVACY_CENTER})
#: Longest owner reference the views store (their owner columns are 128 wide).
MAX_OWNER_CHARS = 128


class PrincipalKind(StrEnum):
    APP = "app"  # an app, authenticated by an API key
    OPERATOR = "operator"  # the local operator (CLI), or an operator API key
    USER = "user"  # a data subject, through a privacy-center link, for one subject


def reserved_app_id_problem(app_id: str) -> str | None:
    """Say why ``app_id`` may not be an app's id (a key's, an onboarded app's), or None."""
    if app_id in RESERVED_APP_IDS:
        return (
            f"app_id: {app_id!r} names uprof's own principals (operators, the local "
            "operator, the pipeline, the privacy center), not an app; give the app another "
            "id (an operator key is a key with the operator role)"
        )
    return None


def qualified_agent(app_id: str, agent_id: str) -> str:
    """The owner reference of ``agent_id`` inside ``app_id`` (idempotent)."""
    if not agent_id:
        return ""
    if AGENT_SEPARATOR in agent_id:
        owner_app, _, _ = agent_id.partition(AGENT_SEPARATOR)
        if owner_app != app_id:
            raise InvalidInputError(
                "agent_id must be one of the calling app's own agents (no '/' in agent_id)",
                field="agent_id",
            )
        return agent_id
    owner = f"{app_id}{AGENT_SEPARATOR}{agent_id}"
    if len(owner) > MAX_OWNER_CHARS:
        raise InvalidInputError(
            f"agent_id is too long: app id and agent id together must be at most "
            f"{MAX_OWNER_CHARS - 1} characters",
            field="agent_id",
        )
    return owner


def app_of_owner(owner: str) -> str:
    """The app part of a qualified owner reference ("" for a legacy bare agent id)."""
    app_id, sep, _ = owner.partition(AGENT_SEPARATOR)
    return app_id if sep else ""


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    ``app_id`` is the Casbin subject the policy decides for. ``key_id`` names the
    credential (API key id, ``cli`` for the local operator, a privacy link id).
    ``acting_for`` is set when an operator acts as an app (``uprof capture --app``):
    the policy then decides for that app, and audit entries name both.
    ``subject`` is set for a user principal: the one data subject it may act for.
    """

    tenant: str
    app_id: str
    key_id: str
    kind: PrincipalKind
    roles: frozenset[str] = field(default_factory=frozenset)
    acting_for: str = ""
    subject: str = ""

    @classmethod
    def local_operator(cls, tenant: str) -> Principal:
        return cls(tenant, LOCAL_OPERATOR, "cli", PrincipalKind.OPERATOR, frozenset({"operator"}))

    @property
    def is_operator(self) -> bool:
        return self.kind is PrincipalKind.OPERATOR or "operator" in self.roles

    @property
    def policy_subject(self) -> str:
        """Whom the policy decides for: the app acted for, else the principal's app."""
        return self.acting_for or self.app_id

    @property
    def label(self) -> str:
        """How audit entries name this principal (a token: no personal data)."""
        base = f"{self.app_id}#{self.key_id}"
        return f"{base}/as/{self.acting_for}" if self.acting_for else base

    def as_app(self, app_id: str) -> Principal:
        """An operator acting as ``app_id``; any other principal is refused."""
        if not self.is_operator:
            raise InvalidInputError("only an operator may act for another app")
        if not app_id or AGENT_SEPARATOR in app_id:
            raise InvalidInputError("app must be an app id such as app:planner")
        return replace(self, acting_for=app_id)

    def owner(self, agent_id: str) -> str:
        """The qualified owner reference of one of this principal's agents."""
        return qualified_agent(self.policy_subject, agent_id)


#: The principal whose call is running in this context (set by ``uprof.facade``);
#: the audit trail names it in every entry written meanwhile.
acting_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "uprof_acting_principal", default=None
)
#: The check that the running call's credential (its API key) still stands, set with
#: ``acting_principal`` when the edge that authenticated gave one; it raises once the
#: key is revoked. A write that waits for its turn on another thread (the capture
#: writer's group) asks it there, where the write happens (bug TW).
acting_credential: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "uprof_acting_credential", default=None
)
