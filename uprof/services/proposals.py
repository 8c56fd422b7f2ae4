"""Structured proposals submitted directly by agents, bound to evidence by the kernel."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from domain.errors import SubjectNotFoundError
from domain.principal import acting_credential, qualified_agent
from domain.values import ProposalBatch
from uprof.ports import AuditTrail, Clock, EventStore
from uprof.services.capture import to_utc
from uprof.services.erased_items import ErasedItemGuard, Refused
from uprof.services.extraction import EvidenceChecker
from uprof.services.idempotency import refuse_unrecorded
from uprof.services.subjects import SubjectResolver


class ProposalService:
    def __init__(
        self,
        app: EventStore,
        subjects: SubjectResolver,
        evidence: EvidenceChecker,
        clock: Clock,
        audit: AuditTrail,
        erased_items: ErasedItemGuard | None = None,
    ) -> None:
        self._app = app
        self._erased_items = erased_items
        self._subjects = subjects
        self._evidence = evidence
        self._clock = clock
        self._audit = audit

    def submit(
        self,
        subject_ref: str,
        batch: ProposalBatch,
        *,
        observed_at: datetime | None = None,
        request_token: str | None = None,
        token_window_s: float = 0.0,
    ) -> int:
        """Apply an agent's proposals; returns how many the update engine applied.

        Raises EvidenceError if any proposal cites an event that does not exist or
        belongs to another subject; then nothing is applied. Proposals without
        evidence are kept as inferred with capped confidence.
        """
        handle = self._subjects.find(subject_ref)
        if handle is None:
            raise SubjectNotFoundError("no such subject")
        # Agents belong to their app: the owner is the qualified agent (I4).
        batch = replace(batch, owner_agent=qualified_agent(batch.app_id, batch.owner_agent))
        self._evidence.check(handle.stream_id, batch, known={})
        now = self._clock.now()
        when = to_utc(observed_at, "observed_at") if observed_at is not None else now

        replayed = False
        refused: list[Refused] = []

        def command() -> int:
            nonlocal replayed
            refused.clear()  # of this attempt only
            profile = self._app.load(handle.stream_id)
            if request_token:
                first = profile.recorded_request(request_token, now=now, window_s=token_window_s)
                if first is not None:
                    replayed = True  # a retried keyed request: applied once already
                    return int(first["applied"])
                refuse_unrecorded()
            erased = (
                self._erased_items.check(handle.stream_id, refused)
                if self._erased_items is not None
                else None
            )
            applied = profile.apply_proposals(batch, observed_at=when, now=now, erased=erased)
            if request_token:
                profile.record_request(
                    request_token, {"applied": applied}, now=now, window_s=token_window_s
                )
            self._app.save(profile)
            return applied

        # The key asked in the subject's writer turn and under the store's lock (TX, US).
        applied = self._app.with_retry(
            command, subject=handle.stream_id, credential=acting_credential.get()
        )
        if replayed:
            return applied
        if refused and self._erased_items is not None:
            self._erased_items.recorded(refused)
        self._audit.record(
            "proposal.applied",
            subject_ref=handle.pseudonym,
            app_id=batch.app_id,
            agent_id=batch.owner_agent,
            purpose=batch.purpose,
            counts={"items": applied},
        )
        return applied
