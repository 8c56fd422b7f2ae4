"""Consent: users grant and withdraw; the gate reads it from the subject's stream."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from domain.errors import InvalidInputError, SubjectNotFoundError
from domain.profile import SubjectProfile
from domain.values import check_category, check_token
from uprof.ports import AuditTrail, Clock, EventStore
from uprof.services.capture import to_utc
from uprof.services.subjects import SubjectResolver

PURPOSE_MAX = 64


def check_purposes(purposes: Sequence[str]) -> tuple[str, ...]:
    cleaned = tuple(p.strip() for p in purposes if p.strip())
    for p in cleaned:
        if len(p) > PURPOSE_MAX or any(ch in p for ch in ",\n\r"):
            raise InvalidInputError(f"purpose {p!r} is malformed (no commas or newlines)")
    return cleaned


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
        handle = self._subjects.find_or_create(subject_ref, now=now)

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

        consent_id = self._app.with_retry(command, subject=handle.stream_id)
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
    ) -> bool:
        """Withdraw a consent; the next capture or read under it is refused.

        Returns False when ``request_token`` shows this withdrawal was already
        recorded (a retried keyed request): then nothing is written.
        """
        handle = self._subjects.find(subject_ref)
        if handle is None:
            raise SubjectNotFoundError("no such subject")

        def command() -> bool:
            profile = self._app.load(handle.stream_id)
            now = self._clock.now()
            if (
                request_token
                and profile.recorded_request(request_token, now=now, window_s=token_window_s)
                is not None
            ):
                return False
            profile.withdraw_consent(
                consent_id=consent_id,
                withdrawn_at=now,
                erase_requested=erase_requested,
            )
            if request_token:
                profile.record_request(
                    request_token, {"consent_id": consent_id}, now=now, window_s=token_window_s
                )
            self._app.save(profile)
            return True

        if not self._app.with_retry(command, subject=handle.stream_id):
            return False
        self._audit.record(
            "consent.withdrawn",
            subject_ref=handle.pseudonym,
            consent_id=consent_id,
            reason_code="erase-requested" if erase_requested else "withdrawn",
        )
        return True
