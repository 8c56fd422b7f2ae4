"""The one authorized door: every operation, for one authenticated principal.

REST, MCP, the web pages, the SDK's embedded mode and the CLI build a ``Principal``
from whatever authenticated the caller and call these methods; none of them calls
the kernel (``uprof.kernel.Uprof``) for an operation itself. An import-linter
contract in pyproject.toml keeps it so.

What is decided here, for every call:

- **Who.** The principal comes from authentication. The app an operation runs
  for is the principal's (or, for an operator, the app it explicitly acts for);
  an ``app_id`` inside a request is never trusted.
- **May they.** Casbin decides each action (deny by default) for the principal's
  app: ``capture`` (category ``conversation``), ``propose`` (each proposal's
  category), ``consent`` (each category and purpose granted), ``read`` (slices:
  gated per item by the kernel), ``inspect`` (full profile and evidence views),
  ``export`` (subject export), ``erase``, ``audit`` (audit trail, verification,
  residue scans), ``policy`` (policy changes) and ``operate`` (pipeline runs,
  rebuilds, maintenance). An operator principal (the CLI, or an API key with
  the operator role) is decided as the policy subject ``operators`` for
  ``inspect``, ``audit``, ``erase``, ``export`` (unless it acts for an app) and
  ``operate`` (operator only); an app as itself. A denial is audited and raised
  as ``PermissionDeniedError`` (403); nothing is written.
- **Whose agents.** An agent belongs to its app: owners and readers are qualified
  as ``app/agent`` before they reach the kernel (``domain.principal``).
- **Data subjects** (privacy-center principals) act only on their own subject and
  exercise their rights (consent for any app, erasure, export) without the
  operator's policy: those rights are not the operator's to withhold.
- **Audit.** Every entry written while a call runs names the principal
  (``uprof.adapters.audit_trail`` reads ``domain.principal.acting_principal``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from os import PathLike
from typing import TYPE_CHECKING, Any, TextIO, TypeVar
from uuid import UUID

from audit.entry import normalise_timestamp
from audit.export import ExportSummary
from audit.receipts import RECEIPT_ACTION
from domain.errors import (
    ConsentNotFoundError,
    ConsentRequiredError,
    IdentityError,
    IntentNotFoundError,
    InvalidInputError,
    PermissionDeniedError,
    SubjectNotFoundError,
    UprofError,
)
from domain.normalise import match_described, normalise_value
from domain.principal import (
    LOCAL_OPERATOR,
    OPERATORS,
    PRIVACY_CENTER,
    Principal,
    PrincipalKind,
    acting_credential,
    acting_principal,
    reserved_app_id_problem,
)
from domain.values import (
    CATEGORIES,
    ConsentGrant,
    IntentUpdateProposal,
    Interaction,
    ProposalBatch,
    check_token,
    text_problem,
)
from policies.rules import purpose_problem
from policies.visibility import is_visible
from uprof.kernel import Lag, Uprof
from uprof.services.capture import CaptureAck
from uprof.services.erasure import ErasureResult, HostSettled
from uprof.services.extraction import category_of
from uprof.services.idempotency import client_wait_ends
from uprof.services.import_formats import FORMATS as IMPORT_FORMATS
from uprof.services.import_formats import FileLines, ImportDefaults, ImportProblem
from uprof.services.importer import ImportReport
from uprof.services.paging import (
    Listing,
    Page,
    Position,
    check_limit,
    paginate,
    parse_time_key,
    time_key,
)
from uprof.services.policy import (
    PolicyChange,
    PolicyChangeResult,
    PolicyInputError,
    PolicyState,
    PolicyStoreError,
)
from uprof.services.profile import EvidenceView, ProfileView
from uprof.services.quarantine import QuarantinedCapture, RetryOutcome, retried_before
from uprof.services.residue import ResidueReport
from uprof.services.slices import ProfileSlice
from uprof.services.subjects import NAMESPACE_SEPARATOR, SubjectRequest

if TYPE_CHECKING:
    from audit.check import CheckResult, Kind
    from uprof.apikeys.store import ApiKeyInfo, IssuedKey
    from uprof.services.backup import BackupReport, Partial
    from uprof.services.idempotency import Outcome

_T = TypeVar("_T")

__all__ = [
    "IMPORT_FORMATS",
    "PRIVACY_CENTER",
    "AuditStream",
    "CaptureAck",
    "ErasureResult",
    "EvidenceView",
    "ExportSummary",
    "Facade",
    "FileLines",
    "ImportDefaults",
    "ImportProblem",
    "ImportReport",
    "Lag",
    "Page",
    "PolicyChange",
    "PolicyChangeResult",
    "PolicyInputError",
    "PolicyState",
    "PolicyStoreError",
    "Principal",
    "PrincipalKind",
    "ProfilePage",
    "ProfileSlice",
    "ProfileView",
    "QuarantinedCapture",
    "ResidueReport",
    "RetryOutcome",
    "SubjectListed",
    "SubjectRequest",
    "retried_before",
]

#: Category every raw capture is authorized under (what a capture is before extraction).
CAPTURE_CATEGORY = "conversation"
#: Purposes the governance actions are decided for.
ERASURE_PURPOSE = "erasure"
ACCESS_PURPOSE = "access-request"
COMPLIANCE_PURPOSE = "compliance"
OPERATIONS_PURPOSE = "operations"
#: ``reason_code`` of the ``console.sign_in_refused`` entry of a key revoked while its
#: sign-in waited for the log's turn (its ``console.signed_in`` was not written).
SIGN_IN_KEY_REVOKED = "key-revoked"
#: ``reason_code`` of the ``access.denied`` entry of a key refused for a missing role.
ROLE_REQUIRED = "role-required"
#: ``reason_code`` of the ``access.denied`` entry of a slice whose names did not resolve
#: to one subject (a session or identifier unknown to the app, names that disagree).
IDENTITY_UNRESOLVED = "identity-unresolved"
#: A stream being read (an audit export) asks the policy again after this many records.
STREAM_RECHECK_RECORDS = 500
#: Most terms one residue scan looks for. Each term adds needles to the match of every
#: file and every value (until decision 0187-residue-at-scale, a query per table column:
#: 53 ms per term on an empty PostgreSQL database, growing with the data): unbounded,
#: the console's form (one term a line, up to the body limit) held a server thread and a
#: connection for hours per post (hostile callers round 8, bug LS). An auditor's terms
#: for one subject are a handful.
MAX_RESIDUE_TERMS = 100
#: Longest term, in characters (review of 0187, bug PC). A term's needles (its spellings,
#: normal forms and encodings: ``residue_files.needles``) are compiled into the scan's
#: patterns, in the file scan's child and, on PostgreSQL, in this process, and the file
#: scan's chunks overlap by the longest needle; their cost grows with the term's length:
#: until 2026-12-06 100 terms of 3,000 Greek letters took 24.5 s of CPU and 2.3 GB to
#: compile, and one of a million characters exhausts memory. A name, an e-mail address
#: or the telling part of a phrase fits.
MAX_RESIDUE_TERM_CHARS = 200


@contextlib.contextmanager
def client_waits_at_most(seconds: float | None) -> Iterator[None]:
    """Serve the requests inside this block (on this thread, or a task copied from it)
    knowing that their client waits ``seconds`` for an answer (None: it did not say): a
    keyed write waiting for its first request gives up within that (bug LV,
    ``uprof.services.idempotency.client_wait_ends``)."""
    ends = client_wait_ends.set(None if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        client_wait_ends.reset(ends)


@dataclass(frozen=True)
class AuditStream:
    """An audit export being produced: its media type, file name and text records."""

    media_type: str
    filename: str
    records: Iterator[str]


@dataclass(frozen=True)
class ProfilePage:
    """What the privacy center's profile page shows, read and recorded at once
    (``Facade.profile_page``): the attributes, intents and consents, one page of
    memories, the captures the items shown cite, and who read those items."""

    view: ProfileView
    memories: Page[Any]
    captures: dict[str, Any]
    reads: list[Any]
    #: Consents withdrawn with ``erase`` whose erasure is not finished (the page offers
    #: to finish each: the withdrawal with ``erase`` asked again).
    erasures_unfinished: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SubjectListed:
    """A live subject as the subjects list shows it: its audit pseudonym, never its reference."""

    pseudonym: str
    created_at: datetime


def _residue_term_problem(term: str) -> str:
    """Why no store can be searched for ``term`` (the residue scan's), or ''."""
    if len(term) > MAX_RESIDUE_TERM_CHARS:
        return (
            f"{len(term)} characters, at most {MAX_RESIDUE_TERM_CHARS}; give the most "
            "telling part of the text (a name, an address, a few words)"
        )
    if not term.strip():
        # A blank term is in everything: PostgreSQL finds '' in every value of every
        # column, and a space is in nearly every file, a report of residue everywhere
        # (the CLI passed a script's empty variable through; review of 0173, bug ME).
        return "a blank term is found in every store; give the text to look for"
    # A NUL failed PostgreSQL's scan (a 500 from the console), a lone surrogate (a byte
    # of the command line that is not UTF-8) every scan, naming no field (bug MW).
    problem = text_problem(term)
    return f"{problem}; give the text to look for" if problem else ""


class Facade:
    """Every operation uprof offers, run for one authenticated principal."""

    def __init__(
        self,
        kernel: Uprof,
        principal: Principal,
        *,
        still_authenticated: Callable[[], None] | None = None,
    ) -> None:
        """``still_authenticated`` raises when the principal's credential (an API key)
        no longer stands; the edge that authenticated passes it, and a read that waits
        (a slice's read-your-writes) asks it again before it serves."""
        self._kernel = kernel
        self.principal = principal
        self._still_authenticated = still_authenticated

    def now(self) -> datetime:
        return self._kernel.clock.now()

    def idempotent(
        self,
        key: str,
        operation: str,
        body: dict[str, Any],
        execute: Callable[[str], tuple[dict[str, Any], int]],
    ) -> Outcome:
        """Run a keyed write at most once per (this principal's app, key) (I14).

        Keys belong to the app the principal acts for, so app B reusing app A's key
        never receives A's answer. ``execute(token)`` is one of this facade's writes; a
        replay runs it again, so it is authorized like a fresh call (fail closed).
        """
        with self._as_principal():
            return self._kernel.idempotent(
                self.principal.policy_subject, key, operation, body, execute
            )

    def for_app(self, app_id: str) -> Facade:
        """The same operator, acting for ``app_id`` (its policy decides; audited as both)."""
        return Facade(
            self._kernel,
            self.principal.as_app(app_id),
            still_authenticated=self._still_authenticated,
        )

    # ------------------------------------------------------------ decisions

    @contextlib.contextmanager
    def _as_principal(self) -> Iterator[None]:
        token = acting_principal.set(self.principal)
        credential = acting_credential.set(self._still_authenticated)
        try:
            yield
        finally:
            acting_credential.reset(credential)
            acting_principal.reset(token)

    def _authorize(self, action: str, categories: Sequence[str], purpose: str) -> None:
        """Casbin decides for the principal's app; a denial is audited, then raised."""
        if self.principal.kind is PrincipalKind.USER:
            raise PermissionDeniedError(f"a data subject's link cannot {action}")
        self._decide(self.principal.policy_subject, action, categories, purpose)

    def _authorize_operator(self, action: str, categories: Sequence[str], purpose: str) -> None:
        """Operator work: an operator principal, decided as the policy's ``operators``.

        The operator role comes from authentication (the CLI's access to the stores,
        or an API key created with the operator role); the policy still decides
        what operators may do, so a deployment can narrow it.
        """
        if not self.principal.is_operator:
            raise PermissionDeniedError(
                f"{action} needs an operator principal (an API key with the operator role)"
            )
        self._decide(OPERATORS, action, categories, purpose)

    def _authorize_governance(self, action: str, purpose: str) -> None:
        """Governance over whole profiles (inspect, audit, erase, export).

        An operator is decided as the policy's ``operators``; an app (a DPO console
        with ``role:dpo``, a compliance console with ``role:compliance``) as itself.
        """
        if self.principal.is_operator and not self.principal.acting_for:
            self._authorize_operator(action, CATEGORIES, purpose)
        else:
            self._authorize(action, CATEGORIES, purpose)

    def _check(self, action: str, categories: Sequence[str], purpose: str) -> None:
        """``_authorize`` without auditing a denial: raises PermissionDeniedError, writes
        nothing (the caller then goes through ``_authorize``, which audits)."""
        if self.principal.kind is PrincipalKind.USER:
            raise PermissionDeniedError(f"a data subject's link cannot {action}")
        self._ask_policy(self.principal.policy_subject, action, categories, purpose)

    def _ask_policy(
        self, policy_subject: str, action: str, categories: Sequence[str], purpose: str
    ) -> None:
        if policy_subject == OPERATORS and not self.principal.is_operator:
            # An app whose id is the policy's name for operators (a key issued before the
            # key store refused that id, or embedded code naming it) is not an operator.
            # (A role's name is refused by the authorizer: app_id_problem.)
            raise PermissionDeniedError(
                f"app {OPERATORS!r} is not an operator: {OPERATORS!r} is the policy's "
                "name for operators, and this principal has no operator role"
            )
        self._ask_authorizer(policy_subject, action, categories, purpose)

    def _ask_authorizer(
        self, policy_subject: str, action: str, categories: Sequence[str], purpose: str
    ) -> None:
        """The policy's answer for ``policy_subject`` itself, whoever asks (raises
        PermissionDeniedError); ``_ask_policy`` first checks the principal may ask it."""
        self._kernel.authorizer.authorize_all(
            app_id=policy_subject,
            tenant=self._kernel.subjects.tenant,
            action=action,
            purpose=purpose,
            categories=list(categories),
        )

    def _decide(
        self,
        policy_subject: str,
        action: str,
        categories: Sequence[str],
        purpose: str,
        *,
        ask: Callable[[str, str, Sequence[str], str], None] | None = None,
    ) -> None:
        try:
            (ask or self._ask_policy)(policy_subject, action, categories, purpose)
        except PermissionDeniedError as denied:
            with self._as_principal():
                self._kernel.audit.record(
                    "access.denied",
                    app_id=policy_subject,
                    purpose=purpose if _is_token(purpose) else None,
                    reason_code=action,
                )
            raise denied from None

    def role_refused(self, role: str) -> None:
        """Audit a refusal at the door for a key without ``role`` (REST answers 403
        ``role_required``), naming the principal like every other ``access.denied``."""
        with self._as_principal():
            self._kernel.audit.record(
                "access.denied",
                app_id=self.principal.app_id,
                reason_code=ROLE_REQUIRED,
                rule=role,
            )

    def _refuse_users(self, what: str) -> None:
        if self.principal.kind is PrincipalKind.USER:
            raise PermissionDeniedError(f"a data subject's link cannot do {what}")

    def _own_subject(self, subject: str) -> None:
        """A data subject's principal acts on its own subject only."""
        if self.principal.kind is PrincipalKind.USER and subject != self.principal.subject:
            raise PermissionDeniedError("a privacy link acts for its own subject only")

    def _reader(self, agent_id: str) -> str:
        return self.principal.owner(agent_id)

    def _namespaced(self, value: str | None) -> str | None:
        if value is None:
            return None
        return f"{self.principal.policy_subject}{NAMESPACE_SEPARATOR}{value.strip()}"

    # --------------------------------------------------------------- capture

    def capture(
        self, subject: str, interaction: Interaction, *, request_token: str | None = None
    ) -> CaptureAck:
        return self.capture_many(subject, [interaction], request_token=request_token)[0]

    def capture_many(
        self,
        subject: str,
        interactions: Sequence[Interaction],
        *,
        request_token: str | None = None,
    ) -> list[CaptureAck]:
        """Capture as the principal's app; the policy must allow ``capture``."""
        bound = [self._bind(i) for i in interactions]
        for purpose in sorted({i.purpose for i in bound}):
            self._authorize("capture", [CAPTURE_CATEGORY], purpose)
        with self._as_principal():
            return self._kernel.capture_many(subject, bound, request_token=request_token)

    async def capture_async(
        self, subject: str, interactions: Sequence[Interaction]
    ) -> list[CaptureAck]:
        """``capture_many`` (without a request token) for a coroutine on an event loop.

        The policy decides here, on the loop (an in-memory decision); a denial is
        audited, and the audit entry is a write, so a denied request is run through
        ``capture_many`` on a worker thread, which decides again, audits and raises.
        """
        bound = [self._bind(i) for i in interactions]
        try:
            for purpose in sorted({i.purpose for i in bound}):
                self._check("capture", [CAPTURE_CATEGORY], purpose)
        except PermissionDeniedError:
            return await asyncio.to_thread(self.capture_many, subject, interactions)
        with self._as_principal():
            return await self._kernel.capture_async(subject, bound)

    def _bind(self, interaction: Interaction) -> Interaction:
        return replace(
            interaction,
            app_id=self.principal.policy_subject,
            agent_id=self._reader(interaction.agent_id),
        )

    # ------------------------------------------------------------- proposals

    def submit_proposals(
        self,
        subject: str,
        batch: ProposalBatch,
        *,
        observed_at: datetime | None = None,
        request_token: str | None = None,
    ) -> int:
        """Propose as the principal's app and agent; every category must be allowed.

        Refused (nothing written) when the policy denies any proposal's category, or
        when the app holds no consent in force for them: a proposal that would be
        dropped silently is an error the caller must see. An app that holds no consent
        of the subject is answered as for a subject that does not exist. An intent
        update counts in its intent's category, and moves only an intent its agent may
        see (``_bind_intent_updates``).
        """
        self._own_subject(subject)
        bound = replace(
            batch,
            app_id=self.principal.policy_subject,
            owner_agent=self._reader(batch.owner_agent),
            author=self._reader(batch.author) if batch.author else batch.author,
        )
        # The policy first, as for captures: its answer does not depend on the subject.
        named = {c for p in bound.proposals if (c := category_of(p))}
        if named:
            self._authorize("propose", sorted(named), bound.purpose)
        self._known_to_app(subject)
        bound, updated = self._bind_intent_updates(subject, bound)
        if updated - named:
            self._authorize("propose", sorted(updated - named), bound.purpose)
        categories = sorted(named | updated)

        def decide() -> None:
            if categories:
                self._authorize("propose", categories, bound.purpose)

        with self._as_principal():
            missing = self._kernel.unconsented(subject, bound.app_id, categories, bound.purpose)
            if missing:
                raise ConsentRequiredError(
                    f"app {bound.app_id!r} has no consent in force for category "
                    f"{missing[0]!r} and purpose {bound.purpose!r}"
                )
            # Decided again once the kernel has waited for the subject's views (the
            # evidence check reads them), before anything is written: a key revoked or a
            # right taken away during the wait writes nothing (review of 0108/0109, as
            # reads that wait, 0106). A consent withdrawn meanwhile is the aggregate's to
            # refuse: it applies no proposal without a consent in force at write time.
            return self._kernel.submit_proposals(
                subject,
                bound,
                observed_at=observed_at,
                request_token=request_token,
                still_allowed=lambda: self._decided_again(decide),
            )

    def _bind_intent_updates(
        self, subject: str, batch: ProposalBatch
    ) -> tuple[ProposalBatch, set[str]]:
        """Bind each intent update to an active intent the proposing agent may see; the
        categories of those intents.

        An update names its intent by id or by description, and carries no category of
        its own. Sent on as it came, the aggregate would match it among all of the
        subject's intents, another agent's private ones included, with no policy or
        consent asked. Here it is matched among the intents visible to the batch's agent
        (the slices' rule), by the aggregate's own matching, and sent on by id; an
        intent it may not see is answered as one that does not exist.
        """
        if not any(isinstance(p, IntentUpdateProposal) for p in batch.proposals):
            return batch, set()
        with self._as_principal():
            view = self._kernel.profile(subject, with_memories=False)
        visible = {
            i.item_id: i
            for i in view.intents
            if i.status == "active" and is_visible(i.owner_agent, i.sharing, batch.owner_agent, "")
        }
        described = {item_id: normalise_value(i.description) for item_id, i in visible.items()}
        bound: list[Any] = []
        categories: set[str] = set()
        for proposal in batch.proposals:
            if isinstance(proposal, IntentUpdateProposal):
                item_id = proposal.intent_id or match_described(proposal.description, described)
                if item_id not in visible:
                    raise IntentNotFoundError(
                        "no active intent with that id or description that this agent may see"
                    )
                categories.add(visible[item_id].category)
                proposal = replace(proposal, intent_id=item_id, description="")
            bound.append(proposal)
        return replace(batch, proposals=tuple(bound)), categories

    # --------------------------------------------------------------- consent

    def grant_consent(
        self,
        subject: str,
        *,
        categories: Sequence[str],
        purposes: Sequence[str],
        legal_basis: str = "consent",
        expires_at: datetime | None = None,
        collected_by: str = "",
        app_id: str | None = None,
        request_token: str | None = None,
    ) -> str:
        """Record a consent the user gave.

        An app records consent for itself only, citing its own consent record
        (``collected_by``) and holding the policy's ``consent`` action for every
        category and purpose. A data subject (privacy center) or the operator may
        record it for any app (``app_id``).
        """
        target = self._consent_app(app_id)
        for purpose in purposes:  # malformed input is a 422 naming the field, not a denial
            problem = purpose_problem(purpose.strip())
            if problem is not None:
                raise InvalidInputError(f"purposes: {problem}", field="purposes")
        if collected_by.strip():
            check_token("collected_by", collected_by.strip())
        if self.principal.kind is PrincipalKind.APP and not collected_by.strip():
            raise InvalidInputError(
                "collected_by must name the app's record of the user's consent "
                "(e.g. consent-ui:2024-05-01:1234)",
                field="collected_by",
            )
        if self.principal.kind is not PrincipalKind.USER:
            categories = self._consentable(target, categories, purposes)
        self._own_subject(subject)
        with self._as_principal():
            return self._kernel.grant_consent(
                subject,
                app_id=target,
                categories=categories,
                purposes=purposes,
                legal_basis=legal_basis,
                expires_at=expires_at,
                collected_by=collected_by.strip() or self.principal.label,
                request_token=request_token,
            )

    def _consent_app(self, app_id: str | None) -> str:
        own = self.principal.policy_subject
        if app_id is None or app_id == own:
            if self.principal.kind is PrincipalKind.USER:
                raise InvalidInputError("app_id must name the app the consent is for")
            return own
        if self.principal.kind is PrincipalKind.APP:
            raise PermissionDeniedError("an app may record or change only its own consents")
        return app_id

    def _consentable(
        self, app_id: str, categories: Sequence[str], purposes: Sequence[str]
    ) -> list[str]:
        """The categories the consent may name, after the policy's ``consent`` action.

        Named categories must each be allowed for every purpose (else 403). ``*``
        stands for every category the app may record consent for, for all the
        purposes given: an app never holds consent its policy does not let it collect.
        """
        named = [c.strip() for c in categories]
        if "*" not in named or not purposes:
            for purpose in purposes:
                self._authorize_for(app_id, "consent", named, purpose)
            return named
        allowed = list(CATEGORIES)
        for purpose in purposes:
            decisions = self._kernel.authorizer.decisions_for(
                app_id=app_id,
                tenant=self._kernel.subjects.tenant,
                action="consent",
                purpose=purpose,
                categories=list(CATEGORIES),
            )
            permitted = [c for c in allowed if decisions[c].allowed]
            if not permitted:
                # Nothing to consent to for this purpose: let the policy refuse (audited).
                self._authorize_for(app_id, "consent", allowed, purpose)
            allowed = permitted
        return allowed

    def _authorize_for(
        self, app_id: str, action: str, categories: Sequence[str], purpose: str
    ) -> None:
        principal = self.principal
        if principal.is_operator and app_id != principal.policy_subject:
            # The operator records on behalf of an app: the app's policy decides.
            Facade(self._kernel, principal.as_app(app_id))._authorize(action, categories, purpose)
            return
        self._authorize(action, categories, purpose)

    def consents(self, subject: str) -> list[Any]:
        """The principal's app's consents (all apps' for a subject or the operator).

        An app that was never granted a consent of the subject gets subject_not_found,
        as for a subject that does not exist: whether another app knows a person is not
        this app's to learn (``_known_to_app``).
        """
        self._own_subject(subject)
        self._known_to_app(subject)  # before the profile read, which waits for the views
        with self._as_principal():
            view = self._kernel.profile(subject)
        # The profile waited for the views: the key (revoked meanwhile?) and the subject's
        # own link are asked again before the consents leave, as for ``list_consents``.
        # A withdrawal with ``erase`` (REST, MCP ``forget``, the privacy center) reads
        # them here before it withdraws and erases (review of 0108/0109).
        self._decided_again(lambda: self._own_subject(subject))
        if self.principal.kind is PrincipalKind.APP:
            own = [c for c in view.consents if c.app_id == self.principal.policy_subject]
            if not own and not self.principal.is_operator:
                raise SubjectNotFoundError("no such subject")
            return own
        return list(view.consents)

    def _known_to_app(self, subject: str) -> None:
        """Refuse, as for an unknown subject, an app that was never granted a consent of
        ``subject`` (operators and the subject itself are not asked).

        Decided before anything waits for the subject's views
        (``Uprof.has_held_consent``): a wait, and the ``read_timeout`` it may end in, is
        only ever for a subject that exists, so it must not come first."""
        if self.principal.kind is PrincipalKind.APP and not self.principal.is_operator:
            app = self.principal.policy_subject
            with self._as_principal():
                if not self._kernel.has_held_consent(subject, app):
                    raise SubjectNotFoundError("no such subject")

    def consents_in_force(self, subject: str) -> list[ConsentGrant]:
        """The consents not withdrawn that the principal may withdraw (an app: its own;
        a subject or operator: all of the subject's), read from the subject's stream.

        Unlike ``consents`` this waits for no view: a withdrawal must not depend on the
        pipeline having caught up (docs/governance.md). An app holding none of the
        subject's consents in force gets the unknown subject's answer.
        """
        self._own_subject(subject)
        own = self.principal.kind is PrincipalKind.APP
        with self._as_principal():
            held = self._kernel.consents_in_force(
                subject, app_id=self.principal.policy_subject if own else None
            )
        if own and not held and not self.principal.is_operator:
            raise SubjectNotFoundError("no such subject")
        return held

    def withdraw_consent(
        self,
        subject: str,
        consent_id: str,
        *,
        erase: bool = False,
        request_token: str | None = None,
        withdrawn_at: datetime | None = None,
    ) -> ErasureResult | None:
        """Withdraw a consent: an app only its own; a subject or operator any of theirs.

        Withdrawing only ever narrows what an app holds, so no policy is asked; nor for
        ``erase`` by the subject, or by an app of what it collected itself. An operator's
        ``erase`` destroys an app's data on the operator's word: an erasure, decided by
        the policy as erasing an event is (a deployment may deny operators ``erase``).

        A consent in force is found in the subject's stream and withdrawn at once,
        whatever the pipeline's lag; only a withdrawal with ``erase`` (which erases what
        the views list) or of a consent no longer in force (a retry) reads the views.
        """
        self._own_subject(subject)
        if not erase and self._holds(subject, consent_id):
            with self._as_principal():
                return self._kernel.withdraw_consent(
                    subject, consent_id, request_token=request_token, withdrawn_at=withdrawn_at
                )
        grant = next((c for c in self.consents(subject) if c.consent_id == consent_id), None)
        if grant is None:
            raise ConsentNotFoundError("no consent with that id for this subject and app")
        # Not an app erasing its own collection: the operator's (or, acting for another
        # app, that app's) ``erase``. Decided again after the kernel's own wait, before it
        # withdraws and erases (hostile callers round 9, bug QV: NI's rule, which this
        # door missed).
        governed = self.principal.is_operator and grant.app_id != self.principal.acting_for
        still_allowed = self._erasure_decided(subject, governed=governed) if erase else None
        with self._as_principal():
            return self._kernel.withdraw_consent(
                subject,
                consent_id,
                erase=erase,
                request_token=request_token,
                withdrawn_at=withdrawn_at,
                still_allowed=still_allowed,
            )

    def _holds(self, subject: str, consent_id: str) -> bool:
        """Whether ``consent_id`` is a consent in force the principal may withdraw; any
        doubt (an unknown or erased subject, another app's consent) is False, and the
        caller then answers as it always has, through the views."""
        try:
            held = self.consents_in_force(subject)
        except UprofError:
            return False
        return any(c.consent_id == consent_id for c in held)

    # ---------------------------------------------------------------- slices

    def slice(
        self,
        subject: str | SubjectRequest,
        query: str,
        *,
        budget_tokens: int,
        purpose: str,
        agent_id: str,
        agent_type: str = "",
        now: datetime | None = None,
        lexical_only: bool = False,
        wait_timeout_s: float | None = None,
    ) -> ProfileSlice:
        """The slice the principal's app and agent may see (the kernel gates every item)."""
        if self.principal.kind is PrincipalKind.USER:
            raise PermissionDeniedError("slices are served to apps")
        if self.principal.kind is PrincipalKind.OPERATOR and not self.principal.acting_for:
            raise PermissionDeniedError("an operator reads slices as an app: name it (--app)")
        request = (
            subject if isinstance(subject, SubjectRequest) else SubjectRequest(subject=subject)
        )
        request = replace(
            request,
            session_id=self._namespaced(request.session_id),
            identifier=self._namespaced(request.identifier),
        )
        with self._as_principal(), self._identity_refusals_audited():
            return self._kernel.slice(
                request,
                query,
                budget_tokens=budget_tokens,
                purpose=purpose,
                app_id=self.principal.policy_subject,
                agent_id=self._reader(agent_id),
                agent_type=agent_type,
                now=now,
                lexical_only=lexical_only,
                wait_timeout_s=wait_timeout_s,
                principal=self.principal.label,
                still_authenticated=self._still_authenticated,
            )

    @contextlib.contextmanager
    def _identity_refusals_audited(self) -> Iterator[None]:
        """Record ``access.denied`` for a request refused because its names do not
        resolve to one subject (I5): a refusal at the boundary, like a policy's."""
        try:
            yield
        except IdentityError:
            self._kernel.audit.record(
                "access.denied",
                app_id=self.principal.policy_subject,
                reason_code=IDENTITY_UNRESOLVED,
            )
            raise

    def register_session(self, session_id: str, subject: str) -> None:
        """Bind a session id, inside this app's namespace, to a subject.

        No policy is asked: the binding lives in the app's own namespace and only
        ever changes how that app's own later requests resolve.
        """
        self._refuse_users("registering sessions")
        self._known_to_app(subject)
        with self._as_principal():
            self._kernel.register_session(
                self._namespaced(session_id) or "", subject, app_id=self.principal.policy_subject
            )

    def register_identifier(self, identifier: str, subject: str) -> None:
        """Bind an identifier, inside this app's namespace, to a subject (no policy asked)."""
        self._refuse_users("registering identifiers")
        self._known_to_app(subject)
        with self._as_principal():
            self._kernel.register_identifier(
                self._namespaced(identifier) or "", subject, app_id=self.principal.policy_subject
            )

    # ------------------------------------------------------- profile views

    # Every read below that returns a subject's data records it (``subject.read``,
    # ``_recorded``) after the read and before the answer leaves: a read whose record
    # fails is not answered (decision 0102-subject-reads-audited).

    def _reader_purpose(self, subject: str) -> str:
        """Decide a read of the subject's data; return the purpose it was decided for.

        A data subject reads its own (the right of access, ``access-request``); anyone
        else needs the policy's ``inspect`` (``operations``)."""
        if self.principal.kind is PrincipalKind.USER:
            self._own_subject(subject)
            return ACCESS_PURPOSE
        self._authorize_governance("inspect", OPERATIONS_PURPOSE)
        return OPERATIONS_PURPOSE

    def _decided_again(self, decide: Callable[[], _T]) -> _T:
        """Ask the key and the policy again, after a read and before its answer leaves.

        A whole-view read (a profile, an item's evidence, an export) waits for the
        subject's views, up to ``read_wait_timeout_s``: a key revoked (any process) or a
        right the policy took away during the wait refuses the read here, as a slice's
        does after its wait (decision 0106-profile-reads-decided-after-the-wait). The
        policy's refusal is audited as at the first decision."""
        if self._still_authenticated is not None:
            self._still_authenticated()
        return decide()

    def _incarnation(self, subject: str) -> UUID | None:
        """The stream the name stands for now, looked up *before* a recorded read, so that
        the record can tell whether the name still stands for what was read."""
        handle = self._kernel.subjects.find(subject)
        return handle.stream_id if handle is not None else None

    def _recorded(
        self,
        subject: str,
        reason: str,
        counts: dict[str, int],
        item_refs: Sequence[str] = (),
        *,
        read_from: UUID | None,
    ) -> None:
        """Decide the read again (``_decided_again``), then record it (``subject.read``,
        with the purpose decided), before the answer leaves. ``read_from``: the subject's
        stream as ``_incarnation`` gave it before the read."""
        purpose = self._decided_again(lambda: self._reader_purpose(subject))
        with self._as_principal():
            self._kernel.record_subject_read(
                subject,
                reason=reason,
                purpose=purpose,
                app_id=self.principal.app_id,
                counts=counts,
                item_refs=item_refs,
                read_from=read_from,
            )

    def profile(self, subject: str, *, as_of: datetime | None = None) -> ProfileView:
        """The whole, ungated profile: the policy's ``inspect`` over every category."""
        self._authorize_governance("inspect", OPERATIONS_PURPOSE)
        read_from = self._incarnation(subject)
        with self._as_principal():
            view = self._kernel.profile(subject, as_of=as_of)
        self._recorded(subject, "profile", _profile_counts(view), read_from=read_from)
        return view

    def evidence(self, subject: str, item_id: str) -> EvidenceView:
        """One item and the captures behind it: ``inspect``, or a data subject its own."""
        self._reader_purpose(subject)
        read_from = self._incarnation(subject)
        with self._as_principal():
            found = self._kernel.evidence(subject, item_id)
        self._recorded(
            subject,
            "evidence",
            {"captures": len(found.captures)},
            [found.item_id],
            read_from=read_from,
        )
        return found

    def evidence_captures(self, subject: str, capture_ids: set[str]) -> dict[str, Any]:
        """The subject's captured events behind items (its own subject, or ``inspect``)."""
        self._reader_purpose(subject)
        read_from = self._incarnation(subject)
        with self._as_principal():
            found = self._kernel.evidence_captures(subject, capture_ids)
        self._recorded(subject, "captures", {"captures": len(found)}, read_from=read_from)
        return found

    def profile_page(
        self, subject: str, *, memory_cursor: str | None = None, memories: int | None = None
    ) -> ProfilePage:
        """The privacy center's profile page, read and recorded as one read (``reason_code``
        ``profile``): the layers, a page of memories, the captures behind the items shown
        and who read them. A data subject its own; anyone else ``inspect``."""
        self._reader_purpose(subject)
        read_from = self._incarnation(subject)
        with self._as_principal():
            view = self._kernel.profile(subject, with_memories=False)
            page = self._memories(subject, memory_cursor, memories)
            cited = {e for a in view.attributes for e in a.evidence}
            cited |= {e for m in page.items for e in m.evidence}
            cited |= {e for i in view.intents for e in i.evidence}
            captures = self._kernel.evidence_captures(subject, cited)
            reads = self._kernel.item_reads(subject)
            unfinished = self._kernel.consent_erasures_unfinished(subject, view.consents)
        counts = _profile_counts(view) | {"memories": len(page.items), "captures": len(captures)}
        self._recorded(subject, "profile", counts, read_from=read_from)
        return ProfilePage(view, page, captures, reads, unfinished)

    def subject_exists(self, subject: str) -> bool:
        """Whether a subject is known (operator work: it reveals that it exists)."""
        self._authorize_governance("inspect", OPERATIONS_PURPOSE)
        return self._kernel.subject_exists(subject)

    def subject_pseudonym(self, subject: str) -> str | None:
        """The pseudonym of the subject the name stands for now, None while it names none
        (unknown, or erased and not re-created): what a privacy-center link or session is
        bound to, so that it opens nothing of a later subject of the same name."""
        if self.principal.kind is PrincipalKind.USER:
            self._own_subject(subject)
        else:
            self._authorize_governance("inspect", OPERATIONS_PURPOSE)
        return self._kernel.subject_pseudonym(subject)

    def authorize_privacy_link(self) -> None:
        """Decide whether this principal may hand out a privacy-center link.

        A link exercises the subject's rights (export, erasure) without the operators'
        policy, so whoever hands one out must be allowed both itself: an operator the
        deployment denies ``export`` or ``erase`` could otherwise issue a link and use it.
        Raises PermissionDeniedError (audited).
        """
        self._authorize_governance("export", ACCESS_PURPOSE)
        self._authorize_governance("erase", ERASURE_PURPOSE)

    def privacy_link_stands(self) -> None:
        """Decide again, for this data subject's link or the session it opened, what
        issuing the link needed (``authorize_privacy_link``): the operators' policy
        allowing ``export`` and ``erase``.

        The link does both whatever the policy says, so only an operator the policy allows
        them is handed one; decided at issue only, a link issued just before the
        deployment denied them opened a session that exported (or erased) the whole
        profile for the link's 15 minutes plus the session's hour (hostile callers round
        8, bug LQ). The privacy center asks this where it asks whether the issuing key is
        live: at sign-in and on every page. Raises PermissionDeniedError, audited under
        this link's principal (``app_id`` operators, ``reason_code`` the action), or
        PolicyStoreError while the policy store cannot be read (every check denies), or its
        damage (``StoredDataDamagedError``) while it is damaged."""
        if self.principal.kind is not PrincipalKind.USER:
            raise PermissionDeniedError("only a data subject's link is decided so")
        # Decided as the issuer was (``_authorize_operator``), by the policy's answer for
        # ``operators`` itself: this principal is not one of them, and asks for the issuer.
        rights = (("export", ACCESS_PURPOSE), ("erase", ERASURE_PURPOSE))
        try:  # quietly first: a refusal is decided (and audited) below, with the store read
            for action, purpose in rights:
                self._ask_authorizer(OPERATORS, action, CATEGORIES, purpose)
            return
        except UprofError:
            # The policy answers from its last look at the store (``policy_refresh_s``):
            # that look may be an outage the store has since come out of. Looked at now,
            # then decided again, so a page just after an outage is not refused as by the
            # policy, which ends the session for good (review of 0173, bug MH). Still
            # unreadable, the decision raises the store's error (``_refusal_of``, QL): an
            # outage keeps the session; a damaged store is its damage (500, MY).
            self._kernel.policy_refusal()
        for action, purpose in rights:
            self._decide(OPERATORS, action, CATEGORIES, purpose, ask=self._ask_authorizer)

    def privacy_link_issued(self, subject: str, link_id: str) -> None:
        """Record that a sign-in link to ``subject``'s privacy center was handed to this
        principal (``privacy_link.issued``: the pseudonym and the link's id, never the
        token): the link opens everything the subject may do, so who was given one is on
        the log, and the entries of its session (``privacy-center#<link id>``) join it."""
        self._authorize_governance("inspect", OPERATIONS_PURPOSE)
        with self._as_principal():
            self._kernel.audit.record(
                "privacy_link.issued",
                subject_ref=self._kernel.subjects.pseudonym(subject),
                link_id=link_id,
            )

    def privacy_link_used(self) -> None:
        """Record that this data subject's link was used: a privacy-center session opens
        under it, showing the whole profile (``privacy_link.used``, principal
        ``privacy-center#<link id>``). Written before the session exists; no pseudonym
        while the name stands for no subject (erased)."""
        if self.principal.kind is not PrincipalKind.USER:
            raise PermissionDeniedError("only a data subject's link signs in to its privacy center")
        subject = self.principal.subject
        with self._as_principal():
            self._kernel.audit.record(
                "privacy_link.used",
                subject_ref=self._kernel.subject_pseudonym(subject),
                link_id=self.principal.key_id,
            )

    def console_sign_in(
        self, *, refused: bool = False, key_stands: Callable[[], None] | None = None
    ) -> None:
        """Record a compliance-console sign-in with this principal's API key
        (``console.signed_in``, or ``console.sign_in_refused`` for a key without the
        operator role): the key's public id, never the key. Written before the session
        is opened; a key nobody knows signs in as no one and is not recorded.

        ``key_stands`` (raising PermissionDeniedError once the key is revoked) is asked
        under the log's write lock, where the entry takes its place: ``console.signed_in``
        is written only for a key that stands there, so no revocation of the key
        (``apikey.revoked``, appended after its key-store commit, behind that lock) can
        precede it on the log. A key revoked while the sign-in waited for the lock gets
        ``console.sign_in_refused`` (``reason_code`` key-revoked) instead, and the
        PermissionDeniedError is raised: the log never says a session was given that was
        not (0218's TV wrote the entry, then refused the session)."""
        fields: dict[str, object] = {
            "app_id": self.principal.app_id,
            "api_key_id": self.principal.key_id,
        }
        with self._as_principal():
            if refused:
                self._kernel.audit.record("console.sign_in_refused", **fields)
                return
            try:
                self._kernel.audit.record_many([("console.signed_in", fields)], admitted=key_stands)
            except PermissionDeniedError:
                self._kernel.audit.record(
                    "console.sign_in_refused", reason_code=SIGN_IN_KEY_REVOKED, **fields
                )
                raise

    def console_sign_out(self) -> None:
        """Record that a compliance-console session of this principal's API key was
        signed out (``console.signed_out``: the key's public id, never the key, the
        cookie or the session id). Written once the session is refused, once per session."""
        with self._as_principal():
            self._kernel.audit.record(
                "console.signed_out",
                app_id=self.principal.app_id,
                api_key_id=self.principal.key_id,
            )

    def audit_subject_ref(self, subject: str) -> str:
        """The pseudonym audit entries use for a subject (what an audit search filters on)."""
        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        return self._kernel.audit_subject_ref(subject)

    # ------------------------------------------------------------ governance

    def export_subject(self, subject: str) -> dict[str, Any]:
        self._own_subject(subject)

        def decide() -> None:
            if self.principal.kind is not PrincipalKind.USER:
                self._authorize_governance("export", ACCESS_PURPOSE)

        decide()
        with self._as_principal():
            # Decided again once the profile is read (it waits for the views), before the
            # export is recorded and returned.
            return self._kernel.export_subject(
                subject,
                requested_by=self.principal.label,
                still_allowed=lambda: self._decided_again(decide),
            )

    def _erasure_decided(self, subject: str, *, governed: bool = True) -> Callable[[], None]:
        """Decide an erasure of ``subject``'s data; return that decision to ask again
        (with the principal's credential, ``_decided_again``) once the erasure has waited
        and before it writes: the kernel asks it there (review of 0176, bug NI; an
        erasure went on for a key revoked or an ``erase`` denied during its wait).
        ``governed``: the policy's ``erase`` is asked (not for an app erasing what it
        collected itself, nor for the subject)."""

        def decide() -> None:
            self._own_subject(subject)
            if governed and self.principal.kind is not PrincipalKind.USER:
                self._authorize_governance("erase", ERASURE_PURPOSE)

        decide()
        return lambda: self._decided_again(decide)

    def erase_subject(self, subject: str, *, basis: str = "GDPR-Art.17(1)") -> ErasureResult:
        still_allowed = self._erasure_decided(subject)
        with self._as_principal():
            return self._kernel.erase_subject(subject, basis=basis, still_allowed=still_allowed)

    def erase_item(
        self, subject: str, item_id: str, *, with_evidence: bool = False
    ) -> ErasureResult:
        still_allowed = self._erasure_decided(subject)
        with self._as_principal():
            return self._kernel.erase_item(
                subject, item_id, with_evidence=with_evidence, still_allowed=still_allowed
            )

    def erase_capture(self, subject: str, capture_id: str) -> ErasureResult:
        still_allowed = self._erasure_decided(subject)
        with self._as_principal():
            return self._kernel.erase_capture(subject, capture_id, still_allowed=still_allowed)

    # ----------------------------------------------------------------- audit

    def export_audit(
        self,
        dest: str | PathLike[str] | TextIO,
        *,
        fmt: str = "jsonl",
        subject: str | None = None,
        app_id: str | None = None,
        action: str | None = None,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
    ) -> ExportSummary:
        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        with self._as_principal():
            return self._kernel.export_audit(
                dest,
                fmt=fmt,
                subject_ref=self._kernel.audit_subject_ref(subject) if subject else None,
                app_id=app_id,
                action=action,
                since=since,
                until=until,
                requested_by=self.principal.label,
            )

    def stream_audit(
        self,
        *,
        fmt: str = "jsonl",
        subject: str | None = None,
        app_id: str | None = None,
        action: str | None = None,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
    ) -> AuditStream:
        """The export as text records, produced while they are sent (same decision as
        ``export_audit``; the header is signed now, so a refusal comes before any byte).

        The policy is asked again every ``STREAM_RECHECK_RECORDS`` records while the
        stream is read: a right taken away meanwhile (by any process) ends the stream
        there, with ``PermissionDeniedError`` (audited), instead of at its last record.
        """
        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        with self._as_principal():
            stream = self._kernel.stream_audit(
                fmt=fmt,
                subject_ref=self._kernel.audit_subject_ref(subject) if subject else None,
                app_id=app_id,
                action=action,
                since=since,
                until=until,
                requested_by=self.principal.label,
            )
        return AuditStream(
            stream.media_type,
            stream.filename,
            self._bound(stream, lambda: self._authorize_governance("audit", COMPLIANCE_PURPOSE)),
        )

    def _bound(self, records: Iterable[str], still_allowed: Callable[[], None]) -> Iterator[str]:
        """Iterate ``records`` as this principal: the stream is read after this call has
        returned, on whatever thread serves it, and its closing audit entry must name us.
        Every ``STREAM_RECHECK_RECORDS`` records ``still_allowed`` decides again (it
        raises, having audited the denial, when the right is gone)."""
        it = iter(records)
        try:
            for sent in itertools.count(1):
                with self._as_principal():
                    record = next(it, None)
                if record is None:
                    return
                yield record
                if sent % STREAM_RECHECK_RECORDS == 0:
                    still_allowed()
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                with self._as_principal():
                    close()

    def prove_audit(self, old_size: int, *, leaf_index: int | None = None) -> dict[str, Any]:
        """A fresh signed checkpoint and the proof that the log extends the tree of
        ``old_size`` entries (plus entry ``leaf_index`` with its inclusion proof, if
        asked): ``audit.proofs`` describes the document. Same decision as an export,
        taken before the sizes are compared with the log, so a caller without the right
        learns nothing of it; audited (``audit.proof_served``)."""
        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        with self._as_principal():
            return self._kernel.audit_proof(
                old_size, leaf_index=leaf_index, requested_by=self.principal.label
            )

    def receipt_rotation_proof(self, content: bytes) -> dict[str, Any]:
        """The rotation proof an erasure receipt issued before an audit key rotation needs
        offline (``Uprof.receipt_rotation_proof``): same decision as a proof document
        (``audit``), taken before the receipt is read; this tenant's receipts only;
        audited (``audit.proof_served``)."""
        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        with self._as_principal():
            return self._kernel.receipt_rotation_proof(content, requested_by=self.principal.label)

    def checkpoint_rotation_proof(self, content: bytes | str) -> dict[str, Any]:
        """The rotation proof an export, a proof document or a checkpoint note signed
        before an audit key rotation needs offline (``Uprof.checkpoint_rotation_proof``):
        the receipt's decision (``audit``), taken before the note is read; audited."""
        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        with self._as_principal():
            return self._kernel.checkpoint_rotation_proof(
                content, requested_by=self.principal.label
            )

    def verify_audit(self, content: bytes, kind: Kind) -> CheckResult:
        """Check an export or a receipt against this log's key.

        Decided again once checked (up to 20 MiB from the console, each line against the
        key), before the verdict leaves, as a residue scan's report (bug SO)."""

        def decide() -> None:
            self._authorize_governance("audit", COMPLIANCE_PURPOSE)

        decide()
        checked = self._kernel.verify_audit(content, kind)
        self._decided_again(decide)
        return checked

    def audit_key(self) -> dict[str, Any]:
        """The log's origin and public key (for anyone: offline verification needs them)
        and, for a principal the policy lets ``audit``, a fresh signed checkpoint.

        A checkpoint's tree size counts every entry of the log, every tenant's on shared
        stores: read twice, it says how much the whole deployment wrote in between. So it
        is for the audit right only (decided quietly: asking for the key is no refusal).
        While the policy cannot be consulted it is refused (``_may_audit``), the key too:
        whether the caller may have the checkpoint is not known (``audit_public_key`` is
        the key alone, policy or no policy)."""
        return self._kernel.audit_key(with_checkpoint=self._may_audit())

    def audit_public_key(self) -> dict[str, Any]:
        """The log's origin, key id, public key and key history, without the checkpoint:
        public, so no policy is asked, and a verifier gets them while the policy store
        does not answer too (the console's key download, ``uprof audit public-key``)."""
        return self._kernel.audit_key(with_checkpoint=False)

    def audit_key_history(self) -> dict[str, Any] | None:
        """The audit key history (public, like the key: offline verifiers pin the first key,
        or any they trust, and accept the keys it endorses)."""
        return self._kernel.audit_key_history()

    def settle_erasures_of_host(self, host: str) -> HostSettled:
        """Settle the erasure requests left open by a host gone for good (operator work,
        ``operate``; each audited ``erasure.abandoned``, ``reason_code`` host-gone)."""
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.settle_erasures_of_host(host, requested_by=self.principal.label)

    def rotate_audit_key(self) -> dict[str, Any]:
        """Make a new audit signing key current, endorsed by the current one (operator
        work, ``operate``; audited as ``audit.key_rotated``)."""
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.rotate_audit_key(requested_by=self.principal.label)

    def audit_checkpoint(self) -> str:
        """A fresh signed checkpoint of the whole log (``audit``, as an export)."""
        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        return str(self._kernel.audit_key()["checkpoint"])

    def _may_audit(self) -> bool:
        """``_authorize_governance("audit", ...)`` without auditing a denial.

        Raises the store's error (``PolicyStoreError``, or its damage) when the policy
        could not be consulted: False would leave the checkpoint out exactly as for a
        caller without the audit right, a 200 an auditor cannot tell from "not yours"
        (review of 0186 and 0188, bug OV; the slice's rule, 0188's OL). The policy raises
        it itself (``_refusal_of``, QL): it is no ``PermissionDeniedError``."""
        try:
            if self.principal.is_operator and not self.principal.acting_for:
                self._ask_policy(OPERATORS, "audit", CATEGORIES, COMPLIANCE_PURPOSE)
            else:
                self._check("audit", CATEGORIES, COMPLIANCE_PURPOSE)
        except PermissionDeniedError:
            return False
        return True

    def residue_scan(self, terms: Sequence[str]) -> ResidueReport:
        """Scan every store for the terms and for erased subjects' data (``audit``).

        The scan cannot be kept to one tenant (it reads every file and table, checks every
        erased stream): on stores another tenant wrote to, only the local operator (the
        CLI: whoever holds the data folder holds every tenant's files) may run it; an API
        key is refused, audited (``access.denied``, ``reason_code`` ``stores-shared``)."""
        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        if len(terms) > MAX_RESIDUE_TERMS:
            raise InvalidInputError(
                f"terms: at most {MAX_RESIDUE_TERMS} terms per scan, {len(terms)} given; "
                "split them over several scans",
                field="terms",
            )
        for i, term in enumerate(terms):
            problem = _residue_term_problem(term)
            if problem:
                raise InvalidInputError(f"terms[{i}]: {problem}", field="terms")
        self._alone_on_the_stores()
        with self._as_principal():
            report = self._kernel.residue_scan(terms)
        # Decided again once the scan has read everything (minutes at scale), as a read
        # after its wait: the ``audit`` right, and the stores, which another tenant that
        # started on them meanwhile shares, its files and tables read (hostile callers
        # round 9, bug QW).
        self._decided_again(lambda: self._authorize_governance("audit", COMPLIANCE_PURPOSE))
        self._alone_on_the_stores()
        return report

    def _alone_on_the_stores(self) -> None:
        """Refuse a residue scan by anyone but the local operator on stores another
        tenant wrote to (audited ``access.denied``, ``reason_code`` ``stores-shared``)."""
        if self.principal.app_id == LOCAL_OPERATOR or not self._kernel.stores_shared():
            return
        with self._as_principal():
            self._kernel.audit.record(
                "access.denied",
                app_id=self.principal.app_id,
                purpose=COMPLIANCE_PURPOSE,
                reason_code="stores-shared",
            )
        raise PermissionDeniedError(
            "the residue scan reads every tenant's files on these shared stores: "
            "only the local operator (uprof audit residue) may run it"
        )

    def partial_backups(self, folders: Sequence[PathLike[str] | str]) -> list[Partial]:
        """The partial backup folders in each of ``folders`` (where ``uprof backup --to``
        writes), each with whether a live process writes it: the residue audit's look
        outside the data folder (bug KI). Listed, never read; decided as ``audit``."""
        from pathlib import Path

        from uprof.services.backup import partials

        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        return [p for folder in folders for p in partials(Path(folder))]

    def recreate_subject(self, subject: str) -> str:
        """Lift an erased subject's mark (operator work); returns the new, unlinkable pseudonym."""
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.recreate_subject(subject, requested_by=self.principal.label)

    # ----------------------------------------------------------------- pages
    #
    # Every list is read a page at a time (uprof.services.paging). Each page is a call
    # of its own: it is authorized again, its filters come from this request, and the
    # cursor, bound to this principal, list, subject and filters, only says where the
    # page starts.

    def _listing(self, name: str, shape: tuple[str, ...], **scope: object) -> Listing:
        p = self.principal
        # The tenant too: tenants on shared stores share the cursor key, and an app id
        # names another app in another tenant.
        who = f"{p.tenant}/{p.kind}:{p.policy_subject}"
        if p.kind is PrincipalKind.USER:
            who += f":{p.subject}"
        pairs = tuple(sorted((k, "" if v is None else str(v)) for k, v in scope.items()))
        return Listing(name, who, shape, pairs)

    def _open(self, listing: Listing, cursor: str | None) -> Position | None:
        return self._kernel.cursor_codec().open(listing, cursor)

    def _page(
        self, listing: Listing, rows: Sequence[Any], limit: int, key: Callable[[Any], Position]
    ) -> Page[Any]:
        return paginate(self._kernel.cursor_codec(), listing, rows, limit, key)

    def list_consents(
        self, subject: str, *, cursor: str | None = None, limit: int | None = None
    ) -> Page[Any]:
        """A page of consents: an app's own; all apps' for the subject or an operator."""
        self._own_subject(subject)
        size = check_limit(limit)
        app = self.principal.policy_subject if self.principal.kind is PrincipalKind.APP else None
        # Before the cursor is judged (a 422 for a subject that exists) and before the
        # rows are read (which waits for the views): whether the subject exists is not
        # for an app that holds no consent of it to learn.
        self._known_to_app(subject)
        with self._as_principal():
            stream = self._kernel.stream_of(subject)
            listing = self._listing("consents", ("time", "str"), subject=stream, app=app)
            after = _time_position(self._open(listing, cursor))
            rows = self._kernel.consents_after(subject, app_id=app, after=after, limit=size + 1)
        # The rows waited for the views: the key (revoked meanwhile?) and the subject's own
        # link are asked again before they leave, as a recorded read is (0106; REST's list
        # and MCP ``forget``'s, which withdraws what it lists, both come through here).
        self._decided_again(lambda: self._own_subject(subject))
        if app is not None and after is None and not rows and not self.principal.is_operator:
            # A first page with none of the app's own consents: it holds none, so the
            # subject is unknown to it (as ``consents``; the listing was the only read).
            raise SubjectNotFoundError("no such subject")
        return self._page(listing, rows, size, lambda c: (time_key(c.granted_at), c.consent_id))

    def list_memories(
        self, subject: str, *, cursor: str | None = None, limit: int | None = None
    ) -> Page[Any]:
        """A page of the subject's memories, oldest first (``inspect``; a subject its own)."""
        self._reader_purpose(subject)
        read_from = self._incarnation(subject)
        with self._as_principal():
            page = self._memories(subject, cursor, limit)
        self._recorded(subject, "memories", {"memories": len(page.items)}, read_from=read_from)
        return page

    def _memories(self, subject: str, cursor: str | None, limit: int | None) -> Page[Any]:
        """A page of memories, unrecorded: for the reads above, which record it."""
        size = check_limit(limit)
        stream = self._kernel.stream_of(subject)
        listing = self._listing("memories", ("time", "str"), subject=stream)
        after = _time_position(self._open(listing, cursor))
        rows = self._kernel.memories_after(subject, after=after, limit=size + 1)
        return self._page(listing, rows, size, lambda m: (time_key(m.occurred_at), m.item_id))

    def list_subjects(
        self, *, cursor: str | None = None, limit: int | None = None
    ) -> Page[SubjectListed]:
        """A page of live subjects, by pseudonym (``inspect``: it reveals that they exist)."""
        self._authorize_governance("inspect", OPERATIONS_PURPOSE)
        size = check_limit(limit)
        listing = self._listing("subjects", ("time", "str"), tenant=self._kernel.subjects.tenant)
        after = _time_position(self._open(listing, cursor))
        rows = [
            SubjectListed(pseudonym, _aware(created))
            for pseudonym, created in self._kernel.subjects_after(after=after, limit=size + 1)
        ]
        return self._page(listing, rows, size, lambda s: (time_key(s.created_at), s.pseudonym))

    def list_audit_entries(
        self,
        *,
        subject: str | None = None,
        app_id: str | None = None,
        action: str | None = None,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Any]:
        """A page of audit entries in leaf order, filtered (``audit``, as an export is)."""
        return self._audit_page(
            "audit.entries",
            subject=subject,
            app_id=app_id,
            action=action,
            since=since,
            until=until,
            cursor=cursor,
            limit=limit,
        )

    def list_receipts(
        self,
        *,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Any]:
        """A page of the erasure receipts the log recorded (their audit entries)."""
        return self._audit_page(
            "audit.receipts",
            action=RECEIPT_ACTION,
            since=since,
            until=until,
            cursor=cursor,
            limit=limit,
        )

    def _audit_page(
        self,
        name: str,
        *,
        subject: str | None = None,
        app_id: str | None = None,
        action: str | None = None,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Any]:
        self._authorize_governance("audit", COMPLIANCE_PURPOSE)
        size = check_limit(limit)
        filters = {
            "subject_ref": self._kernel.audit_subject_ref(subject) if subject else None,
            "app_id": app_id,
            "action": action,
            "since": normalise_timestamp(since, "since") if since is not None else None,
            "until": normalise_timestamp(until, "until") if until is not None else None,
        }
        # A position is (the last leaf shown, the listing's bound): the log's size when
        # the first page was read, kept by the cursor so that every page of one listing
        # reads the same prefix of the log (``Uprof.audit_page``, which records the read).
        listing = self._listing(name, ("int", "int"), **filters)
        position = self._open(listing, cursor)
        after, bound = (int(position[0]), int(position[1])) if position else (-1, None)
        with self._as_principal():
            rows, fixed = self._kernel.audit_page(
                name.removeprefix("audit."),
                after_leaf=after,
                bound=bound,
                size=size,
                requested_by=self.principal.label,
                **{k: v for k, v in filters.items() if v is not None},
            )
        return self._page(listing, rows, size, lambda e: (e.leaf_index, fixed))

    def list_policy_history(
        self, *, cursor: str | None = None, limit: int | None = None, newest_first: bool = False
    ) -> Page[PolicyChange]:
        """A page of the policy's changes, oldest first or newest first (``policy`` action)."""
        self._authorize_governance("policy", OPERATIONS_PURPOSE)
        size = check_limit(limit)
        listing = self._listing(
            "policy.history",
            ("int",),
            tenant=self._kernel.subjects.tenant,
            order="desc" if newest_first else "asc",
        )
        position = self._open(listing, cursor)
        changes = self._kernel.policy_history()
        if newest_first:
            before = int(position[0]) if position else None
            rest = [c for c in reversed(changes) if before is None or c.version < before]
        else:
            after = int(position[0]) if position else 0
            rest = [c for c in changes if c.version > after]
        return self._page(listing, rest[: size + 1], size, lambda c: (c.version,))

    # ---------------------------------------------------------------- policy

    def policy_show(self, at: datetime | None = None) -> Any:
        """The policy in force now or at a past time (``policy`` action)."""
        self._authorize_governance("policy", OPERATIONS_PURPOSE)
        return self._kernel.policy_show(at)

    def policy_history(self) -> list[Any]:
        self._authorize_governance("policy", OPERATIONS_PURPOSE)
        return self._kernel.policy_history()

    def policy_table(self) -> tuple[Any, ...] | None:
        """Who may do what, one row per app and rule (``policy`` action, as showing the
        policy); None when the authorizer cannot list its rules."""
        self._authorize_governance("policy", OPERATIONS_PURPOSE)
        table: Callable[[str], tuple[Any, ...]] | None = getattr(
            self._kernel.authorizer, "policy_table", None
        )
        return None if table is None else table(self._kernel.subjects.tenant)

    def _policy_change_decided(self) -> Callable[[], None]:
        """Decide a change of the policy (``policy``); return that decision to ask again,
        with the principal's credential (``_decided_again``), once the change has its
        turn to be written (``PolicyService._apply``): a key revoked or a right taken
        away while it waited for the write lock or a conflict's retry changes nothing
        (bug SN; the console decided its forms only when they were posted)."""

        def decide() -> None:
            self._authorize_governance("policy", OPERATIONS_PURPOSE)

        decide()
        return lambda: self._decided_again(decide)

    def policy_grant(self, **change: Any) -> Any:
        """Add rules or a role; the change event and audit entry name this principal."""
        still_allowed = self._policy_change_decided()
        with self._as_principal():
            return self._kernel.policy_grant(
                requested_by=self.principal.label, still_allowed=still_allowed, **change
            )

    def policy_revoke(self, **change: Any) -> Any:
        still_allowed = self._policy_change_decided()
        with self._as_principal():
            return self._kernel.policy_revoke(
                requested_by=self.principal.label, still_allowed=still_allowed, **change
            )

    def onboard_app(self, app_id: str, **grants: Any) -> Any:
        """Grant a new app its rules in one change (``uprof apps create --read ...``)."""
        still_allowed = self._policy_change_decided()
        # Not an app: onboarding "operators" would widen every operator, then issue no key.
        reserved = reserved_app_id_problem(app_id)
        if reserved:
            raise InvalidInputError(reserved)
        with self._as_principal():
            return self._kernel.onboard_app(
                app_id, requested_by=self.principal.label, still_allowed=still_allowed, **grants
            )

    def issue_api_key(self, app_id: str, roles: Sequence[str]) -> IssuedKey:
        """Issue an API key for an app (operator work, decided as ``policy``; audited)."""
        self._authorize_operator("policy", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.issue_api_key(app_id, roles)

    def list_api_keys(self, app_id: str | None = None) -> list[ApiKeyInfo]:
        """The API keys' metadata (operator work, decided as ``policy``; audited)."""
        self._authorize_operator("policy", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.list_api_keys(app_id)

    def key_material_moved(self, moved: Sequence[str]) -> None:
        """Record a move of key files out of the data folder (``uprof keys move-out``,
        which runs with the stores alone; decided as ``operate``)."""
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            self._kernel.key_material_moved(moved)

    def revoke_api_key(self, key_id: str) -> bool:
        """Revoke an API key (operator work, decided as ``policy``; audited)."""
        self._authorize_operator("policy", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.revoke_api_key(key_id)

    def policy_health(self) -> str:
        """Why every check denies ('' when the policy store is readable): for readiness."""
        return self._kernel.policy_health()

    # -------------------------------------------------------------- pipeline

    def rotate_keys(self) -> dict[str, int]:
        """Re-wrap every data key under a new KEK epoch (operator work)."""
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.rotate_keys()

    def backup(self, dest: PathLike[str] | str) -> BackupReport:
        """Write a backup of the data stores (operator work, ``operate``; audited)."""
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.backup(dest)

    def lag(self) -> Lag:
        return self._kernel.lag()

    def list_quarantined(self) -> list[QuarantinedCapture]:
        """The quarantined captures (operator work, decided as ``operate``; audited as
        ``quarantine.listed`` with the count): ids, pseudonyms, stages, error classes."""
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            held = self._kernel.quarantined()
            self._kernel.audit.record("quarantine.listed", counts={"captures": len(held)})
            return held

    def retry_quarantined(self, capture_ids: Sequence[str] | None) -> list[RetryOutcome]:
        """Extract quarantined captures again, the named ones or (None) all (operator
        work, decided as ``operate``; each retried capture audited)."""
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.retry_quarantined(capture_ids)

    def process(self) -> int:
        """Extract and project up to the log's end as it is now; what is appended
        meanwhile is left to the running workers (``Uprof.process_to_log_end``)."""
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.process_to_log_end()

    def rebuild(self, progress: Callable[[int, int], None] | None = None) -> int:
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.rebuild(progress)

    def import_interactions(
        self,
        lines: Iterable[bytes | str],
        *,
        fmt: str = "interactions",
        defaults: ImportDefaults | None = None,
        dry_run: bool = False,
        strict: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> ImportReport:
        """Import a file as the operator, each record captured as the app it names.

        Per record: a record whose app the policy does not let ``capture`` for its
        purpose is reported (and the denial audited, once per app and purpose) while
        the others are imported; ``strict`` writes nothing unless every record passes.
        A dry run asks the policy without recording a denial (nothing is attempted).
        """
        from uprof.services.importer import import_interactions

        if not self.principal.is_operator:
            raise PermissionDeniedError("importing files is operator work (the CLI)")

        def may_capture(app_id: str, purpose: str) -> str | None:
            try:
                if dry_run:
                    self._kernel.authorizer.authorize_all(
                        app_id=app_id,
                        tenant=self._kernel.subjects.tenant,
                        action="capture",
                        purpose=purpose,
                        categories=[CAPTURE_CATEGORY],
                    )
                else:
                    self.for_app(app_id)._authorize("capture", [CAPTURE_CATEGORY], purpose)
            except (PermissionDeniedError, InvalidInputError) as refused:
                return f"the policy does not let {app_id} capture for {purpose!r}: {refused}"
            return None

        with self._as_principal():
            return import_interactions(
                self._kernel,
                lines,
                progress,
                fmt=fmt,
                defaults=defaults,
                may_capture=may_capture,
                dry_run=dry_run,
                strict=strict,
            )

    def run_maintenance(self) -> dict[str, int]:
        self._authorize_operator("operate", CATEGORIES, OPERATIONS_PURPOSE)
        with self._as_principal():
            return self._kernel.run_maintenance()


def _profile_counts(view: ProfileView) -> dict[str, int]:
    """How much of a profile a read showed, per layer (what ``subject.read`` counts)."""
    return {
        "attributes": len(view.attributes),
        "memories": len(view.memories),
        "intents": len(view.intents),
        "consents": len(view.consents),
    }


def _time_position(position: Position | None) -> tuple[datetime, str] | None:
    if position is None:
        return None
    return parse_time_key(str(position[0])), str(position[1])


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _is_token(value: str) -> bool:
    try:
        check_token("purpose", value)
    except InvalidInputError:
        return False
    return True
