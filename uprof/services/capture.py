"""Capture: interactions enter through the consent gate and become immutable events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from domain.errors import ConsentRequiredError, InvalidInputError, SubjectErasedError
from domain.profile import SubjectProfile
from domain.values import Interaction, check_text, check_token
from uprof.crypto.keystore import KeyStore, new_pseudonym
from uprof.eventstore import ProfilesApplication
from uprof.ports import AuditTrail, Clock
from uprof.services.subjects import SubjectResolver

#: Longest user input or agent response accepted in one interaction.
MAX_TEXT_CHARS = 32_000
#: Most interactions recorded in one transaction.
MAX_BATCH = 5_000


@dataclass(frozen=True)
class CaptureAck:
    """What the caller gets back: ids it can cite later as evidence."""

    capture_id: str
    notification_id: int
    subject_pseudonym: str


def to_utc(value: datetime, field: str) -> datetime:
    if value.tzinfo is None:
        raise InvalidInputError(f"{field} must carry a timezone (e.g. 2024-05-01T10:00:00Z)")
    return value.astimezone(UTC)


def check_interaction(interaction: Interaction) -> Interaction:
    """Validate one interaction; raise InvalidInputError naming the field."""
    for name in ("app_id", "agent_id", "purpose"):
        check_token(f"interaction.{name}", getattr(interaction, name))
    if interaction.agent_type:
        check_token("interaction.agent_type", interaction.agent_type)
    if not (interaction.user_input.strip() or interaction.agent_response.strip()):
        raise InvalidInputError("interaction needs user_input or agent_response text")
    for name in ("user_input", "agent_response", "actor", "source_ref", "session_id"):
        check_text(f"interaction.{name}", getattr(interaction, name))
    for name in ("user_input", "agent_response"):
        if len(getattr(interaction, name)) > MAX_TEXT_CHARS:
            raise InvalidInputError(f"interaction.{name} exceeds {MAX_TEXT_CHARS} characters")
    return replace(interaction, occurred_at=to_utc(interaction.occurred_at, "occurred_at"))


class CaptureService:
    def __init__(
        self,
        app: ProfilesApplication,
        subjects: SubjectResolver,
        keystore: KeyStore,
        clock: Clock,
        audit: AuditTrail,
    ) -> None:
        self._app = app
        self._keystore = keystore
        self._subjects = subjects
        self._clock = clock
        self._audit = audit

    def capture(self, subject_ref: str, interaction: Interaction) -> CaptureAck:
        return self.capture_many(subject_ref, [interaction])[0]

    def capture_many(
        self, subject_ref: str, interactions: Sequence[Interaction]
    ) -> list[CaptureAck]:
        """Record interactions for one subject in one transaction, all or nothing.

        Raises ConsentRequiredError if any one lacks consent; then nothing is stored
        and the refusal is audited (without the content).
        """
        if not interactions:
            return []
        if len(interactions) > MAX_BATCH:
            raise InvalidInputError(f"at most {MAX_BATCH} interactions per batch")
        checked = []
        for index, interaction in enumerate(interactions):
            try:
                checked.append(check_interaction(interaction))
            except InvalidInputError as e:
                raise InvalidInputError(f"interaction #{index}: {e}") from None
        try:
            handle = self._subjects.find(subject_ref)
        except SubjectErasedError:
            self._refused(new_pseudonym(), checked[0], "subject-erased")
            raise
        # Unknown subject: a one-off pseudonym, linked to nothing (no stable keyed hash
        # of the reference, which would join a refused attempt to a later subject).
        pseudonym = handle.pseudonym if handle is not None else new_pseudonym()
        if handle is None:
            self._refused(pseudonym, checked[0], "no-consent-on-record")
            raise ConsentRequiredError(
                f"app {checked[0].app_id!r} has no consent in force for this subject"
            )

        def command() -> tuple[SubjectProfile, list[str]]:
            profile = self._app.load(handle.stream_id)
            now = self._clock.now()
            ids = [profile.capture(i, now=now) for i in checked]
            return profile, ids

        def save() -> tuple[list[str], list[int]]:
            profile, ids = command()
            # Each captured event gets its own key before it is sealed (item-level shredding).
            self._keystore.create_capture_keys(str(handle.stream_id), ids, now=self._clock.now())
            recordings = self._app.save(profile)
            return ids, [r.notification.id for r in recordings]

        try:
            ids, notification_ids = self._app.with_retry(save, subject=handle.stream_id)
        except ConsentRequiredError:
            self._refused(pseudonym, checked[0], "consent-not-in-force")
            raise
        self._audit.record(
            "capture.accepted",
            subject_ref=pseudonym,
            app_id=checked[0].app_id,
            agent_id=checked[0].agent_id,
            purpose=checked[0].purpose,
            counts={"events": len(ids)},
            notification_id=max(notification_ids),
        )
        return [
            CaptureAck(capture_id, nid, pseudonym)
            for capture_id, nid in zip(ids, notification_ids, strict=True)
        ]

    def _refused(self, pseudonym: str, interaction: Interaction, reason: str) -> None:
        self._audit.record(
            "capture.refused",
            subject_ref=pseudonym,
            app_id=interaction.app_id,
            agent_id=interaction.agent_id,
            purpose=interaction.purpose,
            reason_code=reason,
        )
