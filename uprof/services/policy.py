"""Policy as an event-sourced store: who may do what, changed only by recorded events.

The policy of a tenant is one ``domain.policy.TenantPolicy`` stream in its own
eventsourcing application (``PolicyApplication``, name ``policies``): on SQLite the file
``policies.sqlite`` beside the other stores, on PostgreSQL the tables ``policies_events``
and ``policies_snapshots``. On first start the stream is seeded from the policy file
(``Settings.policy_path``, the packaged seed by default) as one ``Seeded`` event.
Every later change is an event (``RuleAdded``, ``RuleRemoved``, ``RoleAssigned``,
``RoleRevoked``) naming who asked, and a ``policy.changed`` audit entry.

``StoredPolicyAuthorizer`` answers every policy check from the stream's state:

- **Other processes.** Before a decision (or a batch, such as one slice's categories) it
  compares the store's highest notification id with the one it loaded, at most once per
  ``refresh_s`` seconds, and reloads when it moved. A change committed by another process is
  therefore in force here for every decision that starts more than ``refresh_s`` after the
  commit (plus the reload, a few milliseconds). Changes made through this process's
  ``PolicyService`` are in force at once.
- **Fail closed.** If the store cannot be read (or holds a policy that does not load), every
  check denies with a reason saying so, and ``health()`` (``/readyz``) reports it, until a
  later check reads the store again.

The policy in force at any past time is rebuilt from the events up to that time
(``PolicyService.show(at=...)``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.application import ProcessingEvent
from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import EventStore, Mapper, Recording

from audit.entry import validate_entry
from audit.errors import AuditEntryError
from domain.errors import StoredDataDamagedError, UprofError, VersionConflictError
from domain.policy import TenantPolicy, policy_id
from domain.values import CATEGORIES
from policies.authorizer import AccessDecision, CasbinAuthorizer, PolicyDeniedError
from policies.rules import (
    ACTIONS,
    ALLOW,
    ANY_PURPOSE,
    EFFECTS,
    ROLE_PREFIX,
    ROOT_CATEGORY,
    PolicyError,
    PolicyRule,
    RoleAssignment,
    app_id_problem,
    parse_policy_text,
    policy_from_rows,
    purpose_problem,
    role_problem,
)
from uprof import retry
from uprof.backends import SNAPSHOT_RECORDER_TOPIC
from uprof.backends.damage import store_damage
from uprof.eventstore import rows_checked_snapshot_store
from uprof.ports import AuditTrail
from uprof.recorders import ConflictsAsDomainErrors
from uprof.services.erasure import StillAllowed
from uprof.services.policy_seal import PolicyRowMapper, SealedPolicyLog, policy_log_id

_log = logging.getLogger(__name__)

#: Default bound on how stale a process's policy may be after another process changed it.
DEFAULT_REFRESH_S = 0.25
#: Snapshot the policy stream every N events, so loading costs the same at any history length.
POLICY_SNAPSHOT_INTERVAL = 100
#: The audit action of every policy change.
POLICY_CHANGED = "policy.changed"
#: The audit action written when the policy store is found damaged (every check denies).
POLICY_STORE_DAMAGED = "policy.store_damaged"
#: Who seeds the policy on first start.
SEEDED_BY = "system:bootstrap"

_CHANGE_OF_EVENT = {
    "Seeded": "seeded",
    "RuleAdded": "rule.added",
    "RuleRemoved": "rule.removed",
    "RoleAssigned": "role.assigned",
    "RoleRevoked": "role.revoked",
}


class PolicyInputError(PolicyError):
    """A policy change was refused because of one named field; nothing was changed."""

    hint = "fix the named field and retry; the policy in force was not changed"

    def __init__(self, field: str, problem: str) -> None:
        """Name the field and say what is wrong with it (never repeating a bad value)."""
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class PolicyStoreError(UprofError):
    """The policy store cannot be read or written; every policy check denies meanwhile."""

    hint = (
        "check the policy store (policies.sqlite or the policies_* tables); "
        "policy checks deny until it can be read"
    )


def _refusal_of(decision: AccessDecision) -> UprofError:
    """The error a refused check raises: the policy's "no" (``PolicyDeniedError``, 403),
    or, for a denial the policy did not decide because its store could not be read, the
    store's error (``PolicyStoreError``, 503 ``policy_store_unavailable`` with
    ``Retry-After``; a damaged store its damage, 500). Fails closed all the same: the
    request stops here. An outage answered 403 read as a "no" to an agent, which then
    did not retry (review of 0186 and 0188's Left, bug QL); the one place for every
    route, tool, SDK call, console page and CLI command."""
    if decision.store_error is not None:
        return decision.store_error(decision.reason)
    return PolicyDeniedError(decision)


class PolicyApplication(SealedPolicyLog, ConflictsAsDomainErrors[UUID]):
    """The event store of every tenant's policy stream: not personal data, so not
    encrypted, but sealed (``uprof.services.policy_seal``): every row tagged under the
    deployment's plain-row key, every stream's head anchored in the key store."""

    name = "policies"
    snapshotting_intervals = {TenantPolicy: POLICY_SNAPSHOT_INTERVAL}  # noqa: RUF012

    def __init__(self, env: dict[str, str], *, keystore: Any) -> None:
        self.keystore = keystore
        super().__init__(env)
        self.log_id = policy_log_id(self.env)

    def construct_mapper(self) -> Mapper[UUID]:
        return PolicyRowMapper(self.construct_transcoder(), self.keystore)

    def construct_snapshot_store(self) -> EventStore[UUID]:
        """The snapshot store, its recorder the backend's checked one where the store's
        settings name it (``uprof.backends.policy_recorders``): a policy stream with a
        snapshot is read from that table first (0238-shapes-under-running-processes, WT)."""
        topic = self.env.get(SNAPSHOT_RECORDER_TOPIC)
        if not topic:
            return super().construct_snapshot_store()
        return rows_checked_snapshot_store(self, topic)

    def _record(self, processing_event: ProcessingEvent[UUID]) -> list[Recording[UUID]]:
        """Record, then raise each written stream's anchor (after the commit: 0132)."""
        recordings = super()._record(processing_event)
        newest: dict[str, Any] = {}
        first: dict[str, int] = {}
        for recording in recordings:
            n = recording.notification
            stream = str(UUID(str(n.originator_id)))
            if stream not in newest or newest[stream].originator_version < n.originator_version:
                newest[stream] = n
            first[stream] = min(first.get(stream, n.originator_version), n.originator_version)
        if newest:
            self.anchor_saved(newest, first)
        return recordings


@dataclass(frozen=True)
class PolicyState:
    """The policy of a tenant at one version; version 0 means none (everything denied)."""

    tenant: str
    version: int
    at: datetime | None
    rules: tuple[PolicyRule, ...]
    assignments: tuple[RoleAssignment, ...]


@dataclass(frozen=True)
class PolicyChange:
    """One recorded change: the stream version it made, when, what and who asked.

    ``row`` is the casbin row (``("p", ...)`` or ``("g", ...)``); empty for ``seeded``,
    which says where the first version came from (``source``) and how many rows it held.
    """

    version: int
    at: datetime
    change: str
    row: tuple[str, ...]
    requested_by: str
    source: str = ""
    rows: int = 0


@dataclass(frozen=True)
class PolicyChangeResult:
    """What a grant, revoke or onboarding did; ``changes`` is empty when nothing changed."""

    version: int
    changes: tuple[PolicyChange, ...]


# --- the authorizer in force ----------------------------------------------------------------


class StoredPolicyAuthorizer:
    """A ``CasbinAuthorizer`` kept in step with the policy store; denies when it cannot be.

    Decisions carry the policy stream's version as ``policy_version``. ``monotonic`` is the
    clock that paces the store checks (tests replace it to step past ``refresh_s``).
    """

    def __init__(
        self,
        service: PolicyService,
        model_text: str,
        *,
        refresh_s: float = DEFAULT_REFRESH_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Build with an empty policy; the first check loads the store."""
        self._service = service
        self._inner = CasbinAuthorizer(model_text, policy_from_rows([]))
        self._inner.reload([], version=0)
        self.refresh_s = refresh_s
        self.monotonic = monotonic
        # Re-entrant: a look's own load that finds damage tells it here (``found_damaged``).
        self._lock = threading.RLock()
        self._head: int | None = None
        self._version = 0
        self._checked_at: float | None = None
        #: Looks at the store begun so far (under the lock): a request that waited for
        #: the lock takes the answer of a look that began after it asked (bug OM).
        self._looks_begun = 0
        #: Whether the last look failed (not "not read yet": the first load is waited for).
        self._known_down = False
        self._failure = "the policy store has not been read yet"
        #: The damage behind ``_failure``, when it is damage and not an unreadable store.
        self._damage: StoredDataDamagedError | None = None

    # --- keeping in step ---------------------------------------------------------------------

    def refresh(self, *, force: bool = False) -> str:
        """Check the store (when due, or now with force); return the failure, or ''.

        During an outage one look may wait ~22 s (eventsourcing's ten tries of the pool's
        wait, bug NK), and looks are taken one at a time. So (bug OM): a failed look is
        remembered from when it answered, not from when it began; a request that waited
        for a look which began after it asked takes that look's answer; and while the
        store is known not to answer, a request does not wait for the look in flight at
        all: it is denied at once (fail closed), as it would be by that look. A forced
        look (``health``, ``refusal``) still waits and looks now, so recovery is seen as
        soon as the store answers (0176's MH)."""
        asked = self._looks_begun  # read before waiting: a later look answers this request
        if self._known_down and not force:
            if not self._lock.acquire(blocking=False):
                return self._failure  # the look in flight is the one to see the store back
        else:
            self._lock.acquire()
        try:
            if self._looks_begun != asked:
                return self._failure  # a look that began after this request answered it
            now = self.monotonic()
            due = force or self._checked_at is None or now - self._checked_at >= self.refresh_s
            if not due:
                return self._failure
            self._checked_at = now
            self._looks_begun += 1
            self._look()
            self._known_down = bool(self._failure)
            if self._known_down:
                self._checked_at = self.monotonic()  # remembered from its answer (OM)
            return self._failure
        finally:
            self._lock.release()

    def _look(self) -> None:
        """Read the store's head (and its rows when it moved) into ``_failure``, under
        the lock."""
        try:
            head = self._service.head()
            if head != self._head or self._failure:
                version, rows = self._service.current_rows()
                self._inner.reload(rows, version=version)
                self._head, self._version = head, version
            self._failure, self._damage = "", None
        except StoredDataDamagedError as error:  # fail closed, named, logged, audited
            self._damaged(error)
        except Exception as error:  # fail closed: an unreadable store denies everything
            damage = store_damage(error)
            if damage is not None:  # the driver's damage (0214-store-damage-in-servers, SI)
                self._damaged(damage)
                return
            if not self._failure:
                _log.exception("policy store unreadable; every policy check denies")
            self._failure = f"policy store unreadable ({type(error).__name__})"
            self._damage = None

    def found_damaged(self, error: StoredDataDamagedError) -> None:
        """A load of the store found ``error`` (the policy's own routes, a change, this
        authorizer's look): every check denies for it from now on, until a look reads the
        store whole again. The looks read only the store's head while it does not move,
        so damage met by ``uprof policy show`` or a change (a row or a column altered in
        place) left every check allowing by the policy read before
        (0238-shapes-under-running-processes, bugs WS, WT)."""
        with self._lock:
            self._damaged(error)
            self._known_down = True
            self._checked_at = self.monotonic()

    def _damaged(self, error: StoredDataDamagedError) -> None:
        """Every check denies for ``error``, reported once (a table of the wrong shape
        under a running server was an "unreadable" store: 503 "retry", bug SI)."""
        failure = str(error)
        if self._failure != failure:
            self._service.report_damage(error)
        self._failure, self._damage = failure, error

    def health(self) -> str:
        """Check the store now; return why checks deny, or '' when the policy is in force."""
        return self.refresh(force=True)

    def refusal(self) -> UprofError | None:
        """Check the store now; the error a request refused for its state raises, or None
        when the policy is in force: the damage itself (500 ``stored_data_damaged``, an
        operator repairs it), or ``PolicyStoreError`` for a store that cannot be read (503,
        retried). Not one for both: a damaged store was answered as an outage, "retry in
        5 s", in the privacy center (review of 0174, 0176 and 0177, bug MY)."""
        failure = self.refresh(force=True)
        damage = self._damage  # another thread may have looked since: the same failure only
        if not failure:
            return None
        if damage is not None and str(damage) == failure:
            return type(damage)(failure)  # a fresh one: raised by any number of requests
        return PolicyStoreError(failure)

    @property
    def policy_version(self) -> int:
        """The policy stream version in force (0 before the first load)."""
        return self._version

    def _denied(self, failure: str) -> AccessDecision:
        """The denial of every check while the store fails; it names the error a request
        that must not read it as the policy's raises (``refusal``'s choice)."""
        damage = self._damage
        error: type[UprofError] = (
            type(damage) if damage is not None and str(damage) == failure else PolicyStoreError
        )
        return AccessDecision(
            False, (), f"{failure}: every policy check denies", self._version, store_error=error
        )

    # --- checks (the CasbinAuthorizer surface) -----------------------------------------------

    def decide(
        self, *, app_id: str, tenant: str, action: str, category: str, purpose: str
    ) -> AccessDecision:
        """Return the decision for one request; never raises."""
        failure = self.refresh()
        if failure:
            return self._denied(failure)
        return self._inner.decide(
            app_id=app_id, tenant=tenant, action=action, category=category, purpose=purpose
        )

    def is_allowed(
        self, *, app_id: str, tenant: str, action: str, category: str, purpose: str
    ) -> bool:
        """Return whether the policy allows the request; never raises."""
        return self.decide(
            app_id=app_id, tenant=tenant, action=action, category=category, purpose=purpose
        ).allowed

    def authorize(
        self, *, app_id: str, tenant: str, action: str, category: str, purpose: str
    ) -> AccessDecision:
        """Return the allowing decision or raise PolicyDeniedError."""
        decision = self.decide(
            app_id=app_id, tenant=tenant, action=action, category=category, purpose=purpose
        )
        if not decision.allowed:
            raise _refusal_of(decision)
        return decision

    def decisions_for(
        self, *, app_id: str, tenant: str, action: str, purpose: str, categories: Iterable[str]
    ) -> dict[str, AccessDecision]:
        """Decide one request per category, with one store check for the batch."""
        if isinstance(categories, str):
            msg = "categories must be an iterable of category names, not one string"
            raise TypeError(msg)
        failure = self.refresh()
        if failure:
            return {category: self._denied(failure) for category in categories}
        return self._inner.decisions_for(
            app_id=app_id, tenant=tenant, action=action, purpose=purpose, categories=categories
        )

    def authorize_all(
        self, *, app_id: str, tenant: str, action: str, purpose: str, categories: Iterable[str]
    ) -> tuple[AccessDecision, ...]:
        """Require every category to be allowed; raise PolicyDeniedError for the first denial."""
        names = list(categories)
        if not names:
            msg = "authorize_all needs at least one category; an empty check allows nothing"
            raise PolicyError(msg)
        decisions = self.decisions_for(
            app_id=app_id, tenant=tenant, action=action, purpose=purpose, categories=names
        )
        for decision in decisions.values():
            if not decision.allowed:
                raise _refusal_of(decision)
        return tuple(decisions.values())

    # --- the policy as data ------------------------------------------------------------------

    def policy_table(self, tenant: str) -> Any:
        """Return "who may do what" in tenant (empty when the store is unreadable)."""
        if self.refresh():
            return ()
        return self._inner.policy_table(tenant)

    def rules(self, tenant: str | None = None) -> tuple[PolicyRule, ...]:
        return () if self.refresh() else self._inner.rules(tenant)

    def role_assignments(self, tenant: str | None = None) -> tuple[RoleAssignment, ...]:
        return () if self.refresh() else self._inner.role_assignments(tenant)


# --- the service ----------------------------------------------------------------------------


class PolicyService:
    """Show, change and replay the policy of one tenant; every change is an event and audited.

    ``known_app(app_id)`` says whether an app exists outside the policy (it has a live API
    key); an app the policy already names is known too. ``seed_text`` is the policy file the
    stream starts from, ``seed_source`` how history names it (a file name, no path).
    """

    def __init__(
        self,
        app: PolicyApplication,
        *,
        tenant: str,
        model_text: str,
        seed_text: str,
        seed_source: str,
        audit: AuditTrail,
        known_app: Callable[[str], bool] = lambda _app_id: False,
        refresh_s: float = DEFAULT_REFRESH_S,
    ) -> None:
        """Wire the store; ``ensure_seeded`` records the first version."""
        self.app = app
        self.tenant = tenant
        self._id = policy_id(tenant)
        self._seed_text = seed_text
        self._seed_source = seed_source
        self._audit = audit
        self._known_app = known_app
        self._write_lock = threading.Lock()
        self.authorizer = StoredPolicyAuthorizer(self, model_text, refresh_s=refresh_s)

    # --- reading the store -------------------------------------------------------------------

    def head(self) -> int:
        """Return the store's highest notification id (0 when empty): the cheap change check."""
        return int(self.app.recorder.max_notification_id() or 0)

    def current_rows(self) -> tuple[int, list[tuple[str, ...]]]:
        """Return the version and casbin rows of the policy in force (0 and none if unseeded)."""
        policy = self._load()
        if policy is None:
            return 0, []
        return policy.version, policy.rows()

    def _load(self) -> TenantPolicy | None:
        """The tenant's policy, checked against its anchor (``PolicyStoreDamagedError``);
        damage found is every check's answer from then on (``found_damaged``)."""
        try:
            policy = self.app.load_checked(self._id)
        except StoredDataDamagedError as error:
            self.authorizer.found_damaged(error)
            raise
        if policy is None:
            return None
        assert isinstance(policy, TenantPolicy)
        return policy

    def anchor_policy(self) -> None:
        """Anchor every tenant's policy stream at its head as stored now, where it has no
        anchor (``uprof restore``, after the key store's anchors were replaced), and
        read the policy again."""
        self.app.anchor_missing_heads(self.app.policy_streams())
        self.authorizer.refresh(force=True)

    def report_damage(self, error: StoredDataDamagedError) -> None:
        """Log and audit that the policy store was found damaged (every check denies)."""
        _log.error("%s; every policy check denies: %s", error, error.hint)
        try:
            self._audit.record(
                POLICY_STORE_DAMAGED,
                tenant=self.tenant,
                reason_code="stored_data_damaged",
                outcome="every_check_denied",
            )
        except Exception:  # the denial stands whether or not the entry could be written
            _log.exception("could not audit the damaged policy store")

    def ensure_seeded(self) -> bool:
        """Record the first version from the policy file unless the stream exists.

        Safe with many processes: the stream id comes from the tenant, so a second process
        seeding at the same moment conflicts and keeps the first one's version. Rows of
        other tenants in the file are left out. Returns True when this call seeded.
        """
        try:
            if self._load() is not None:
                return False
        except StoredDataDamagedError:
            # Never seeded over: the damage is the policy store's, and every check denies
            # (the authorizer reads the store again and names it).
            return False
        seed = parse_policy_text(self._seed_text, source=self._seed_source).for_tenant(self.tenant)
        policy = TenantPolicy(
            tenant=self.tenant,
            source=self._seed_source,
            source_sha256=hashlib.sha256(self._seed_text.encode()).hexdigest(),
            rules=[list(r.fields()) for r in seed.rules],
            assignments=[list(a.fields()) for a in seed.assignments],
            requested_by=SEEDED_BY,
        )
        try:
            self.app.save(policy)
        except VersionConflictError:
            return False  # another process seeded first
        self._audit.record(
            POLICY_CHANGED,
            requested_by=SEEDED_BY,
            change="seeded",
            policy_version=str(policy.version),
            policy_sha256=hashlib.sha256(self._seed_text.encode()).hexdigest(),
            counts={"rules": len(seed.rules), "assignments": len(seed.assignments)},
        )
        self.authorizer.refresh(force=True)
        return True

    def show(self, at: datetime | None = None) -> PolicyState:
        """Return the policy in force now, or at time ``at`` (rebuilt from the events to then)."""
        if at is None:
            policy = self._load()
        else:
            if at.tzinfo is None:
                raise PolicyInputError("at", "needs a timezone (e.g. 2026-01-01T00:00:00Z)")
            self._load()  # the stream whole (its anchor), before reading it back
            version = 0
            for stored in self.app.events.get(self._id):
                # The store types events by protocol; its events are DomainEvents (timed).
                assert isinstance(stored, DomainEvent)
                if stored.timestamp > at:
                    break
                version = stored.originator_version
            policy = None
            if version:
                got: TenantPolicy = self.app.repository.get(self._id, version=version)
                assert isinstance(got, TenantPolicy)
                policy = got
        if policy is None:
            return PolicyState(self.tenant, 0, None, (), ())
        return PolicyState(
            self.tenant,
            policy.version,
            policy.modified_on,
            tuple(PolicyRule(*r) for r in policy.rules),
            tuple(RoleAssignment(*a) for a in policy.assignments),
        )

    def history(self) -> list[PolicyChange]:
        """Return every change of the tenant's policy, oldest first."""
        self._load()  # the stream whole (its anchor), before reading it back
        return [_change_of(e) for e in self.app.events.get(self._id)]

    # --- changing it -------------------------------------------------------------------------

    def grant(
        self,
        *,
        requested_by: str,
        app_id: str | None = None,
        role: str | None = None,
        actions: Sequence[str] = (),
        categories: Sequence[str] = (),
        purpose: str | None = None,
        effect: str = ALLOW,
        still_allowed: StillAllowed | None = None,
    ) -> PolicyChangeResult:
        """Give ``app_id`` a role (app_id and role, nothing else), or add rules.

        Rules: every action x category for the purpose, to ``app_id`` or to ``role``
        (exactly one). Rows already in force are skipped; all the rest are recorded
        together or not at all. Raises PolicyInputError naming the bad field.
        """
        return self._change(
            "grant",
            requested_by,
            app_id,
            role,
            actions,
            categories,
            purpose,
            effect,
            still_allowed=still_allowed,
        )

    def revoke(
        self,
        *,
        requested_by: str,
        app_id: str | None = None,
        role: str | None = None,
        actions: Sequence[str] = (),
        categories: Sequence[str] = (),
        purpose: str | None = None,
        effect: str = ALLOW,
        still_allowed: StillAllowed | None = None,
    ) -> PolicyChangeResult:
        """Take a role away or remove rules (the same shapes as ``grant``).

        Every named row must be in force, else PolicyInputError and nothing changes.
        """
        return self._change(
            "revoke",
            requested_by,
            app_id,
            role,
            actions,
            categories,
            purpose,
            effect,
            still_allowed=still_allowed,
        )

    def onboard(
        self,
        app_id: str,
        *,
        read: Sequence[str],
        purpose: str,
        capture: Sequence[str] | None = None,
        propose: Sequence[str] | None = None,
        requested_by: str,
        still_allowed: StillAllowed | None = None,
    ) -> PolicyChangeResult:
        """Grant a new app direct rules: read, capture and propose these categories for purpose.

        ``capture`` and ``propose`` default to the ``read`` categories; pass ``[]`` to grant
        none. Capturing apps also get ``capture conversation`` (what a raw capture is),
        and ``consent`` for everything they may read or capture. The app need not be
        known yet (onboarding is how it becomes known).
        """
        label = _checked_label(requested_by)
        _check_app(app_id, field="app_id")
        categories = {
            "read": _checked_categories(read, field="read", allow_empty=False),
            "capture": _checked_categories(
                read if capture is None else capture, field="capture", allow_empty=True
            ),
            "propose": _checked_categories(
                read if propose is None else propose, field="propose", allow_empty=True
            ),
        }
        _check_purpose(purpose)
        # The door authorizes a raw capture under "conversation" (uprof.facade), and an
        # app records consent only for what it may read or capture: both come with it.
        if categories["capture"] and "conversation" not in categories["capture"]:
            categories["capture"] = [*categories["capture"], "conversation"]
        categories["consent"] = sorted({*categories["read"], *categories["capture"]})
        rows = [
            PolicyRule(app_id, self.tenant, action, category, purpose, ALLOW)
            for action, names in categories.items()
            for category in names
        ]
        return self._apply(
            label, [("rule", row) for row in rows], adding=True, still_allowed=still_allowed
        )

    def _change(
        self,
        verb: str,
        requested_by: str,
        app_id: str | None,
        role: str | None,
        actions: Sequence[str],
        categories: Sequence[str],
        purpose: str | None,
        effect: str,
        *,
        still_allowed: StillAllowed | None,
    ) -> PolicyChangeResult:
        label = _checked_label(requested_by)
        adding = verb == "grant"
        wants_rules = bool(actions or categories or purpose)
        if not wants_rules:
            if not app_id or not role:
                raise PolicyInputError(
                    "role",
                    "give app_id and role to assign a role, or actions, categories "
                    "and purpose to change rules",
                )
            problem = role_problem(role)
            if problem:
                raise PolicyInputError("role", problem)
            _check_app(app_id, field="app_id")
            current = self._current_policy()
            if adding and role not in _roles_named(current):
                raise PolicyInputError(
                    "role", "unknown role: no rule or assignment of this tenant names it"
                )
            if adding:
                self._require_known_app(app_id, current)
            assignment = RoleAssignment(app_id, role, self.tenant)
            return self._apply(
                label, [("assignment", assignment)], adding=adding, still_allowed=still_allowed
            )
        if bool(app_id) == bool(role):
            raise PolicyInputError(
                "app_id", "rules go to exactly one subject: give app_id or role, not both"
            )
        if role:
            problem = role_problem(role)
            if problem:
                raise PolicyInputError("role", problem)
        else:
            assert app_id is not None
            _check_app(app_id, field="app_id")
            if adding:
                self._require_known_app(app_id, self._current_policy())
        checked_actions = _checked_actions(actions)
        checked_categories = _checked_categories(categories, field="categories", allow_empty=False)
        if purpose is None:
            raise PolicyInputError("purpose", "is required for rules (or '*' for every purpose)")
        _check_purpose(purpose)
        if effect not in EFFECTS:
            raise PolicyInputError("effect", f"must be one of {', '.join(EFFECTS)}")
        subject = role or app_id
        assert subject is not None
        rows = [
            PolicyRule(subject, self.tenant, action, category, purpose, effect)
            for action in checked_actions
            for category in checked_categories
        ]
        return self._apply(
            label, [("rule", row) for row in rows], adding=adding, still_allowed=still_allowed
        )

    def _current_policy(self) -> TenantPolicy | None:
        try:
            return self._load()
        except StoredDataDamagedError:
            raise  # named as the policy store's damage, not as an unreadable store
        except Exception as error:
            raise PolicyStoreError(f"policy store unreadable ({type(error).__name__})") from None

    def _require_known_app(self, app_id: str, policy: TenantPolicy | None) -> None:
        named = policy is not None and (
            any(r[0] == app_id for r in policy.rules)
            or any(a[0] == app_id for a in policy.assignments)
        )
        if not named and not self._known_app(app_id):
            raise PolicyInputError(
                "app_id",
                "unknown app: it has no API key and the policy does not name it "
                "(create it with `uprof apps create`)",
            )

    def _apply(
        self,
        requested_by: str,
        items: Sequence[tuple[str, PolicyRule | RoleAssignment]],
        *,
        adding: bool,
        still_allowed: StillAllowed | None = None,
    ) -> PolicyChangeResult:
        """Record every change of items in one save, then audit them; all or nothing.

        ``still_allowed``: the caller's decision (its credential and the policy), asked
        again once the change has its turn and before each attempt stages it: the wait
        for the write lock and a conflict's retries come after the caller decided, and
        a key revoked meanwhile must change nothing (bug SN)."""
        with self._write_lock:
            # Another process changed the policy first (VersionConflictError): re-stage on
            # top of its change.
            policy, pending, entries = retry.POLICY_CHANGE.call(
                lambda: self._stage_and_save(
                    requested_by, items, adding=adding, still_allowed=still_allowed
                )
            )
        if not pending:
            return PolicyChangeResult(policy.version, ())
        self._audit.record_many([(POLICY_CHANGED, fields) for fields in entries])
        self.authorizer.refresh(force=True)
        return PolicyChangeResult(policy.version, tuple(_change_of(e) for e in pending))

    def _stage_and_save(
        self,
        requested_by: str,
        items: Sequence[tuple[str, PolicyRule | RoleAssignment]],
        *,
        adding: bool,
        still_allowed: StillAllowed | None = None,
    ) -> tuple[TenantPolicy, list[Any], list[dict[str, Any]]]:
        """Stage items on the policy in force and save them (nothing saved when nothing
        changes). Raises VersionConflictError when another process saved first."""
        if still_allowed is not None:
            still_allowed()
        policy = self._current_policy()
        if policy is None:
            raise PolicyStoreError("the policy store has not been seeded")
        pending = self._stage(policy, requested_by, items, adding=adding)
        if not pending:
            return policy, [], []
        entries = [_audit_fields(policy, event) for event in pending]
        for fields in entries:
            try:
                validate_entry({"action": POLICY_CHANGED, **fields})
            except AuditEntryError as error:
                raise PolicyInputError("app_id", f"cannot be audited: {error}") from None
        self.app.save(policy)
        return policy, pending, entries

    @staticmethod
    def _stage(
        policy: TenantPolicy,
        requested_by: str,
        items: Sequence[tuple[str, PolicyRule | RoleAssignment]],
        *,
        adding: bool,
    ) -> list[Any]:
        """Apply items to policy as pending events; refuse a revoke of a row not in force."""
        for kind, item in items:
            fields = list(item.fields())
            present = policy.has_rule(fields) if kind == "rule" else policy.has_assignment(fields)
            if not adding and not present:
                raise PolicyInputError(
                    "role" if kind == "assignment" else "rule",
                    f"not in the policy in force: {item.render()}",
                )
        for kind, item in items:
            fields = list(item.fields())
            if kind == "rule":
                if adding and not policy.has_rule(fields):
                    policy.add_rule(fields, requested_by)
                elif not adding and policy.has_rule(fields):
                    policy.remove_rule(fields, requested_by)
            elif adding and not policy.has_assignment(fields):
                policy.assign_role(fields, requested_by)
            elif not adding and policy.has_assignment(fields):
                policy.revoke_role(fields, requested_by)
        return list(policy.pending_events)

    def health(self) -> str:
        """Return why policy checks deny (the store is unreadable), or '' when all is well."""
        return self.authorizer.health()

    def refusal(self) -> UprofError | None:
        """The error for the store's state, looked at now (``StoredPolicyAuthorizer.refusal``)."""
        return self.authorizer.refusal()

    def close(self) -> None:
        self.app.close()


# --- helpers --------------------------------------------------------------------------------


def _change_of(event: Any) -> PolicyChange:
    name = type(event).__name__
    change = _CHANGE_OF_EVENT.get(name, name)
    if change == "seeded":
        return PolicyChange(
            event.originator_version,
            event.timestamp,
            change,
            (),
            event.requested_by,
            source=event.source,
            rows=len(event.rules) + len(event.assignments),
        )
    row = getattr(event, "rule", None)
    kind = "p"
    if row is None:
        row, kind = event.assignment, "g"
    return PolicyChange(
        event.originator_version,
        event.timestamp,
        change,
        (kind, *(str(f) for f in row)),
        event.requested_by,
    )


def _audit_fields(policy: TenantPolicy, event: Any) -> dict[str, Any]:
    change = _change_of(event)
    return {
        "requested_by": change.requested_by,
        "change": change.change,
        "rule": list(change.row),
        "policy_version": str(change.version),
    }


def _checked_label(requested_by: str) -> str:
    if not isinstance(requested_by, str) or not requested_by.strip():
        raise PolicyInputError("requested_by", "is empty: every policy change names who asked")
    try:
        validate_entry({"action": POLICY_CHANGED, "requested_by": requested_by})
    except AuditEntryError:
        raise PolicyInputError(
            "requested_by", "must be a principal label such as operator:local#cli"
        ) from None
    return requested_by


def _check_app(app_id: object, *, field: str) -> None:
    problem = app_id_problem(app_id)
    if problem:
        raise PolicyInputError(field, problem)


def _check_purpose(purpose: object) -> None:
    if purpose == ANY_PURPOSE:
        return
    problem = purpose_problem(purpose)
    if problem:
        raise PolicyInputError("purpose", problem)


def _checked_actions(actions: Sequence[str]) -> list[str]:
    names = [a.strip() for a in _as_list(actions, "actions") if a.strip()]
    if not names:
        raise PolicyInputError("actions", "name at least one action")
    for name in names:
        if name not in ACTIONS:
            raise PolicyInputError(
                "actions", f"unknown action (expected one of {', '.join(ACTIONS)})"
            )
    return list(dict.fromkeys(names))


def _checked_categories(categories: Sequence[str], *, field: str, allow_empty: bool) -> list[str]:
    names = [c.strip() for c in _as_list(categories, field) if c.strip()]
    if not names and not allow_empty:
        raise PolicyInputError(field, "name at least one category")
    for name in names:
        if name != ROOT_CATEGORY and name not in CATEGORIES:
            raise PolicyInputError(
                field,
                f"unknown category (expected {ROOT_CATEGORY!r} or one of {', '.join(CATEGORIES)})",
            )
    return list(dict.fromkeys(names))


def _as_list(values: Sequence[str], field: str) -> list[str]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise PolicyInputError(field, "must be a list of names")
    return list(values)


def _roles_named(policy: TenantPolicy | None) -> set[str]:
    if policy is None:
        return set()
    named = {r[0] for r in policy.rules if r[0].startswith(ROLE_PREFIX)}
    named |= {a[1] for a in policy.assignments}
    return named
