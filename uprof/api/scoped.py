"""``AppScope``: the authorized facade as one authenticated API key sees it, in wire models.

REST routes, the MCP tools and the SDK's embedded mode all call these methods, so
the three front doors cannot drift apart. Each method converts wire models to
domain values and calls ``uprof.facade.Facade`` for the key's principal, which
binds the app, qualifies agents and asks the policy (deny by default); nothing
here decides access. What remains here is wire-level work: shapes, the pipeline
lock of a long-running server, and reading results back for the response.

This module imports no web framework: the SDK's embedded mode uses it in-process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from audit.export_format import export_lines
from domain.errors import InvalidInputError, UprofError
from domain.principal import Principal, PrincipalKind
from domain.values import (
    AttributeProposal,
    ExperienceProposal,
    IntentProposal,
    IntentStatus,
    IntentUpdateProposal,
    Interaction,
    MemoryProposal,
    Proposal,
    ProposalBatch,
)
from uprof.api.errors import EdgeError, role_required
from uprof.api.runtime import ServiceRuntime
from uprof.apikeys.store import ROLE_APP, ROLE_OPERATOR
from uprof.facade import AuditStream, ErasureResult, Facade, SubjectRequest
from uprof.schemas import api as w


class AppScope:
    """Every operation an authenticated app may ask for, with its identity bound."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        app_id: str,
        roles: frozenset[str] = frozenset({ROLE_APP}),
        *,
        key_id: str = "",
        still_authenticated: Callable[[], None] | None = None,
    ) -> None:
        """``still_authenticated`` raises (401) once the request's key is revoked: a
        slice asks it again after its read-your-writes wait (``Facade``)."""
        self._runtime = runtime
        self.app_id = app_id
        self.roles = roles
        self.principal = Principal(
            tenant=runtime.kernel.subjects.tenant,
            app_id=app_id,
            key_id=key_id or "key",
            kind=PrincipalKind.APP,
            roles=frozenset(roles),
        )
        self._door = Facade(runtime.kernel, self.principal, still_authenticated=still_authenticated)
        #: How long the kernel took to serve this request's slice (Server-Timing).
        self.kernel_ms = 0.0
        #: True when the last keyed write was answered from its first answer (a replay).
        self.replayed = False

    def _once(
        self,
        idempotency_key: str | None,
        operation: str,
        body: Any,
        write: Callable[[str | None], dict[str, Any]],
        *,
        status: int = 201,
    ) -> dict[str, Any]:
        """Run a write; with a key, at most once per (this app, key), replaying the
        first answer (the kernel's idempotency store, I14)."""
        if idempotency_key is None:
            return write(None)
        outcome = self._door.idempotent(
            idempotency_key,
            operation,
            body.model_dump(mode="json"),
            lambda token: (write(token), status),
        )
        self.replayed = outcome.replayed
        return outcome.response

    # ----------------------------------------------------------------- capture

    def capture(self, body: w.CaptureIn, *, idempotency_key: str | None = None) -> w.CaptureAck:
        def write(token: str | None) -> dict[str, Any]:
            ack = self._door.capture(body.subject, self._interaction(body), request_token=token)
            return w.CaptureAck.model_validate(asdict(ack)).model_dump(mode="json")

        answer = self._once(idempotency_key, "capture", body, write)
        self._runtime.wake()
        return w.CaptureAck.model_validate(answer)

    async def capture_async(
        self, body: w.CaptureIn, *, idempotency_key: str | None = None
    ) -> w.CaptureAck:
        """``capture`` for a coroutine on an event loop (the REST route): the request
        waits for the capture writer without holding a thread. A keyed request claims
        its key in the idempotency store (writes), so it runs ``capture`` on a thread."""
        if idempotency_key is not None:
            return await asyncio.to_thread(self.capture, body, idempotency_key=idempotency_key)
        (ack,) = await self._door.capture_async(body.subject, [self._interaction(body)])
        self._runtime.wake()
        return w.CaptureAck(
            capture_id=ack.capture_id,
            notification_id=ack.notification_id,
            subject_pseudonym=ack.subject_pseudonym,
        )

    async def capture_many_async(
        self, body: w.CaptureBatchIn, *, idempotency_key: str | None = None
    ) -> w.CaptureBatchAck:
        """``capture_many`` for a coroutine on an event loop, as ``capture_async``."""
        if idempotency_key is not None:
            return await asyncio.to_thread(self.capture_many, body, idempotency_key=idempotency_key)
        acks = await self._door.capture_async(
            body.subject, [self._interaction(i) for i in body.interactions]
        )
        self._runtime.wake()
        return w.CaptureBatchAck(
            acks=[
                w.CaptureAck(
                    capture_id=a.capture_id,
                    notification_id=a.notification_id,
                    subject_pseudonym=a.subject_pseudonym,
                )
                for a in acks
            ]
        )

    def capture_many(
        self, body: w.CaptureBatchIn, *, idempotency_key: str | None = None
    ) -> w.CaptureBatchAck:
        """All or nothing: the kernel records the batch in one transaction."""

        def write(token: str | None) -> dict[str, Any]:
            acks = self._door.capture_many(
                body.subject,
                [self._interaction(i) for i in body.interactions],
                request_token=token,
            )
            return w.CaptureBatchAck(
                acks=[w.CaptureAck.model_validate(asdict(a)) for a in acks]
            ).model_dump(mode="json")

        answer = self._once(idempotency_key, "capture.batch", body, write)
        self._runtime.wake()
        return w.CaptureBatchAck.model_validate(answer)

    def _interaction(self, body: w.InteractionBody) -> Interaction:
        return Interaction(
            app_id=self.app_id,
            agent_id=body.agent_id,
            agent_type=body.agent_type,
            occurred_at=body.occurred_at,
            user_input=body.user_input,
            agent_response=body.agent_response,
            session_id=body.session_id,
            actor=body.actor,
            source_ref=body.source_ref,
            purpose=body.purpose,
            sharing=body.sharing,
            context=tuple(sorted(body.context.items())),
        )

    # --------------------------------------------------------------- proposals

    def submit_proposals(
        self, body: w.ProposalsIn, *, idempotency_key: str | None = None
    ) -> w.ProposalsResult:
        batch = ProposalBatch(
            proposals=tuple(_proposal(p) for p in body.proposals),
            author=body.agent_id,
            owner_agent=body.agent_id,
            sharing=body.sharing,
            app_id=self.app_id,
            purpose=body.purpose,
        )

        def write(token: str | None) -> dict[str, Any]:
            with self._runtime.pipeline():
                applied = self._door.submit_proposals(
                    body.subject, batch, observed_at=body.observed_at, request_token=token
                )
            return w.ProposalsResult(applied=applied).model_dump(mode="json")

        answer = self._once(idempotency_key, "proposals", body, write, status=200)
        self._runtime.wake()
        return w.ProposalsResult.model_validate(answer)

    # ------------------------------------------------------------------ slices

    def slice(self, body: w.SliceIn) -> w.ProfileSlice:
        request = SubjectRequest(
            subject=body.subject, session_id=body.session_id, identifier=body.identifier
        )

        def serve() -> w.ProfileSlice:
            began = time.perf_counter()
            result = self._door.slice(
                request,
                body.query,
                budget_tokens=body.budget_tokens,
                purpose=body.purpose,
                agent_id=body.agent_id,
                agent_type=body.agent_type,
                lexical_only=body.lexical_only,
                wait_timeout_s=body.wait_timeout_s,
            )
            self.kernel_ms = (time.perf_counter() - began) * 1000
            # Straight from the dataclass: a slice reports hundreds of left-out items,
            # and copying them to dicts first costs more than the rest of the edge.
            return w.ProfileSlice.model_validate(result, from_attributes=True)

        if self._runtime.background:
            # Nothing runs inline, so no lock. A subject that is behind wakes the worker
            # from inside the kernel (Uprof.wake_workers); a caught-up one wakes nothing.
            return serve()
        with self._runtime.pipeline():
            return serve()

    # --------------------------------------------------------- profile, evidence

    def profile(self, body: w.ProfileIn) -> w.Profile:
        self._require(ROLE_OPERATOR)
        with self._runtime.pipeline():
            view = self._door.profile(body.subject, as_of=body.as_of)
        return w.Profile(
            attributes=[w.AttributeOut.model_validate(asdict(a)) for a in view.attributes],
            memories=[w.MemoryOut.model_validate(asdict(m)) for m in view.memories],
            intents=[w.IntentOut.model_validate(asdict(i)) for i in view.intents],
            consents=[w.Consent.model_validate(asdict(c)) for c in view.consents],
            as_of=view.as_of,
        )

    def evidence(self, body: w.EvidenceIn) -> w.Evidence:
        self._require(ROLE_OPERATOR)
        with self._runtime.pipeline():
            view = self._door.evidence(body.subject, body.item_id)
        return w.Evidence(
            item_id=view.item_id,
            layer=view.layer,
            summary=view.summary,
            captures=[w.CapturedEvent.model_validate(asdict(c)) for c in view.captures],
        )

    # ------------------------------------------------------------------ consent

    def grant_consent(
        self, body: w.ConsentGrantIn, *, idempotency_key: str | None = None
    ) -> w.ConsentGranted:
        def write(token: str | None) -> dict[str, Any]:
            # The kernel creates the subject before the aggregate checks expires_at;
            # check it first so a refused grant leaves nothing behind.
            if body.expires_at is not None and body.expires_at <= self._door.now():
                raise InvalidInputError("expires_at must be in the future", field="expires_at")
            consent_id = self._door.grant_consent(
                body.subject,
                categories=list(body.categories),
                purposes=list(body.purposes),
                legal_basis=body.legal_basis,
                expires_at=body.expires_at,
                collected_by=body.collected_by or "",
                request_token=token,
            )
            return w.ConsentGranted(consent_id=consent_id).model_dump(mode="json")

        answer = self._once(idempotency_key, "consent.grant", body, write)
        self._runtime.wake()
        return w.ConsentGranted.model_validate(answer)

    def consents(self, body: w.ConsentListIn) -> w.ConsentList:
        """A page of this app's consents from the subject (never another app's)."""
        with self._runtime.pipeline():
            page = self._door.list_consents(body.subject, cursor=body.cursor, limit=body.limit)
        return w.ConsentList(
            consents=[w.Consent.model_validate(asdict(c)) for c in page.items],
            next_cursor=page.next_cursor,
        )

    def withdraw_consent(
        self, body: w.ConsentWithdrawIn, *, idempotency_key: str | None = None
    ) -> w.ConsentWithdrawn:
        """Withdraw one of this app's consents; another app's consent id is "not found".

        With ``erase`` the kernel also erases what was collected under the consent
        and returns a signed receipt: the subject's right, exercised through the app
        that holds the consent, so no further policy check applies.
        """

        def write(token: str | None) -> dict[str, Any]:
            held = None if body.erase else self._held_consent(body.subject, body.consent_id)
            if held is not None:
                # In force: withdrawn at once, read from the subject's stream, without
                # waiting for the views (a lagging pipeline must not hold it up).
                at = self._door.now()
                self._runtime.call_waiting(
                    lambda: self._door.withdraw_consent(
                        body.subject, body.consent_id, request_token=token, withdrawn_at=at
                    )
                )
                consent = w.Consent.model_validate(
                    {**asdict(held), "withdrawn_at": at, "erase_requested": False}
                )
                return w.ConsentWithdrawn(consent=consent).model_dump(mode="json")
            owned = {c.consent_id for c in self._own_consents(body.subject)}
            if body.consent_id not in owned:
                raise EdgeError(
                    404,
                    "consent_not_found",
                    "this app has no consent with that id for the subject",
                    hint="list this app's consents with POST /v1/consents/list",
                )
            erasure = self._runtime.call_waiting(
                lambda: self._door.withdraw_consent(
                    body.subject, body.consent_id, erase=body.erase, request_token=token
                )
            )
            # Read it back from the view, so the answer is what the kernel recorded.
            consent = next(
                c for c in self._own_consents(body.subject) if c.consent_id == body.consent_id
            )
            receipt = _receipt_of(erasure) if erasure is not None else None
            return w.ConsentWithdrawn(consent=consent, erasure=receipt).model_dump(mode="json")

        answer = self._once(idempotency_key, "consent.withdraw", body, write, status=200)
        self._runtime.wake()
        return w.ConsentWithdrawn.model_validate(answer)

    def held_consents(self, subject: str) -> list[w.Consent]:
        """This app's consents in force, read from the subject's stream (no view read,
        so no wait for the pipeline); an app holding none gets subject_not_found."""
        return [
            w.Consent.model_validate({**asdict(c), "withdrawn_at": None})
            for c in self._door.consents_in_force(subject)
        ]

    def _held_consent(self, subject: str, consent_id: str) -> Any:
        """This app's consent ``consent_id`` if it is in force (from the subject's
        stream, no view read), else None (the caller then reads the views as before)."""
        try:
            held = self._door.consents_in_force(subject)
        except UprofError:
            return None
        return next((c for c in held if c.consent_id == consent_id), None)

    def _own_consents(self, subject: str) -> list[w.Consent]:
        with self._runtime.pipeline():
            grants = self._door.consents(subject)
        return [w.Consent.model_validate(asdict(c)) for c in grants]

    # --------------------------------------------------------------- governance

    def erase_subject(self, body: w.SubjectErasureIn) -> w.ErasureReceipt:
        result = self._runtime.call_waiting(
            lambda: self._door.erase_subject(body.subject, basis=body.basis)
        )
        return _receipt_of(result)

    def erase_item(self, body: w.ItemErasureIn) -> w.ErasureReceipt:
        result = self._runtime.call_waiting(
            lambda: self._door.erase_item(
                body.subject, body.item_id, with_evidence=body.with_evidence
            )
        )
        return _receipt_of(result)

    def erase_capture(self, body: w.CaptureErasureIn) -> w.ErasureReceipt:
        result = self._runtime.call_waiting(
            lambda: self._door.erase_capture(body.subject, body.capture_id)
        )
        return _receipt_of(result)

    def export_subject(self, body: w.SubjectExportIn) -> w.SubjectExport:
        with self._runtime.pipeline():  # export reads the profile, which runs the pipeline
            export = self._door.export_subject(body.subject)
        return w.SubjectExport(export=export)

    def list_memories(self, body: w.MemoryListIn) -> w.MemoryPage:
        """A page of the subject's memories, oldest first (``operator`` role, as the profile)."""
        self._require(ROLE_OPERATOR)
        with self._runtime.pipeline():
            page = self._door.list_memories(body.subject, cursor=body.cursor, limit=body.limit)
        return w.MemoryPage(
            items=[w.MemoryOut.model_validate(asdict(m)) for m in page.items],
            next_cursor=page.next_cursor,
        )

    def list_subjects(self, body: w.SubjectListIn) -> w.SubjectPage:
        """A page of live subjects by pseudonym (``operator`` role; the policy's ``inspect``)."""
        self._require(ROLE_OPERATOR)
        page = self._door.list_subjects(cursor=body.cursor, limit=body.limit)
        return w.SubjectPage(
            items=[
                w.SubjectOut(pseudonym=s.pseudonym, created_at=s.created_at) for s in page.items
            ],
            next_cursor=page.next_cursor,
        )

    # ------------------------------------------------------- identity registries

    def register_session(self, body: w.SessionIn) -> w.Registered:
        self._door.register_session(body.session_id, body.subject)
        return w.Registered()

    def register_identifier(self, body: w.IdentifierIn) -> w.Registered:
        self._door.register_identifier(body.identifier, body.subject)
        return w.Registered()

    # -------------------------------------------------------------------- audit

    def audit_export_stream(self, body: w.AuditExportIn) -> AuditStream:
        """The trail with proofs, as records produced while they are sent (``operator``)."""
        self._require(ROLE_OPERATOR)
        return self._door.stream_audit(
            fmt=body.format,
            subject=body.subject,
            app_id=body.for_app,
            action=body.action,
            since=body.since,
            until=body.until,
        )

    def audit_export(self, body: w.AuditExportIn) -> w.AuditExport:
        """The whole export in one object (the embedded SDK; REST streams the file)."""
        content = "".join(self.audit_export_stream(body).records)
        summary = w.AuditExportSummary.of_export(export_lines(content), body.format)
        return w.AuditExport(format=body.format, content=content, summary=summary)

    def audit_entries(self, body: w.AuditEntriesIn) -> w.AuditEntryPage:
        """A page of the audit trail in leaf order (``operator`` role; the policy's ``audit``)."""
        self._require(ROLE_OPERATOR)
        page = self._door.list_audit_entries(
            subject=body.subject,
            app_id=body.for_app,
            action=body.action,
            since=body.since,
            until=body.until,
            cursor=body.cursor,
            limit=body.limit,
        )
        return w.AuditEntryPage(
            items=[
                w.AuditEntryOut(leaf_index=e.leaf_index, recorded_at=e.recorded_at, entry=e.entry)
                for e in page.items
            ],
            next_cursor=page.next_cursor,
        )

    def audit_receipts(self, body: w.ReceiptListIn) -> w.ReceiptPage:
        """A page of the erasure receipts the log recorded (``operator`` role)."""
        self._require(ROLE_OPERATOR)
        page = self._door.list_receipts(
            since=body.since, until=body.until, cursor=body.cursor, limit=body.limit
        )
        return w.ReceiptPage(
            items=[
                w.ReceiptOut(
                    leaf_index=e.leaf_index,
                    recorded_at=e.recorded_at,
                    receipt_id=e.entry["receipt_id"],
                    receipt_sha256=e.entry["receipt_sha256"],
                )
                for e in page.items
            ],
            next_cursor=page.next_cursor,
        )

    def audit_proof(self, body: w.AuditProofIn) -> bytes:
        """The proof document's file bytes (canonical JSON and a newline: what the offline
        verifier reads), for ``operator`` keys the policy lets ``audit``."""
        from audit.proofs import proof_bytes

        self._require(ROLE_OPERATOR)
        return proof_bytes(self._door.prove_audit(body.old_size, leaf_index=body.leaf_index))

    def receipt_rotation_proof(self, body: w.ReceiptRotationProofIn) -> w.ReceiptRotationProof:
        """A receipt's, or a checkpoint's (an export's, a proof document's), rotation proof
        (``operator`` role; the policy's ``audit``)."""
        self._require(ROLE_OPERATOR)
        if body.receipt is not None:
            proof = self._door.receipt_rotation_proof(body.receipt.encode())
        else:
            assert body.checkpoint is not None  # the model holds exactly one
            proof = self._door.checkpoint_rotation_proof(body.checkpoint)
        return w.ReceiptRotationProof.model_validate(proof)

    def audit_verify(self, body: w.AuditVerifyIn) -> w.AuditVerification:
        """Check an export or a receipt against this log's key (``operator`` role)."""
        self._require(ROLE_OPERATOR)
        checked = self._door.verify_audit(body.content.encode(), body.kind)
        return w.AuditVerification.model_validate(asdict(checked))

    def audit_key(self) -> w.AuditKey:
        """The log's public key and its latest signed checkpoint, to pin for offline checks."""
        return w.AuditKey.model_validate(self._door.audit_key())

    @property
    def door(self) -> Facade:
        """The authorized facade for this key's principal (for routes outside this class)."""
        return self._door

    def _require(self, role: str) -> None:
        self.require_role(role)

    def require_role(self, role: str) -> None:
        """Refuse (403 ``role_required``) a key without ``role``, audited first as
        ``access.denied`` (``reason_code`` role-required, ``rule`` the role), as every
        other refusal at the door is: every REST route needing a role comes here."""
        if role not in self.roles:
            self._door.role_refused(role)
            raise role_required(role)

    def has_role(self, role: str) -> bool:
        return role in self.roles


