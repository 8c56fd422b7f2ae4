"""Consent: users grant and withdraw; the gate reads it from the subject's stream."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TypedDict

from domain.errors import InvalidInputError, SubjectNotFoundError
from domain.principal import acting_credential
from domain.profile import SubjectProfile
from domain.values import check_category, check_token
from projections.profile.queries import ConsentRow
from uprof.ports import AuditTrail, Clock, EventStore
from uprof.services.capture import to_utc
from uprof.services.idempotency import refuse_unrecorded
from uprof.services.subjects import SubjectResolver

PURPOSE_MAX = 64


def check_purposes(purposes: Sequence[str]) -> tuple[str, ...]:
    cleaned = tuple(p.strip() for p in purposes if p.strip())
    for p in cleaned:
        if len(p) > PURPOSE_MAX or any(ch in p for ch in ",\n\r"):
            raise InvalidInputError(f"purpose {p!r} is malformed (no commas or newlines)")
    return cleaned


class CollectionBounds(TypedDict, total=False):
    """Bounds of ``ViewStore.captures_by`` (positions exclusive, times inclusive)."""

    after_position: int
    before_position: int
    since: datetime
    until: datetime


def collected_under(grant: ConsentRow, withdrawn_position: int | None) -> CollectionBounds:
    """What was collected under a consent: its app's captures between its grant and its
    withdrawal, bounded by log positions, the captures' own clock (decision 0055).

    ``withdrawn_position``: the withdrawal just written, else the view's. A consent row
    projected before migration 0005_views_consent_positions has no positions; each bound
    it lacks falls back to the time (``granted_at`` <= ``recorded_at`` <= ``withdrawn_at``).
    Those come from two clocks (the Clock port stamps the consent, the event's timestamp
    the capture), which agree only as closely as the hosts' clocks do; ``uprof projections
    rebuild`` gives such rows their positions.
    """
    bounds = CollectionBounds()
    if grant.granted_position is not None:
        bounds["after_position"] = grant.granted_position
    else:
        bounds["since"] = grant.granted_at
    if withdrawn_position:
        bounds["before_position"] = withdrawn_position
    elif grant.withdrawn_at is not None:
        bounds["until"] = grant.withdrawn_at
    return bounds


class ConsentService:
    def __init__(
        self, app: EventStore, subjects: SubjectResolver, clock: Clock, audit: AuditTrail
    ) -> None:
        self._app = app
        self._subjects = subjects
        self._clock = clock
        self._audit = audit

    def grant(
        self,
        subject_ref: str,
        *,
        app_id: str,
        categories: Sequence[str],
        purposes: Sequence[str],
        legal_basis: str = "consent",
        expires_at: datetime | None = None,
        notice_version: str = "",
        collected_by: str = "",
        request_token: str | None = None,
        token_window_s: float = 0.0,
    ) -> str:
        """Record a consent (creating the subject on first consent); returns its id.

        With ``request_token`` already recorded in the stream (a retried keyed
        request), nothing is written and the first grant's id is returned.
        """
        now = self._clock.now()
        expires = to_utc(expires_at, "expires_at") if expires_at is not None else None
        clean_purposes = check_purposes(purposes)
        check_token("consent.app_id", app_id.strip())
        for purpose in clean_purposes:
            check_token("consent.purposes", purpose)
        for category in categories:
            if category.strip() != "*":
                check_category(category.strip())
        if not clean_purposes or not categories:
            raise InvalidInputError("consent needs at least one category and one purpose")
        handle = self._subjects.find_or_create(subject_ref, now=now, audit=self._audit)

        replayed = False

        def command() -> str:
            nonlocal replayed
            if self._app.exists(handle.stream_id):
                profile = self._app.load(handle.stream_id)
            else:
                profile = SubjectProfile(id=handle.stream_id, tenant=self._subjects.tenant)
            if request_token:
                first = profile.recorded_request(request_token, now=now, window_s=token_window_s)
                if first is not None:
                    replayed = True
                    return str(first["consent_id"])
                refuse_unrecorded()
            consent_id = profile.grant_consent(
                app_id=app_id.strip(),
                categories=tuple(c.strip() for c in categories),
                purposes=clean_purposes,
                legal_basis=legal_basis,
                granted_at=now,
                expires_at=expires,
                notice_version=notice_version,
                collected_by=collected_by,
            )
            if request_token:
                profile.record_request(
                    request_token, {"consent_id": consent_id}, now=now, window_s=token_window_s
                )
            self._app.save(profile)
            return consent_id

        # The key asked in the subject's writer turn and under the store's lock (TX, US).
        consent_id = self._app.with_retry(
            command, subject=handle.stream_id, credential=acting_credential.get()
        )
        if replayed:
            return consent_id
        self._audit.record(
            "consent.granted",
            subject_ref=handle.pseudonym,
            app_id=app_id,
            consent_id=consent_id,
            categories=sorted(set(categories)),
            purposes=sorted(set(clean_purposes)),
            legal_basis=legal_basis,
        )
        return consent_id

    def withdraw(
        self,
        subject_ref: str,
        consent_id: str,
        *,
        erase_requested: bool = False,
        request_token: str | None = None,
        token_window_s: float = 0.0,
        withdrawn_at: datetime | None = None,
    ) -> int:
        """Withdraw a consent; the next capture or read under it is refused.

        ``withdrawn_at`` is the time recorded (default: now).

        Returns the withdrawal's log position (notification id), or 0 when
        ``request_token`` shows this withdrawal was already recorded (a retried keyed
        request): then nothing is written.
        """
        handle = self._subjects.find(subject_ref)
        if handle is None:
            raise SubjectNotFoundError("no such subject")

        def command() -> int:
            profile = self._app.load(handle.stream_id)
            now = self._clock.now()
            if request_token:
                first = profile.recorded_request(request_token, now=now, window_s=token_window_s)
                if first is not None:
                    return 0
                refuse_unrecorded()
            profile.withdraw_consent(
                consent_id=consent_id,
                withdrawn_at=withdrawn_at or now,
                erase_requested=erase_requested,
            )
            if request_token:
                profile.record_request(
                    request_token, {"consent_id": consent_id}, now=now, window_s=token_window_s
                )
            recordings = self._app.save(profile)
            return next(
                r.notification.id
                for r in recordings
                if isinstance(r.domain_event, SubjectProfile.ConsentWithdrawn)
            )

        position = self._app.with_retry(  # the key asked as the grant's (TX, US)
            command, subject=handle.stream_id, credential=acting_credential.get()
        )
        if not position:
            return 0
        self._audit.record(
            "consent.withdrawn",
            subject_ref=handle.pseudonym,
            consent_id=consent_id,
            reason_code="erase-requested" if erase_requested else "withdrawn",
        )
        return position
