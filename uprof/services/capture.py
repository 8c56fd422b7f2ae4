"""Capture: interactions enter through the consent gate and become immutable events."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID

from domain.errors import ConsentRequiredError, InvalidInputError, SubjectErasedError
from domain.principal import acting_credential, acting_principal, qualified_agent
from domain.values import Interaction, check_text, check_token
from uprof import telemetry
from uprof.crypto.keystore import SubjectHandle, new_pseudonym
from uprof.ports import AuditTrail, Clock, EventStore, SubjectKeyStore
from uprof.services.capture_writer import (
    CaptureWriter,
    PendingCapture,
    capture_keys_created,
    no_consent_on_record,
)
from uprof.services.idempotency import refuse_unrecorded, replaying
from uprof.services.late_captures import LateRequest, record_accepted_late
from uprof.services.subjects import SubjectResolver, check_subject_ref

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


@dataclass(frozen=True)
class CaptureOutcome:
    """Acks of what was written; how many were skipped as already captured; and
    whether the whole request was a retry the stream already held."""

    acks: list[CaptureAck]
    skipped: int
    replayed: bool
    #: Of those skipped, the indices of the interactions whose item token names a
    #: capture erased at the subject's request (an import record; bug IC).
    erased: tuple[int, ...] = ()


def to_utc(value: datetime, field: str) -> datetime:
    if value.tzinfo is None:
        raise InvalidInputError(f"{field} must carry a timezone (e.g. 2024-05-01T10:00:00Z)")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before the first UTC instant
        raise InvalidInputError(f"{field} is out of range once in UTC") from None


_T = TypeVar("_T")


def check_interaction(interaction: Interaction) -> Interaction:
    """Validate one interaction; raise InvalidInputError naming the field (``field``: an
    import reports it per record, REST lists it in ``error.fields``)."""
    for name in ("app_id", "agent_id", "purpose"):
        _named(name, check_token, f"interaction.{name}", getattr(interaction, name))
    if interaction.agent_type:
        _named("agent_type", check_token, "interaction.agent_type", interaction.agent_type)
    if not (interaction.user_input.strip() or interaction.agent_response.strip()):
        raise InvalidInputError(
            "interaction needs user_input or agent_response text", field="user_input"
        )
    for name in ("user_input", "agent_response", "actor", "source_ref", "session_id"):
        _named(name, check_text, f"interaction.{name}", getattr(interaction, name))
    for name in ("user_input", "agent_response"):
        if len(getattr(interaction, name)) > MAX_TEXT_CHARS:
            raise InvalidInputError(
                f"interaction.{name} exceeds {MAX_TEXT_CHARS} characters", field=name
            )
    occurred_at = _named("occurred_at", to_utc, interaction.occurred_at, "occurred_at")
    # Agents belong to their app: the capture names the qualified agent (I4).
    agent_id = _named("agent_id", qualified_agent, interaction.app_id, interaction.agent_id)
    return replace(interaction, occurred_at=occurred_at, agent_id=agent_id)


def _named(name: str, check: Callable[..., _T], *args: Any) -> _T:
    """``check(*args)``, naming ``name`` as the field of an InvalidInputError raised
    inside: the record's own field, whatever name the check used in its message
    (``interaction.agent_id``). A plain call, not a context manager: it runs ten times
    per captured event."""
    try:
        return check(*args)
    except InvalidInputError as error:
        if error.field == name:
            raise
        raise InvalidInputError(str(error), field=name) from None


def _checked(
    subject_ref: str, interactions: Sequence[Interaction]
) -> tuple[str, list[Interaction]]:
    """The checked subject reference and interactions; InvalidInputError names the field."""
    if len(interactions) > MAX_BATCH:
        raise InvalidInputError(f"at most {MAX_BATCH} interactions per batch")
    checked = []
    for index, interaction in enumerate(interactions):
        try:
            checked.append(check_interaction(interaction))
        except InvalidInputError as e:
            field = e.field
            if field is not None and len(interactions) > 1:
                field = f"interactions.{index}.{field}"
            raise InvalidInputError(f"interaction #{index}: {e}", field=field) from None
    return check_subject_ref(subject_ref), checked


class CaptureService:
    def __init__(
        self,
        app: EventStore,
        subjects: SubjectResolver,
        keystore: SubjectKeyStore,
        clock: Clock,
        audit: AuditTrail,
        ref_token: Callable[[str, str], str | None] = lambda app_id, ref: None,
    ) -> None:
        """``ref_token(app_id, source_ref)``: the import's keyed token of a ref, which a
        subject's stream keeps for each capture erased at the subject's request."""
        self._app = app
        self._ref_token = ref_token
        self._keystore = keystore
        self._subjects = subjects
        self._clock = clock
        self._audit = audit
        #: The group-commit writer (decision 0017). Long-running front doors start it;
        #: until then (embedded use, the CLI) captures commit on the caller's thread.
        self.writer = CaptureWriter(app, keystore, clock, audit, subjects, self._write_alone)

    def capture(self, subject_ref: str, interaction: Interaction) -> CaptureAck:
        return self.capture_many(subject_ref, [interaction])[0]

    def capture_many(
        self,
        subject_ref: str,
        interactions: Sequence[Interaction],
        *,
        request_token: str | None = None,
        token_window_s: float = 0.0,
    ) -> list[CaptureAck]:
        """Record interactions for one subject in one transaction, all or nothing.

        Raises ConsentRequiredError if any one lacks consent; then nothing is stored
        and the refusal is audited (without the content).

        ``request_token`` (an idempotency token, see services/idempotency.py): if the
        subject's stream already recorded it within ``token_window_s``, nothing is
        written and the acks of that first write are returned.
        """
        return self.capture_once(
            subject_ref, interactions, batch_token=request_token, token_window_s=token_window_s
        ).acks

    def capture_once(
        self,
        subject_ref: str,
        interactions: Sequence[Interaction],
        *,
        batch_token: str | None = None,
        item_tokens: Sequence[str | None] | None = None,
        token_window_s: float = 0.0,
    ) -> CaptureOutcome:
        """Capture with retry tokens: ``batch_token`` names the whole batch (a keyed
        REST request), ``item_tokens`` one token per interaction (import records);
        interactions whose token the stream already holds are skipped."""
        with telemetry.span("uprof.capture", interactions=len(interactions)) as traced:
            outcome = self._capture(
                subject_ref,
                interactions,
                batch_token=batch_token,
                item_tokens=item_tokens,
                token_window_s=token_window_s,
                traced=traced,
            )
            _trace_outcome(traced, outcome)
            return outcome

    def _capture(
        self,
        subject_ref: str,
        interactions: Sequence[Interaction],
        *,
        batch_token: str | None,
        item_tokens: Sequence[str | None] | None,
        token_window_s: float,
        traced: telemetry.SpanLike,
    ) -> CaptureOutcome:
        if not interactions:
            return CaptureOutcome([], 0, False)
        if item_tokens is not None and len(item_tokens) != len(interactions):
            raise InvalidInputError("one token per interaction")
        ref, checked = _checked(subject_ref, interactions)
        if item_tokens is None and self.writer.running:
            # The writer looks the subject up with the rest of its group.
            pending = self._pending(ref, checked, batch_token, token_window_s, traced)
            self.writer.submit(pending)
            return self._answer(pending)

        handle = self._handle(ref, checked[0])
        outcome = self._save_one(
            handle.stream_id,
            handle.pseudonym,
            checked,
            batch_token=batch_token,
            item_tokens=item_tokens,
            token_window_s=token_window_s,
            still_authenticated=acting_credential.get(),
        )
        if outcome.replayed:
            self._record_late(outcome, checked[0], None)
        return outcome

    async def capture_async(
        self, subject_ref: str, interactions: Sequence[Interaction], *, token_window_s: float
    ) -> list[CaptureAck]:
        """``capture_many`` (without a request token) for a coroutine on an event loop.

        The checks run on the loop; the subject lookup and the commits run on the
        writer thread, so the loop never waits on a query or a commit, and no thread
        is held while the request waits. The answer and its guarantee are
        ``capture_many``'s: acks only after the key, event and audit commits.
        """
        if not interactions:
            return []
        with telemetry.span("uprof.capture", interactions=len(interactions)) as traced:
            ref, checked = _checked(subject_ref, interactions)
            pending = self._pending(ref, checked, None, token_window_s, traced)
            await self.writer.submit_async(pending)
            outcome = self._answer(pending)
            _trace_outcome(traced, outcome)
            return outcome.acks

    def _pending(
        self,
        subject_ref: str,
        checked: Sequence[Interaction],
        batch_token: str | None,
        token_window_s: float,
        traced: telemetry.SpanLike,
    ) -> PendingCapture:
        principal = acting_principal.get()
        return PendingCapture(
            subject_ref=subject_ref,
            interactions=checked,
            batch_token=batch_token,
            token_window_s=token_window_s,
            principal=principal.label if principal is not None else None,
            replay=replaying.get(),
            still_authenticated=acting_credential.get(),
            trace_link=traced.link(),
        )

    def _handle(
        self, subject_ref: str, first: Interaction, *, principal: str | None = None
    ) -> SubjectHandle:
        """The subject's stream for a write; refused (and audited) when the reference
        names no subject or an erased one."""
        try:
            handle = self._subjects.find(subject_ref)
        except SubjectErasedError:
            self._refused(new_pseudonym(), first, "subject-erased", principal=principal)
            raise
        if handle is None:
            # Unknown subject: a one-off pseudonym, linked to nothing (no stable keyed
            # hash of the reference, which would join a refused attempt to a later one).
            self._refused(new_pseudonym(), first, "no-consent-on-record", principal=principal)
            raise no_consent_on_record(first)
        return handle

    def _save_one(
        self,
        stream_id: UUID,
        pseudonym: str,
        checked: Sequence[Interaction],
        *,
        batch_token: str | None,
        item_tokens: Sequence[str | None] | None,
        token_window_s: float,
        principal: str | None = None,
        replay: bool | None = None,
        still_authenticated: Callable[[], None] | None = None,
    ) -> CaptureOutcome:
        """One request in its own transactions (load, decide, keys, save, audit), retried
        when another writer saved first. ``principal``: the audit label, and ``replay``:
        whether it is a replay, when the caller's context does not carry them (the writer
        thread). ``still_authenticated``: the request's key check (``acting_credential``),
        asked in the subject's writer turn before each attempt."""

        made: dict[str, str] = {}  # capture id -> its key's commitment
        erased: list[int] = []  # indices skipped as erased at the subject's request

        def save() -> tuple[list[str], list[int], int, dict[str, Any] | None]:
            made.clear()  # a retried save makes its keys again
            erased.clear()
            profile = self._app.load(stream_id)
            now = self._clock.now()
            if batch_token or item_tokens is not None:
                # A retry is answered only under a consent in force now, as a fresh call;
                # so is an import record whose token the stream holds (it is "skipped").
                for interaction in checked:
                    profile.require_capture_consent(interaction, now)
            if batch_token:
                first = profile.recorded_request(batch_token, now=now, window_s=token_window_s)
                if first is not None:
                    return [], [], 0, first
                refuse_unrecorded(replay)
            ids: list[str] = []
            versions: list[int] = []
            skipped = 0
            tokens: dict[str, dict[str, Any]] = {}
            for index, interaction in enumerate(checked):
                token = item_tokens[index] if item_tokens is not None else None
                ref = (
                    self._ref_token(interaction.app_id, interaction.source_ref)
                    if item_tokens is not None and interaction.source_ref
                    else None
                )
                if ref and profile.ref_erased(ref):
                    # An import record (it has item tokens) whose capture was erased at
                    # the subject's request: never again, however late (bug IC). Live
                    # captures are not skipped (decision 0147-erased-refs-stay-erased).
                    erased.append(index)
                    skipped += 1
                    continue
                if token and (
                    token in tokens
                    or profile.recorded_request(token, now=now, window_s=token_window_s)
                ):
                    skipped += 1
                    continue
                capture_id = profile.capture(interaction, now=now)
                ids.append(capture_id)
                versions.append(profile.version)
                if token:
                    tokens[token] = {"capture_ids": [capture_id], "versions": [profile.version]}
            if not ids:
                return [], [], skipped, None
            if batch_token:
                tokens[batch_token] = {"capture_ids": ids, "versions": versions}
            # One event for the batch's tokens, saved with its captures.
            profile.record_requests(tokens, now=now, window_s=token_window_s)
            # Each captured event gets its own key before it is sealed (item-level shredding).
            with telemetry.span("uprof.capture.commit.keys", captures=len(ids)):
                made.update(
                    self._keystore.create_capture_keys(str(stream_id), ids, now=self._clock.now())
                )
            with telemetry.span("uprof.capture.commit.events", events=len(ids) + 1):
                recordings = self._app.save(profile)
            by_version = {r.notification.originator_version: r.notification.id for r in recordings}
            return ids, [by_version[v] for v in versions], skipped, None

        try:
            # The request's key asked in the subject's writer turn before each attempt and
            # under the store's lock (``with_retry``): a key revoked while the capture
            # waited writes nothing. The one-request road (no group commit, the writer's
            # fallback) had its capture written (bug UJ), where the writer asks it
            # (``capture_writer.keys_refused``, TW).
            ids, notification_ids, skipped, first = self._app.with_retry(
                save, subject=stream_id, credential=still_authenticated
            )
        except ConsentRequiredError:
            self._refused(pseudonym, checked[0], "consent-not-in-force", principal=principal)
            raise
        if first is not None:
            # A retry of a write the stream already holds: the first write's acks.
            ids = list(first["capture_ids"])
            notification_ids = self._app.notification_ids(stream_id, first["versions"])
            return CaptureOutcome(
                [CaptureAck(c, n, pseudonym) for c, n in zip(ids, notification_ids, strict=True)],
                0,
                True,
            )
        if ids:
            with telemetry.span("uprof.capture.commit.audit", events=1):
                accepted = {
                    "subject_ref": pseudonym,
                    "app_id": checked[0].app_id,
                    "agent_id": checked[0].agent_id,
                    "purpose": checked[0].purpose,
                    "counts": {"events": len(ids)},
                    "notification_id": max(notification_ids),
                    "principal": principal,
                }
                self._audit.record_many(
                    [("capture.accepted", accepted), *capture_keys_created(pseudonym, made)]
                )
        return CaptureOutcome(
            [
                CaptureAck(capture_id, nid, pseudonym)
                for capture_id, nid in zip(ids, notification_ids, strict=True)
            ],
            skipped,
            False,
            tuple(erased),
        )

    def _answer(self, pending: PendingCapture) -> CaptureOutcome:
        """The outcome of a request the writer answered (or its error, raised)."""
        if pending.error is not None:
            raise pending.error
        assert pending.acks is not None
        outcome = CaptureOutcome(
            [CaptureAck(c, n, pending.pseudonym) for c, n in pending.acks],
            0,
            pending.replayed,
        )
        if outcome.replayed:
            # On the request's thread, not the writer's (nor its one-request fallback's):
            # no group waits for this read. capture_async takes no token, never replays.
            self._record_late(outcome, pending.interactions[0], pending.principal)
        return outcome

    def _record_late(
        self, outcome: CaptureOutcome, first: Interaction, principal: str | None
    ) -> None:
        """A keyed retry answered from the stream: append the first write's
        ``capture.accepted`` (``reason_code`` recorded-late) if a crash between the
        first write's commit and its audit append kept it off the log; exactly once
        across processes (``once_by`` its ``notification_id``, read under the log's
        write lock). Called where a replayed outcome is answered, on the caller's
        thread: the one-request path (``_capture``) and the writer's (``_answer``). The
        only path that adds a read; a fresh capture never runs it. The same append as the
        extraction worker's reconciliation (``uprof.services.late_captures``)."""
        if not outcome.acks:
            return
        record_accepted_late(
            self._audit,
            [
                LateRequest(
                    subject_ref=outcome.acks[0].subject_pseudonym,
                    app_id=first.app_id,
                    agent_id=first.agent_id,
                    purpose=first.purpose,
                    events=len(outcome.acks),
                    notification_id=max(a.notification_id for a in outcome.acks),
                    principal=principal,
                )
            ],
        )

    def _write_alone(self, pending: PendingCapture) -> None:
        """The one-request path for a queued request (the writer's fallback)."""
        token = acting_principal.set(None)  # the entry names the principal explicitly
        try:
            if pending.stream_id is None:  # queued before the writer looked it up
                handle = self._handle(
                    pending.subject_ref or "", pending.interactions[0], principal=pending.principal
                )
                pending.stream_id, pending.pseudonym = handle.stream_id, handle.pseudonym
            outcome = self._save_one(
                pending.stream_id,
                pending.pseudonym,
                pending.interactions,
                batch_token=pending.batch_token,
                item_tokens=None,
                token_window_s=pending.token_window_s,
                principal=pending.principal,
                replay=pending.replay,
                still_authenticated=pending.still_authenticated,  # asked in the turn
            )
        except BaseException as error:
            pending.error = error
            return
        finally:
            acting_principal.reset(token)
        pending.acks = [(a.capture_id, a.notification_id) for a in outcome.acks]
        pending.replayed = outcome.replayed

    def _refused(
        self, pseudonym: str, interaction: Interaction, reason: str, *, principal: str | None = None
    ) -> None:
        self._audit.record(
            "capture.refused",
            subject_ref=pseudonym,
            app_id=interaction.app_id,
            agent_id=interaction.agent_id,
            purpose=interaction.purpose,
            reason_code=reason,
            principal=principal,
        )


def _trace_outcome(traced: telemetry.SpanLike, outcome: CaptureOutcome) -> None:
    traced.set(
        captures=len(outcome.acks),
        replayed=outcome.replayed,
        outcome="replayed" if outcome.replayed else "written",
    )