def scope_with_role(
    runtime: ServiceRuntime, app_id: str, roles: frozenset[str], key_id: str, role: str
) -> AppScope:
    """The request key's scope, once ``AppScope.require_role`` let it through (for
    routes outside ``AppScope``)."""
    scope = AppScope(runtime, app_id, roles, key_id=key_id)
    scope.require_role(role)
    return scope


def _receipt_of(result: ErasureResult) -> w.ErasureReceipt:
    return w.ErasureReceipt(
        receipt=result.receipt, subject_nonce_hex=result.subject_nonce_hex, counts=result.counts
    )


def _proposal(p: w.ProposalIn) -> Proposal:
    """Wire proposal to domain proposal (the kernel checks evidence and lifecycle)."""
    match p:
        case w.AttributeProposalIn():
            return AttributeProposal(
                key=p.key,
                value=p.value,
                evidence=tuple(p.evidence),
                confidence=p.confidence,
                explicit=p.explicit,
                supersedes=p.supersedes,
                negated=p.negated,
            )
        case w.MemoryProposalIn():
            return MemoryProposal(
                text=p.text,
                evidence=tuple(p.evidence),
                category=p.category,
                importance=p.importance,
                source_refs=tuple(p.source_refs),
                occurred_at=p.occurred_at,
            )
        case w.IntentProposalIn():
            return IntentProposal(
                description=p.description,
                evidence=tuple(p.evidence),
                category=p.category,
                confidence=p.confidence,
                expires_at=p.expires_at,
            )
        case w.IntentUpdateIn():
            return IntentUpdateProposal(
                status=IntentStatus(p.status),
                intent_id=p.intent_id,
                description=p.description,
                evidence=tuple(p.evidence),
            )
        case w.ExperienceProposalIn():
            return ExperienceProposal(
                situation=p.situation,
                action=p.action,
                outcome=p.outcome,
                insight=p.insight,
                evidence=tuple(p.evidence),
                confidence=p.confidence,
            )
    raise InvalidInputError(f"unknown proposal kind {p!r}")
