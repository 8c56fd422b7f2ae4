"""The authorization policy of one tenant as an event-sourced aggregate.

Each change to who may do what is a past-tense event in the tenant's policy stream:
``Seeded`` (the first version, from a policy file), ``RuleAdded``/``RuleRemoved``
(``p`` rows) and ``RoleAssigned``/``RoleRevoked`` (``g`` rows). Every event carries
``requested_by``, the label of the principal that asked (an app key, the local operator),
so the stream itself says who changed the policy and when (the event timestamp).

Rows are plain tuples of strings in Casbin field order (``p``: subject, tenant, action,
category, purpose, effect; ``g``: member, role, tenant). Checking that a row is
well formed is the caller's job (``policies.rules``); the aggregate only refuses changes
that would not change anything, so a replayed stream always rebuilds the same policy.

The id is derived from the tenant (``policy_id``): a policy is not personal data (STYLE
P2), and two processes seeding the same tenant at once conflict instead of forking it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from eventsourcing.domain import Aggregate, event

#: Namespace of policy stream ids: ``uuid5(POLICY_NAMESPACE, tenant)``.
POLICY_NAMESPACE = uuid.UUID("6f1d2c3e-8a4b-5c6d-9e0f-0a1b2c3d4e5f")

Row = tuple[str, ...]


def policy_id(tenant: str) -> uuid.UUID:
    """Return the id of a tenant's policy stream."""
    return uuid.uuid5(POLICY_NAMESPACE, f"policy:{tenant}")


def _rows(values: Sequence[Sequence[str]]) -> list[list[str]]:
    # Lists, not tuples: aggregate state goes through JSON in snapshots.
    return [[str(field) for field in row] for row in values]


class TenantPolicy(Aggregate):
    """The rules and role assignments in force for one tenant, in the order they came."""

    @staticmethod
    def create_id(tenant: str, **_: Any) -> uuid.UUID:
        return policy_id(tenant)

    @event("Seeded")
    def __init__(
        self,
        tenant: str,
        source: str,
        source_sha256: str,
        rules: Sequence[Sequence[str]],
        assignments: Sequence[Sequence[str]],
        requested_by: str,
    ) -> None:
        self.tenant = tenant
        self.rules: list[list[str]] = _rows(rules)
        self.assignments: list[list[str]] = _rows(assignments)

    # --- queries -----------------------------------------------------------------------------

    def has_rule(self, rule: Sequence[str]) -> bool:
        return [str(f) for f in rule] in self.rules

    def has_assignment(self, assignment: Sequence[str]) -> bool:
        return [str(f) for f in assignment] in self.assignments

    def rows(self) -> list[tuple[str, ...]]:
        """Return casbin-style rows: ``("p", ...)`` then ``("g", ...)``."""
        return [("p", *r) for r in self.rules] + [("g", *a) for a in self.assignments]

    # --- commands (each refuses a change that changes nothing) -------------------------------

    def add_rule(self, rule: Sequence[str], requested_by: str) -> None:
        if self.has_rule(rule):
            raise ValueError("the rule is already in the policy")
        self._rule_added(list(rule), requested_by)

    def remove_rule(self, rule: Sequence[str], requested_by: str) -> None:
        if not self.has_rule(rule):
            raise ValueError("the rule is not in the policy")
        self._rule_removed(list(rule), requested_by)

    def assign_role(self, assignment: Sequence[str], requested_by: str) -> None:
        if self.has_assignment(assignment):
            raise ValueError("the role assignment is already in the policy")
        self._role_assigned(list(assignment), requested_by)

    def revoke_role(self, assignment: Sequence[str], requested_by: str) -> None:
        if not self.has_assignment(assignment):
            raise ValueError("the role assignment is not in the policy")
        self._role_revoked(list(assignment), requested_by)

    @event("RuleAdded")
    def _rule_added(self, rule: list[str], requested_by: str) -> None:
        self.rules.append([str(f) for f in rule])

    @event("RuleRemoved")
    def _rule_removed(self, rule: list[str], requested_by: str) -> None:
        wanted = [str(f) for f in rule]
        self.rules = [r for r in self.rules if r != wanted]

    @event("RoleAssigned")
    def _role_assigned(self, assignment: list[str], requested_by: str) -> None:
        self.assignments.append([str(f) for f in assignment])

    @event("RoleRevoked")
    def _role_revoked(self, assignment: list[str], requested_by: str) -> None:
        wanted = [str(f) for f in assignment]
        self.assignments = [a for a in self.assignments if a != wanted]
