"""The in-process API of uprof: one object per deployment, built by ``bootstrap``.

Nothing outside the composition root and the authorized door calls it: every
surface (REST, MCP, web pages, the SDK's embedded mode, the CLI) goes through
``uprof.facade.Facade``, which binds an authenticated principal and asks the
policy before calling these methods. The kernel itself trusts its arguments.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from os import PathLike
from typing import TYPE_CHECKING, Any, ClassVar, TextIO
from uuid import UUID

from audit.export import ExportStream, ExportSummary, stream_export
from domain.errors import (
    ConcurrencyConflictError,
    InvalidInputError,
    ReadRecordingError,
    ReadTimeoutError,
    SubjectErasedError,
    SubjectNotFoundError,
    UprofError,
)
from domain.values import ConsentGrant, Interaction, ProposalBatch
from projections.profile.queries import ConsentRow
from uprof import retry, telemetry
from uprof.crypto.keystore import KeyStore, is_pseudonym
from uprof.crypto.ledger import LedgerState
from uprof.eventstore import ProfilesApplication
from uprof.ports import AuditTrail, Clock, ViewStore
from uprof.retrieval import text as retrieval_text
from uprof.services.capture import CaptureAck, CaptureOutcome, CaptureService
from uprof.services.consent import ConsentService, collected_under
from uprof.services.erasure import ErasureResult, ErasureService, HostSettled
from uprof.services.erasure import _token as _token
from uprof.services.extraction import ExtractionWorker
from uprof.services.idempotency import (
    Execute,
    IdempotencyStore,
    Outcome,
    client_wait_left,
    replaying,
)
from uprof.services.maintenance import MaintenanceService
from uprof.services.paging import CursorCodec
from uprof.services.policy import PolicyChange, PolicyChangeResult, PolicyService, PolicyState
from uprof.services.profile import EvidenceView, ProfileService, ProfileView
from uprof.services.projection import ProjectionRunner
from uprof.services.proposals import ProposalService
from uprof.services.quarantine import QuarantinedCapture, QuarantineService, RetryOutcome
from uprof.services.rate_limits import RateCounters, RateLimiter
from uprof.services.reads import ReadRecorder
from uprof.services.residue import (
    ResidueReport,
    check_shredded_streams,
    erasures_at,
    label_erasures,
    scan_database,
    scan_files,
)
from uprof.services.sign_outs import SignOuts
from uprof.services.slices import Freshness, ProfileSlice, SliceRequest, SliceService
from uprof.services.subject_export import build_subject_export
from uprof.services.subjects import SubjectRequest, SubjectResolver, check_subject_ref
from uprof.settings import Settings, parse_rate_limit
from uprof.vector_model import RecordedModelEmbedder

if TYPE_CHECKING:
    from collections.abc import Iterator

    from audit.check import CheckResult, Kind
    from audit.log import AuditLog, StoredEntry
    from uprof.apikeys.store import ApiKeyInfo, ApiKeyStore, IssuedKey
    from uprof.services.backup import BackupReport

Progress = Callable[[int, int], None]
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lag:
    """How far the derived stores are behind the log."""

    log_position: int
    extraction_pending: int
    projection_pending: int
    #: Captures set aside because their extraction failed on every attempt (they do
    #: not hold the pipeline up, so ``caught_up`` does not count them).
    quarantined: int = 0
    #: Where the pipeline's workers are, and what each has pending: (position, pending)
    #: of every extraction partition, then of every projection partition. Only the
    #: workers (and a rebuild) move a position; the log position also moves for every
    #: other write (a consent, an erasure), which is no work done on what is pending (bug
    #: WE), and one partition's worker moving says nothing of another's (bug WG).
    worked_to: tuple[tuple[int, int], ...] = ()

    @property
    def caught_up(self) -> bool:
        return self.extraction_pending == 0 and self.projection_pending == 0


@dataclass
class Uprof:
    """Facade over the services of one deployment."""

    settings: Settings
    app: ProfilesApplication
    keystore: KeyStore
    subjects: SubjectResolver
    queries: ViewStore
    clock: Clock
    audit: AuditTrail
    capture_service: CaptureService
    consent_service: ConsentService
    proposal_service: ProposalService
    profile_service: ProfileService
    extraction: ExtractionWorker
    projections: ProjectionRunner
    maintenance: MaintenanceService
    slice_service: SliceService
    reads: ReadRecorder
    erasure_service: ErasureService
    #: The one policy decision point (Casbin); the facade and the slice gate share it.
    authorizer: Any
    audit_log: AuditLog
    views_engine: Any
    keys_engine: Any
    closers: Sequence[Callable[[], None]] = ()
    #: How long an API-key revocation waits for another one holding the revocation lock
    #: (bug DL) before it revokes without it.
    REVOCATION_LOCK_WAIT_S: ClassVar[float] = 30.0
    #: How long an erasing withdrawal waits for another one of the same consent (its
    #: erasure waits for the views, 30 s at most, then shreds) before it answers "retry".
    CONSENT_ERASURE_TURN_WAIT_S: ClassVar[float] = 60.0
    #: Signs the web pages' session cookies (derived from the master secret in the key
    #: folder, so sessions survive a restart and hold on every server of a deployment).
    web_session_key: bytes = b""
    #: Web sessions signed out, for every server (None in kernels built without bootstrap:
    #: the web pages then remember sign-outs in memory only).
    web_sign_outs: SignOuts | None = None
    #: The deployment's rate-limit counters, shared by every process (None in kernels
    #: built without bootstrap: ``rate_limiter`` makes them over ``views_engine``).
    rate_counters: RateCounters | None = None
    #: Called when a read finds its subject behind and background workers must catch
    #: up (a long-running server sets it to its worker's wake-up).
    wake_workers: Callable[[], None] = lambda: None
    #: Background workers started over this kernel (by a front door's runtime); close()
    #: stops them first, so no worker writes through a connection being closed.
    worker_stoppers: list[Callable[[], None]] = field(default_factory=list, repr=False)
    #: Keys of retried writes (I14); None only in kernels built without bootstrap.
    idempotency: IdempotencyStore | None = None
    _process_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    #: The event-sourced policy store (``uprof.services.policy``); ``authorizer`` follows it.
    policy_service: PolicyService | None = None
    #: Signs and opens the cursors of paged lists (``uprof.services.paging``).
    cursors: CursorCodec | None = None
    #: The embedder as the services see it: it refuses to embed when the store's vectors
    #: were made by another model (uprof.vector_model); None in kernels built without
    #: bootstrap.
    vector_model: RecordedModelEmbedder | None = None
    #: The erasure ledger as this process last looked at it (``forget_erased_elsewhere``).
    _ledger_seen: LedgerState | None = field(default=None, repr=False)
    _ledger_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Captures whose extraction failed on every attempt (``uprof.services.quarantine``);
    #: None only in kernels built without bootstrap.
    quarantine: QuarantineService | None = None

    def __post_init__(self) -> None:
        # Nothing is cached yet: erasures recorded before this start need no flush.
        if self.keystore.ledger is not None:
            self._ledger_seen = self.keystore.ledger.state()

    # ----------------------------------------------------------------- writes

    def idempotent(
        self, app_id: str, key: str, operation: str, body: dict[str, Any], execute: Execute
    ) -> Outcome:
        """Run a keyed write at most once per (app, key) and replay its first answer (I14).

        ``execute(token)`` does the write, passing ``token`` as ``request_token`` to the
        write method below; see services/idempotency.py for the guarantees. A replay
        runs it again first (decided like a fresh call, writing nothing) and is audited
        as ``request.replayed``.
        """
        outcome = self._idempotency().run(app_id, key, operation, body, execute)
        if outcome.replayed:
            # A first answer served again (after the write path let the retry through).
            pseudonym = outcome.response.get("subject_pseudonym")
            self.audit.record(
                "request.replayed",
                app_id=app_id,
                reason_code=operation,
                subject_ref=pseudonym if isinstance(pseudonym, str) else None,
            )
        return outcome

    def request_token(self, app_id: str, key: str, *, namespace: str = "key") -> str:
        """The per-app token of an idempotency key (or, namespace "source_ref", of a ref)."""
        return self._idempotency().token(app_id, key, namespace=namespace)

    def purge_idempotency_keys(self) -> int:
        """Forget idempotency keys past their retention; returns how many went."""
        return self._idempotency().purge()

    def _idempotency(self) -> IdempotencyStore:
        if self.idempotency is None:
            raise InvalidInputError("idempotency keys are not configured in this kernel")
        return self.idempotency

    @property
    def _token_window_s(self) -> float:
        return self.settings.idempotency_retention_s

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
        return self.capture_service.capture_many(
            subject, interactions, request_token=request_token, token_window_s=self._token_window_s
        )

    async def capture_async(
        self, subject: str, interactions: Sequence[Interaction]
    ) -> list[CaptureAck]:
        """``capture_many`` for a coroutine on an event loop (the REST capture route)."""
        return await self.capture_service.capture_async(
            subject, interactions, token_window_s=self._token_window_s
        )

    def capture_once(
        self,
        subject: str,
        interactions: Sequence[Interaction],
        *,
        item_tokens: Sequence[str | None],
    ) -> CaptureOutcome:
        """Capture, skipping interactions whose token the subject's stream holds (import)."""
        return self.capture_service.capture_once(
            subject, interactions, item_tokens=item_tokens, token_window_s=self._token_window_s
        )

    def grant_consent(
        self,
        subject: str,
        *,
        app_id: str,
        categories: Sequence[str],
        purposes: Sequence[str],
        legal_basis: str = "consent",
        expires_at: datetime | None = None,
        collected_by: str = "",
        request_token: str | None = None,
    ) -> str:
        return self.consent_service.grant(
            subject,
            app_id=app_id,
            categories=categories,
            purposes=purposes,
            legal_basis=legal_basis,
            expires_at=expires_at,
            collected_by=collected_by,
            request_token=request_token,
            token_window_s=self._token_window_s,
        )

    def unconsented(
        self, subject: str, app_id: str, categories: Sequence[str], purpose: str
    ) -> list[str]:
        """The categories for which ``app_id`` holds no consent in force now."""
        profile = self.app.load(self.stream_of(subject))
        now = self.clock.now()
        return [
            c
            for c in categories
            if not profile.has_consent(app_id=app_id, category=c, purpose=purpose, at=now)
        ]

    def consents_in_force(self, subject: str, *, app_id: str | None = None) -> list[ConsentGrant]:
        """The subject's consents not withdrawn (one app's, if named), from its stream.

        Read from the event log, not the views: what a withdrawal needs to know is there
        the moment it is, whether or not extraction and projections have caught up.
        Expired consents are listed too (they may still be withdrawn).
        """
        profile = self.app.load(self.stream_of(subject))
        return [g for g in profile.consents_held() if app_id is None or g.app_id == app_id]

    def withdraw_consent(
        self,
        subject: str,
        consent_id: str,
        *,
        erase: bool = False,
        request_token: str | None = None,
        withdrawn_at: datetime | None = None,
        still_allowed: Callable[[], object] | None = None,
    ) -> ErasureResult | None:
        """Withdraw a consent; with ``erase``, also erase what was collected under it.

        What was collected under it is the app's captures for its purposes after the
        grant and before the withdrawal, by log position (``collected_under``).
        A retried keyed withdrawal writes nothing again; with ``erase`` it finishes
        erasing whatever collected data is still there (none if the first finished).
        Asking again, with any token or none, for a consent already withdrawn with
        ``erase`` finishes its erasure that answered erasure_incomplete (the receipt of
        that request), or erases what is still collected under it when its erasure never
        began (bug RE); when nothing of it is left, it writes nothing.
        Without ``erase`` nothing waits for the views: the withdrawal is a write to the
        subject's stream and is in force for the next request whatever the pipeline's
        lag (a lagging or stopped worker, or the app's own captures keeping it busy,
        must not hold a withdrawal up). ``withdrawn_at`` is the time to record (default:
        now), so that a caller can answer with what was recorded. ``still_allowed``:
        the caller's decision of an ``erase``, asked again after the waits and before
        the first write (as ``erase_subject``'s; finishing an earlier request is not).
        """
        self._settle_reads()
        if not erase:
            self.consent_service.withdraw(
                subject,
                consent_id,
                request_token=request_token,
                token_window_s=self._token_window_s,
                withdrawn_at=withdrawn_at,
            )
            return None
        with self._consent_erasure_turn(subject, consent_id):
            return self._withdraw_and_erase(
                subject, consent_id, request_token, withdrawn_at, still_allowed
            )

    @contextlib.contextmanager
    def _consent_erasure_turn(self, subject: str, consent_id: str) -> Iterator[None]:
        """One erasing withdrawal of a consent at a time, across processes (a lock of the
        deployment's, dropped with a dead holder). Two at once (a double click on the
        privacy center's "Finish erasure", two retries) both collected the captures
        still listed and both erased them: two receipts for one erasure (review of 0211
        to 0214, bug TF). The second, in its turn, reads the consent and the views
        after the first's erasure and finds nothing left to erase. The name holds the
        stream's pseudonymous id, never the subject reference (a lock's name may be seen
        in a lock file's folder or ``pg_locks`` as a hash only, but need not be trusted
        to)."""
        from uprof.backends import backend_for

        name = f"consent-erasure/{self.stream_of(subject)}/{consent_id}"
        # No longer than the client waits, when it said (``Prefer: wait``, as the key's
        # turn since bug LV): past it the 409 went to nobody, the SDK's send was cut by
        # its read timeout, and the abandoned request erased later on a server worker
        # (0219-review-of-0216-and-tf, bug UA).
        wait_s = self.CONSENT_ERASURE_TURN_WAIT_S
        client_left = client_wait_left()
        if client_left is not None:
            wait_s = min(wait_s, client_left)
        turn = backend_for(self.views_engine).named_lock(self.views_engine, name, wait_s=wait_s)
        with turn as held:
            if not held:
                raise ConcurrencyConflictError(
                    "another request is erasing what was collected under this consent; "
                    "nothing was written"
                )
            yield

    def _withdraw_and_erase(
        self,
        subject: str,
        consent_id: str,
        request_token: str | None,
        withdrawn_at: datetime | None,
        still_allowed: Callable[[], object] | None,
    ) -> ErasureResult | None:
        """``withdraw_consent`` with ``erase``, in the consent's erasure turn."""
        grant = next(
            (c for c in self.profile(subject).consents if c.consent_id == consent_id), None
        )
        if grant is not None:
            # An earlier withdrawal's erasure that answered erasure_incomplete: finish it,
            # whether or not its captures are still listed. Looked for before withdrawing:
            # that consent is withdrawn already, so a retry that does not carry the first
            # request's token (none, or another) would be refused as "no consent in force".
            unfinished = self.erasure_service.resume(subject, "consent-withdrawal", [consent_id])
            if unfinished is not None:
                return unfinished
        asked_again = grant is not None and grant.withdrawn_at is not None and grant.erase_requested
        if still_allowed is not None:
            still_allowed()  # after the waits (reads settled, views current), before writing
        withdrawn_position: int | None = None
        if not (asked_again and request_token is None):
            try:
                withdrawn_position = self.consent_service.withdraw(
                    subject,
                    consent_id,
                    erase_requested=True,
                    request_token=request_token,
                    token_window_s=self._token_window_s,
                    withdrawn_at=withdrawn_at,
                )
            except InvalidInputError:
                if not asked_again:
                    raise
                request_token = None  # another request's token: as a retry without one
        # Withdrawn with erase already and nothing of its erasure recorded: the request
        # that withdrew stopped before its erasure began (its process killed, its wait for
        # the views run out, refused). Collected again between the grant and the recorded
        # withdrawal (a later consent's captures of the same app and purposes are not
        # this one's) and erased, so that any retry finishes what the withdrawal promised
        # (review of 0203 and 0205, bug RE); nothing collected is left: nothing written.
        if grant is None:
            return None
        stream = str(self.stream_of(subject))
        if not withdrawn_position and grant.withdrawn_at is None:
            # A keyed retry whose first request withdrew after the grant was read above
            # (another process, at the same moment): read the consent again once the
            # views hold that withdrawal, for its position.
            self._require_subject_fresh(subject, "the withdrawal")
            grant = next(c for c in self.queries.consents(stream) if c.consent_id == consent_id)
        collected = self.queries.captures_by(
            stream,
            app_id=grant.app_id,
            purposes=grant.purposes,
            **collected_under(grant, withdrawn_position or grant.withdrawn_position),
        )
        if not collected:
            if request_token is not None and not replaying.get():
                # A retry of a keyed request whose erasure finished and whose answer was
                # never kept (its process died first; a kept answer is replayed as kept):
                # the receipt of that erasure, issued again, never "nothing was
                # collected" (bug JF). None when the request collected nothing.
                return self.erasure_service.resume(
                    subject, "consent-withdrawal", [consent_id], finished_too=True
                )
            return None
        return self.erasure_service.erase_captures(
            subject, collected, scope="consent-withdrawal", target=[consent_id]
        )

    def erase_subject(
        self,
        subject: str,
        *,
        basis: str = "GDPR-Art.17(1)",
        still_allowed: Callable[[], object] | None = None,
    ) -> ErasureResult:
        """Erase a subject entirely: tombstone, key destruction, purge, signed receipt.
        ``still_allowed``: the caller's decision, asked again after the waits and before
        the first write (``uprof.services.erasure._still_allowed``)."""
        with telemetry.span("uprof.erasure", scope="subject"):
            self._settle_reads()  # reads served before the erasure are recorded before it
            return self.erasure_service.erase_subject(
                subject, basis=basis, still_allowed=still_allowed
            )

    def recreate_subject(self, subject: str, *, requested_by: str = "operator:cli") -> str:
        """Lift the erased mark of a subject reference; return the new subject's pseudonym.

        The new subject has a new stream, new keys and a random pseudonym: nothing in
        the audit log or the stores links it to the erased one. Consent must be granted
        again before anything is captured. Refused (InvalidInputError) for a reference
        that is not marked erased.
        """
        ref = check_subject_ref(subject)
        ledger = self.keystore.ledger
        if ledger is None or not ledger.is_erased(self.subjects.tenant, ref):
            raise InvalidInputError("subject: not an erased subject; nothing to re-create")
        ledger.record_recreated(self.subjects.tenant, ref)
        handle = self.subjects.find_or_create(ref, now=self.clock.now(), audit=self.audit)
        # Once per new subject (its pseudonym is its own): two processes re-creating the
        # name at once both pass the check above, and both appended this entry (bug CO,
        # decision 0121-read-then-write-sweep); the key store already lets one create it.
        self.audit.record_many(
            [
                (
                    "subject.recreated",
                    {"subject_ref": handle.pseudonym, "app_id": _token(requested_by)},
                )
            ],
            once_by=("subject_ref",),
        )
        return handle.pseudonym

    def export_subject(
        self,
        subject: str,
        *,
        requested_by: str | None = None,
        still_allowed: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Everything held about a subject, with evidence, as portable JSON (Art. 15/20).

        ``still_allowed`` is asked once everything is read (the profile read waits for the
        subject's views) and before the export is recorded: it raises when the caller's
        key or right went away meanwhile, and nothing is recorded or returned."""
        stream_id = self.stream_of(subject)
        view = self.profile(subject)
        export = build_subject_export(self.queries, stream_id, view, exported_at=self.clock.now())
        if still_allowed is not None:
            still_allowed()
        # The name must still stand for the stream exported: erased meanwhile (and
        # perhaps re-created), the export is refused and nothing recorded, rather than
        # answer the erased subject's data after its receipt and put the export on the
        # new subject's pseudonym, linking the two (bug CV; the door's reads: BY).
        handle = self.subjects.find(subject)
        if handle is None or handle.stream_id != stream_id:
            raise SubjectErasedError("this subject was erased while it was exported")
        self.audit.record(
            "subject.exported",
            app_id=requested_by,
            subject_ref=handle.pseudonym,
            counts={
                "captures": len(export["captured_events"]),
                "items": len(view.attributes) + len(view.memories) + len(view.intents),
            },
        )
        return export

    def export_audit(
        self,
        dest: str | PathLike[str] | TextIO,
        *,
        fmt: str = "jsonl",
        subject_ref: str | None = None,
        app_id: str | None = None,
        action: str | None = None,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
        requested_by: str | None = None,
    ) -> ExportSummary:
        """Export the audit trail (filtered) with inclusion proofs and a signed checkpoint.

        Reads served before the call are in it; the export itself is audited after it.
        ``subject_ref`` is a pseudonym (``audit_subject_ref`` maps a subject to it).
        """
        stream = self.stream_audit(
            fmt=fmt,
            subject_ref=subject_ref,
            app_id=app_id,
            action=action,
            since=since,
            until=until,
            requested_by=requested_by,
        )
        out, owned = (
            (open(dest, "w", encoding="utf-8", newline=""), True)
            if isinstance(dest, str | PathLike)
            else (dest, False)
        )
        try:
            for text in stream:
                out.write(text)
        finally:
            if owned:
                out.close()
        if stream.summary is None:
            raise RuntimeError("export ended without its trailer")
        return stream.summary

    def stream_audit(
        self,
        *,
        fmt: str = "jsonl",
        subject_ref: str | None = None,
        app_id: str | None = None,
        action: str | None = None,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
        requested_by: str | None = None,
    ) -> ExportStream:
        """The export as a stream of records, for a server to send as it is produced.

        Reads served before the call are in it. The export is audited when the stream
        ends, with the number of entries actually sent (fewer, if the reader went away).
        """
        if fmt not in ("jsonl", "csv"):
            raise InvalidInputError("format must be jsonl or csv", field="format")
        self.reads.drain()

        def audited(summary: ExportSummary | None, sent: int) -> None:
            self.audit.record(
                "audit.exported",
                app_id=requested_by,
                counts={"entries": sent, "tree_size": stream.tree_size},
            )

        stream = stream_export(
            self.audit_log,
            fmt=fmt,
            subject_ref=subject_ref,
            app_id=app_id,
            action=action,
            since=since,
            until=until,
            on_close=audited,
            tenant=self.settings.tenant,  # this tenant's entries only (audit.export._rows)
        )
        return stream

    def audit_proof(
        self, old_size: int, *, leaf_index: int | None = None, requested_by: str | None = None
    ) -> dict[str, Any]:
        """A fresh signed checkpoint with the consistency proof from ``old_size`` to it and,
        if asked, the inclusion proof of entry ``leaf_index`` (``audit.proofs``).

        Reads served before the call are in it. The proof is audited before it is handed
        out (``audit.proof_served``, after the checkpoint it carries): a proof whose
        serving cannot be recorded is not served.
        """
        from audit.proofs import build_proof

        self.reads.drain()
        # The entry at ``leaf_index`` only if it is this tenant's, else the answer for an
        # index beyond the log (the consistency proof itself is hashes only).
        scope = None
        if leaf_index is not None:
            scope = self.audit_log.tenant_scope(self.settings.tenant)
        document = build_proof(self.audit_log, old_size, leaf_index=leaf_index, scope=scope)
        counts = {"old_size": document["consistency"]["old_size"]}
        if leaf_index is not None:
            counts["leaf_index"] = leaf_index
        self.audit.record(
            "audit.proof_served",
            app_id=requested_by,
            tree_size=document["tree_size"],
            counts=counts,
        )
        return document

    def audit_entries(self, **filters: Any) -> Iterator[StoredEntry]:
        """This tenant's audit entries matching filters (reads served before the call
        included): tenants sharing the stores share one log (``AuditLog.tenant_scope``)."""
        self.reads.drain()
        return self.audit_log.entries(
            **filters, scope=self.audit_log.tenant_scope(self.settings.tenant)
        )

    def audit_page(
        self,
        reason: str,
        *,
        after_leaf: int,
        bound: int | None,
        size: int,
        requested_by: str | None,
        **filters: Any,
    ) -> tuple[list[StoredEntry], int]:
        """One page of this tenant's entries for a reader (``size + 1`` fetched, as a
        page is cut), and the listing's bound; the read is recorded (``audit.read``).

        ``bound`` is the log's size when the listing's first page was read (None: this is
        the first page, the size now). Every page of a listing stops at it, so the reads
        recorded while paging (appended beyond it) neither show up in nor shift the
        listing's later pages. The entry names the reader (the trail adds ``principal``
        and ``tenant``), the subject filter, and the page's leaf range ``[from_leaf,
        to_leaf)`` with the number of entries shown; recorded before the page is handed
        out, so a page whose read cannot be recorded is not served.
        """
        self.reads.drain()
        log = self.audit_log
        if bound is None:
            bound = log.size()
        rows = list(
            itertools.islice(
                log.entries(
                    **filters,
                    tree_size=bound,
                    after_leaf=after_leaf,
                    page_size=size + 1,
                    scope=log.tenant_scope(self.settings.tenant),
                ),
                size + 1,
            )
        )
        shown = rows[:size]
        to_leaf = shown[-1].leaf_index + 1 if len(rows) > size else bound
        self.audit.record(
            "audit.read",
            app_id=requested_by,
            reason_code=reason,
            subject_ref=filters.get("subject_ref"),
            tree_size=bound,
            counts={"entries": len(shown), "from_leaf": after_leaf + 1, "to_leaf": to_leaf},
        )
        return rows, bound

    def record_subject_read(
        self,
        subject: str,
        *,
        reason: str,
        purpose: str,
        app_id: str,
        counts: dict[str, int],
        item_refs: Sequence[str] = (),
        read_from: UUID | None = None,
    ) -> None:
        """Record that a subject's data is about to be shown (``subject.read``), or raise.

        Called by the door after the read and before its answer leaves, for every read
        that shows a subject's profile data to a person or an operator (the privacy
        center's profile page, an item's evidence, a whole profile, a page of memories):
        the subject as its pseudonym, ``purpose`` the read was decided for, ``reason`` what
        was read, ``counts`` how much was shown and ``item_refs`` the items named; the
        trail adds the principal and the tenant. Never content. Appended now, not through
        the read recorder (slices' batched path, up to ``linger_s`` later), as an audit
        page's read is (decision 0094): a read whose record fails is not served, and the
        failure is ``ReadRecordingError`` (503 ``read_not_recorded``) whatever the store
        raised, so every surface says the same thing.

        ``read_from``: the subject's stream, looked up before the read. When the name no
        longer stands for it, the subject was erased while the read ran (and perhaps its
        name re-created): the read is refused with ``SubjectErasedError`` and nothing is
        recorded, rather than serve the erased subject's data after its erasure and put
        the read on the new subject's pseudonym, linking the two (bug BY).
        """
        handle = self.subjects.find(subject)
        if read_from is not None and (handle is None or handle.stream_id != read_from):
            raise SubjectErasedError("this subject was erased while it was read")
        if handle is None:
            raise SubjectNotFoundError("no such subject")
        try:
            self.audit.record(
                "subject.read",
                subject_ref=handle.pseudonym,
                app_id=app_id,
                purpose=purpose,
                reason_code=reason,
                item_refs=list(item_refs) or None,
                counts=counts,
            )
        except Exception as error:
            _log.warning("a read of subject data could not be recorded", exc_info=error)
            raise ReadRecordingError(
                "the read could not be recorded on the audit log, so nothing is shown; "
                "retry once the audit store answers"
            ) from error

    def has_held_consent(self, subject: str, app_id: str) -> bool:
        """Whether ``app_id`` holds or held a consent of the subject, decided without
        waiting for the views, so that the answer for a subject that exists never waits
        (nor ends in ``read_timeout``) where an unknown one would not.

        Read in turn: the app's consent rows as the views hold them now (withdrawn ones
        too); its consents in force in the subject's stream (one granted since the views
        last caught up); the ``consent.granted`` entries of the audit log for this subject
        (one granted and withdrawn since then: the entry is written with the grant)."""
        handle = self.subjects.find(subject)
        if handle is None:
            raise SubjectNotFoundError("no such subject")
        stream_id = handle.stream_id
        if self.queries.consents_after(str(stream_id), app_id=app_id, after=None, limit=1):
            return True
        profile = self.app.load(stream_id)
        if any(c.app_id == app_id for c in profile.consents.values()):
            return True
        granted = self.audit_log.entries(
            subject_ref=handle.pseudonym, app_id=app_id, action="consent.granted", page_size=1
        )
        return next(iter(granted), None) is not None

    def consents_after(
        self,
        subject: str,
        *,
        app_id: str | None,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[Any]:
        """A page of the subject's consents (one app's, if named), keyset after ``after``."""
        self._require_subject_fresh(subject, "the consents")
        stream = str(self.stream_of(subject))
        return self.queries.consents_after(stream, app_id=app_id, after=after, limit=limit)

    def memories_after(
        self, subject: str, *, after: tuple[datetime, str] | None, limit: int
    ) -> list[Any]:
        """A page of the subject's memories (archived included), oldest first."""
        self._require_subject_fresh(subject, "the memories")
        return self.queries.memories_after(str(self.stream_of(subject)), after=after, limit=limit)

    def subjects_after(
        self, *, after: tuple[datetime, str] | None, limit: int
    ) -> list[tuple[str, datetime]]:
        """A page of the live subjects' (pseudonym, created_at): never their references.
        An index row whose stream was never written (a grant refused at its save) is no
        subject and is left out (bug UT); the page is filled from the rows after it."""
        page: list[tuple[str, datetime]] = []
        while len(page) < limit:
            wanted = limit - len(page)
            rows = self.keystore.subjects_after(self.subjects.tenant, after=after, limit=wanted)
            page += [(p, at) for p, at, stream in rows if self.subjects.written(stream)]
            if len(rows) < wanted:
                break
            after = (rows[-1][1], rows[-1][0])
        return page

    def cursor_codec(self) -> CursorCodec:
        if self.cursors is None:
            raise InvalidInputError("paged lists are not configured in this kernel")
        return self.cursors

    def verify_audit(self, content: bytes, kind: Kind) -> CheckResult:
        """Check an uploaded export or receipt against this log's keys (the current one and
        those of its endorsed history) and origin, as this tenant's: another tenant's
        receipt or tenant-filtered export is refused (bug JQ)."""
        from audit._codec import b64encode
        from audit.check import check_upload

        log = self.audit_log

        def rotation_proof(old_size: int, new_size: int) -> list[str]:
            # This service holds the log: it proves a retired key's receipt or export
            # itself (KG, LK).
            return [b64encode(h) for h in log.consistency_proof(old_size, new_size)]

        return check_upload(
            content,
            kind,
            log.trusted_keys(),
            log.origin,
            tenant=self.subjects.tenant,
            rotation_proof=rotation_proof,
        )

    def receipt_rotation_proof(self, content: bytes, *, requested_by: str | None) -> dict[str, Any]:
        """The rotation proof of an erasure receipt of this tenant's (decision
        0165-review-of-0160): the log's consistency proof from the receipt's checkpoint
        (size m) to the point (N, R) where the history says its issuer key was rotated out,
        which ``verify_receipt(..., rotation_proof=)`` and ``uprof audit verify-receipt
        --rotation-proof`` need offline when m < N (bug KG). ``rotation_proof`` is None
        when the receipt needs none (its key is current, unbounded, or stopped at m).

        The receipt is verified first, with this log's keys and as this tenant's (the one
        check of ``verify_receipt``): a forged or another tenant's receipt gets no proof.
        Hashes only, no entry; audited before it is handed out (``audit.proof_served``)."""
        from audit.receipts import parse_receipt, verify_receipt

        def check(rotation_proof: Callable[[int, int], list[str]]) -> tuple[int, str, str]:
            receipt = parse_receipt(content)
            verify_receipt(
                receipt,
                self.audit_log.trusted_keys(),
                origin=self.audit_log.origin,
                tenant=self.subjects.tenant,
                rotation_proof=rotation_proof,
            )
            body = receipt["body"]
            return (
                int(receipt["inclusion"]["tree_size"]),
                body["issuer"]["key_id"],
                body["receipt_id"],
            )

        return self._serve_rotation_proof("receipt", check, requested_by)

    def checkpoint_rotation_proof(
        self, content: bytes | str, *, requested_by: str | None
    ) -> dict[str, Any]:
        """The rotation proof of a checkpoint this log's key signed before it was rotated
        out (decision 0175-retired-below): an export's (its header's note), a proof
        document's, or a note. The same proof as a receipt's, from the note's size m to
        the key's point N, which ``verify_export``/``verify_proof(..., rotation_proof=)``
        and ``uprof audit verify --rotation-proof`` need offline when m < N (bugs LK, LL).

        ``content`` is the note, or the file that carries it (``carried_checkpoint``).
        The note is verified first, with this log's keys, and the proof with it: a note of
        another log, or of a fork of this one, gets none (the proof would not lead from
        its root to R). A checkpoint is the whole log's (its tree size counts every
        tenant's entries, as ``GET /v1/audit/key`` says): hashes only, no entry."""
        from audit.check import carried_checkpoint
        from audit.checkpoint import verify_checkpoint
        from audit.errors import VerificationError
        from audit.keys import key_id

        origin = self.audit_log.origin

        def signed(note: str, key: Any) -> bool:
            try:
                verify_checkpoint(note, [key], origin)  # one key, its signature only
            except VerificationError:
                return False
            return True

        def check(rotation_proof: Callable[[int, int], list[str]]) -> tuple[int, str, None]:
            note = carried_checkpoint(content)
            keys = self.audit_log.trusted_keys()
            size, _ = verify_checkpoint(note, keys, origin, rotation_proof=rotation_proof)
            # The key the proof is about: the one whose point it reaches, else a signer.
            signers = [key for key in keys if signed(note, key)]
            needed = keys.point_below(signers, size)
            return size, needed[0] if needed is not None else key_id(signers[0]), None

        return self._serve_rotation_proof("checkpoint", check, requested_by)

    def _serve_rotation_proof(
        self,
        what: str,
        check: Callable[[Callable[[int, int], list[str]]], tuple[int, str, str | None]],
        requested_by: str | None,
    ) -> dict[str, Any]:
        """Run ``check`` (the one verification of what was handed in) with a
        ``rotation_proof`` callable that computes and keeps the log's proof it asks for,
        audit the serving (``audit.proof_served``), and answer the proof."""
        from audit._codec import b64encode
        from audit.errors import VerificationError

        self.reads.drain()
        log = self.audit_log
        proven: list[tuple[int, int, list[str]]] = []

        def rotation_proof(old_size: int, new_size: int) -> list[str]:
            hashes = [b64encode(h) for h in log.consistency_proof(old_size, new_size)]
            proven.append((old_size, new_size, hashes))
            return hashes

        try:
            tree_size, signer, receipt_id = check(rotation_proof)
        except VerificationError as exc:
            raise InvalidInputError(f"{what}: {exc.reason}", field=what) from None
        rotated_at = proven[0][1] if proven else None
        counts = {"old_size": tree_size}
        if rotated_at is not None:
            counts["rotation_point"] = rotated_at
        self.audit.record(
            "audit.proof_served",
            app_id=requested_by,
            tree_size=tree_size if rotated_at is None else rotated_at,
            counts=counts,
        )
        return {
            "receipt_id": receipt_id,
            "issuer_key_id": signer,
            "tree_size": tree_size,
            "rotation_point": rotated_at,
            "rotation_proof": proven[0][2] if proven else None,
        }

    def audit_key(self, *, with_checkpoint: bool = True) -> dict[str, Any]:
        """The log's origin, key id, public key (PEM), key history and, unless told not to,
        a fresh signed checkpoint (its tree size counts every tenant's entries: see
        ``Facade.audit_key``)."""
        from audit.keys import key_id, public_key_pem

        log = self.audit_log
        # One key for the id, the PEM and the checkpoint, taken before the history (a
        # rotation writes its history before its key): the response verifies with itself
        # whatever another process rotates meanwhile.
        signing = log.signing_key()
        key: dict[str, Any] = {
            "origin": log.origin,
            "key_id": key_id(signing),
            "public_key_pem": public_key_pem(signing.public_key()).decode(),
            "key_history": self.audit_key_history(),
        }
        if with_checkpoint:
            key["checkpoint"] = log.checkpoint_record(key=signing).note
        return key

    def stores_shared(self) -> bool:
        """Whether another tenant wrote to these stores (an entry of the log names it)."""
        return self.audit_log.tenant_scope(self.settings.tenant).shared

    def subject_exists(self, subject: str) -> bool:
        return self.subjects.find(subject) is not None

    def subject_pseudonym(self, subject: str) -> str | None:
        """The pseudonym of the subject the name stands for now; None when it names none
        (unknown, or erased: a re-created name gets a new pseudonym)."""
        try:
            found = self.subjects.find(subject)
        except SubjectErasedError:
            return None
        return None if found is None else found.pseudonym

    def evidence_captures(self, subject: str, capture_ids: set[str]) -> dict[str, Any]:
        """The captured events among ``capture_ids`` that belong to the subject."""
        # The views key captures by the stream's text form; stream_of gives a UUID.
        stream = str(self.stream_of(subject))
        return {
            c: row
            for c, row in self.queries.captures(capture_ids).items()
            if row.stream_id == stream
        }

    def consent_erasures_unfinished(
        self, subject: str, consents: Sequence[ConsentRow] | None = None
    ) -> frozenset[str]:
        """The subject's consents withdrawn with ``erase`` whose erasure is not finished:
        the views still hold captures collected under the consent (its request stopped
        after the withdrawal was written: its process killed, its wait for the views run
        out), or it answered ``erasure_incomplete``. Asking for the withdrawal with
        ``erase`` again finishes each (``withdraw_consent``, bug RE). ``consents``: the
        subject's, as a profile just read them (default: read from the views); the caller
        has waited for the views. Nothing more is read for a subject with no consent
        withdrawn with ``erase``."""
        asked = [
            c
            for c in (
                self.queries.consents(str(self.stream_of(subject)))
                if consents is None
                else consents
            )
            if c.withdrawn_at is not None and c.erase_requested
        ]
        if not asked:
            return frozenset()
        stream = str(self.stream_of(subject))
        return frozenset(
            grant.consent_id
            for grant in asked
            if self.queries.captures_by(
                stream,
                app_id=grant.app_id,
                purposes=grant.purposes,
                **collected_under(grant, grant.withdrawn_position),
            )
            or self.erasure_service.unfinished(subject, "consent-withdrawal", [grant.consent_id])
        )

    def item_reads(self, subject: str) -> list[Any]:
        """(item, app, purpose, count, last read) for every recorded read of the subject."""
        self._require_all_fresh("the read records")
        return list(self.queries.item_reads(str(self.stream_of(subject))))

    def audit_subject_ref(self, subject: str) -> str:
        """The pseudonym audit entries use for a subject (a pseudonym maps to itself).

        Only text of a pseudonym's exact shape stands for itself: an audit page records its
        subject filter (``audit.read``), so anything else is a subject's reference and
        becomes its pseudonym (a fresh one for no subject), never text on the log."""
        if is_pseudonym(subject):
            return subject
        return self.subjects.pseudonym(subject)

    def residue_scan(self, terms: Sequence[str]) -> ResidueReport:
        """Scan every store for the terms and for decryptable data of erased subjects.

        Never over views halfway through a replay (bug WZ): under the views' schema lock,
        which a ``projections rebuild`` holds from before its reset to the end of its
        replay (a rebuild in another process waits for the scan, or the scan for it, up
        to ``schema_lock_wait_s``). Halfway the views hold few rows of anyone, and the
        rows-left check of the erased streams said clean about views it had not seen
        whole. Views as they stand otherwise, behind the log or not: an erasure under way
        is reported as it is (its rows, labelled), and a catch-up would write no row of
        an erased stream (its events do not open)."""
        from uprof.storage import schema_lock

        self._settle_reads()
        with schema_lock(
            self.views_engine, wait_s=self.settings.schema_lock_wait_s, purpose="residue scan"
        ):
            return self._residue_scan(terms)

    def _residue_scan(self, terms: Sequence[str]) -> ResidueReport:
        report = ResidueReport()
        ledger = self.keystore.ledger
        start = erasures_at(ledger) if ledger is not None else None
        scan_files(self.settings.data_dir, terms, report)
        scan_database(self.views_engine, terms, report)
        # The ledger's erased streams too: an erasure killed between its ledger record and
        # its keys' destruction left a stream the key store does not list as shredded,
        # its keys in place (bug PT); a start destroys them, a running server had not.
        streams = set(self.keystore.shredded_stream_ids())
        if ledger is not None:
            streams |= ledger.state().streams
        check_shredded_streams(
            self.app, self.keys_engine, self.views_engine, sorted(streams), report
        )
        if ledger is not None and start is not None:
            label_erasures(ledger, start, report)
        return report

    def erase_capture(
        self, subject: str, capture_id: str, *, still_allowed: Callable[[], object] | None = None
    ) -> ErasureResult:
        """Erase one captured event and everything derived only from it (``still_allowed``:
        as ``erase_subject``'s)."""
        with telemetry.span("uprof.erasure", scope="capture"):
            self._settle_reads()
            return self.erasure_service.erase_capture(
                subject, capture_id, still_allowed=still_allowed
            )

    def erase_item(
        self,
        subject: str,
        item_id: str,
        *,
        with_evidence: bool = False,
        still_allowed: Callable[[], object] | None = None,
    ) -> ErasureResult:
        """Erase one item (and, if asked, the captured events behind it; ``still_allowed``:
        as ``erase_subject``'s)."""
        with telemetry.span("uprof.erasure", scope="item"):
            self._settle_reads()
            return self.erasure_service.erase_item(
                subject, item_id, with_evidence=with_evidence, still_allowed=still_allowed
            )

    def submit_proposals(
        self,
        subject: str,
        batch: ProposalBatch,
        *,
        observed_at: datetime | None = None,
        request_token: str | None = None,
        still_allowed: Callable[[], object] | None = None,
    ) -> int:
        # Agents cite events they just captured: let the captures view catch up first
        # (refusing evidence the view has not reached yet would be a false refusal).
        self._require_subject_fresh(subject, "the subject's captures")
        if still_allowed is not None:
            still_allowed()  # the caller's decision, asked again after the wait
        return self.proposal_service.submit(
            subject,
            batch,
            observed_at=observed_at,
            request_token=request_token,
            token_window_s=self._token_window_s,
        )

    # ------------------------------------------------------------------ reads

    def stream_of(self, subject: str) -> UUID:
        handle = self.subjects.find(subject)
        if handle is None:
            raise SubjectNotFoundError("no such subject")
        return handle.stream_id

    def profile(
        self, subject: str, *, as_of: datetime | None = None, with_memories: bool = True
    ) -> ProfileView:
        stream_id = self.stream_of(subject)
        if as_of is not None:
            # Items a killed item erasure's ledger record names go first, as for every
            # other read of the subject (bug IP; the history read skipped it: JU).
            self.erasure_service.erase_recorded_items(stream_id)
            return self.profile_service.as_of(stream_id, as_of)
        self._require_subject_fresh(subject, "the profile")
        return self.profile_service.current(stream_id, with_memories=with_memories)

    def evidence(self, subject: str, item_id: str) -> EvidenceView:
        self._require_subject_fresh(subject, "the evidence")
        return self.profile_service.evidence(self.stream_of(subject), item_id)

    def slice(
        self,
        subject: str | SubjectRequest,
        query: str,
        *,
        budget_tokens: int,
        purpose: str,
        app_id: str,
        agent_id: str,
        agent_type: str = "",
        now: datetime | None = None,
        lexical_only: bool = False,
        wait_timeout_s: float | None = None,
        principal: str = "",
        still_authenticated: Callable[[], None] | None = None,
    ) -> ProfileSlice:
        """Serve the profile slice an app may see for a query, within budget_tokens.

        ``still_authenticated`` is asked after the read-your-writes wait (it raises when
        the caller's credential was revoked meanwhile): ``SliceRequest``.
        """
        self.forget_erased_elsewhere()
        request = (
            subject if isinstance(subject, SubjectRequest) else SubjectRequest(subject=subject)
        )
        return self.slice_service.slice(
            SliceRequest(
                subject=request,
                query=query,
                budget_tokens=budget_tokens,
                purpose=purpose,
                app_id=app_id,
                agent_id=agent_id,
                agent_type=agent_type,
                now=now,
                lexical_only=lexical_only,
                wait_timeout_s=wait_timeout_s,
                principal=principal,
                still_authenticated=still_authenticated,
            )
        )

    def register_session(self, session_id: str, subject: str, *, app_id: str | None = None) -> None:
        """Bind a session id to a subject; audited (``alias.bound``) without the id."""
        self.subjects.register_session(session_id, subject, now=self.clock.now())
        self._alias_bound(subject, "session", app_id)

    def register_identifier(
        self, identifier: str, subject: str, *, app_id: str | None = None
    ) -> None:
        """Bind an identifier to a subject; audited (``alias.bound``) without it."""
        self.subjects.register_identifier(identifier, subject, now=self.clock.now())
        self._alias_bound(subject, "identifier", app_id)

    def _alias_bound(self, subject: str, kind: str, app_id: str | None) -> None:
        self.audit.record(
            "alias.bound",
            subject_ref=self.subjects.pseudonym(subject),
            app_id=app_id,
            reason_code=kind,
        )

    # ------------------------------------------------------------------ policy
    # Operator operations: the caller (facade, REST, CLI) checks the operator role and
    # passes the asking principal's label, which every change event and audit entry names.

    @property
    def policy(self) -> PolicyService:
        if self.policy_service is None:
            raise InvalidInputError("this deployment has no policy store")
        return self.policy_service

    def policy_show(self, at: datetime | None = None) -> PolicyState:
        """The policy in force now, or at a past time ``at`` (replayed from its events)."""
        return self.policy.show(at)

    def policy_history(self) -> list[PolicyChange]:
        """Every recorded change of the tenant's policy, oldest first."""
        return self.policy.history()

    def policy_grant(
        self,
        *,
        requested_by: str,
        app_id: str | None = None,
        role: str | None = None,
        actions: Sequence[str] = (),
        categories: Sequence[str] = (),
        purpose: str | None = None,
        effect: str = "allow",
        still_allowed: Callable[[], object] | None = None,
    ) -> PolicyChangeResult:
        """Assign a role (app_id + role) or add rules (actions x categories for purpose).
        ``still_allowed``: the caller's decision, asked again once the change has its turn
        (``PolicyService._apply``)."""
        return self.policy.grant(
            requested_by=requested_by,
            app_id=app_id,
            role=role,
            actions=actions,
            categories=categories,
            purpose=purpose,
            effect=effect,
            still_allowed=still_allowed,
        )

    def policy_revoke(
        self,
        *,
        requested_by: str,
        app_id: str | None = None,
        role: str | None = None,
        actions: Sequence[str] = (),
        categories: Sequence[str] = (),
        purpose: str | None = None,
        effect: str = "allow",
        still_allowed: Callable[[], object] | None = None,
    ) -> PolicyChangeResult:
        """Take back a role or remove rules; every named row must be in force.
        ``still_allowed``: the caller's decision, asked again once the change has its turn
        (``PolicyService._apply``)."""
        return self.policy.revoke(
            requested_by=requested_by,
            app_id=app_id,
            role=role,
            actions=actions,
            categories=categories,
            purpose=purpose,
            effect=effect,
            still_allowed=still_allowed,
        )

    def onboard_app(
        self,
        app_id: str,
        *,
        read: Sequence[str],
        purpose: str,
        capture: Sequence[str] | None = None,
        propose: Sequence[str] | None = None,
        requested_by: str,
        still_allowed: Callable[[], object] | None = None,
    ) -> PolicyChangeResult:
        """Grant a new app read, capture and propose on these categories for one purpose
        (``still_allowed``: as ``policy_grant``'s)."""
        return self.policy.onboard(
            app_id,
            read=read,
            purpose=purpose,
            capture=capture,
            propose=propose,
            requested_by=requested_by,
            still_allowed=still_allowed,
        )

    def policy_health(self) -> str:
        """Why every policy check denies (the store is unreadable), or '' when all is well."""
        return self.policy_service.health() if self.policy_service is not None else ""

    def policy_refusal(self) -> UprofError | None:
        """What a request refused for the policy store's state raises (its damage, or
        ``PolicyStoreError`` when unreadable), looked at now; None when all is well."""
        return self.policy_service.refusal() if self.policy_service is not None else None

    # --------------------------------------------------------------- pipeline

    def ensure_fresh(self, timeout_s: float) -> bool:
        """Bring derived stores up to the log head, within timeout_s (reads recorded too).

        For views that show everything, reads included (the privacy center's "who
        read it", exports). Embedded (no background workers) the caller's thread does
        the work; with workers running it waits for them, bounded, and says if it gave up.
        """
        self._settle_reads()
        if self.settings.background_workers:
            return self.wait_until_caught_up(timeout_s)
        self.process()
        return True

    def _require_subject_fresh(self, subject: str, what: str) -> None:
        """Read-your-writes for a whole-view read of one subject, or ReadTimeoutError.

        A slice says ``fresh: false`` and is still useful; a profile, its evidence or a
        proposal check that silently missed the newest writes would state something false
        (an attribute missing, evidence "not found"), so those fail with 503 read_timeout.
        Served reads are written first, so the subject's heat and read history count them:
        embedded, they are projected here too; with workers, within a worker cycle (the
        wait is for the subject's content, which reads do not hold up).
        """
        stream_id = self.stream_of(subject)
        self._settle_reads()
        if not self.settings.background_workers:
            # An item erasure killed after its ledger record: its items go first (bug IP;
            # with workers, ``ensure_subject_fresh`` does it).
            self.erasure_service.erase_recorded_items(stream_id)
            self.process()
            return
        timeout = self.settings.read_wait_timeout_s
        if not self.ensure_subject_fresh(stream_id, timeout).fresh:
            raise ReadTimeoutError(
                f"{what} did not catch up with the subject's newest write within "
                f"{timeout:g} s (read_wait_timeout_s)"
            )

    def _require_all_fresh(self, what: str) -> None:
        """As ``_require_subject_fresh`` for views that depend on the whole log."""
        timeout = self.settings.read_wait_timeout_s
        if not self.ensure_fresh(timeout):
            raise ReadTimeoutError(
                f"{what} did not catch up with the log within {timeout:g} s (read_wait_timeout_s)"
            )

    def _settle_reads(self) -> None:
        """Write the reads served so far before work that should follow them.

        Best effort: if the recorder has given up, slices are refused (and readiness
        says so), but projecting captures, erasing and scanning must go on; losing the
        records of already-served reads is the failure being reported, not a reason to
        stop the rest. Audit exports drain strictly instead (``export_audit``).
        """
        try:
            self.reads.drain()
        except ReadRecordingError as problem:
            _log.warning("reads not recorded before this step: %s", problem)

    def ensure_subject_fresh(
        self, stream_id: UUID, timeout_s: float, *, known_head: int | None = None
    ) -> Freshness:
        """Read-your-writes for one subject (I7): wait until extraction and projections
        have passed that subject's newest write, bounded by timeout_s.

        Writes of other subjects and recorded reads do not hold a read up: when the
        subject is caught up this costs one or two indexed lookups and no processing.
        ``known_head``: the head at which the caller already holds the subject's views
        (read when projections had passed it); if that is still the newest write, the
        projections need not be asked again.
        """
        deadline = time.monotonic() + timeout_s
        if self.erasure_service.erase_recorded_items(stream_id):  # bug IP
            known_head = None
        while True:
            fresh, head = self._subject_caught_up(stream_id, known_head)
            if fresh or time.monotonic() >= deadline:
                return Freshness(fresh=fresh, head=head)
            if self.settings.background_workers:
                self.wake_workers()
                time.sleep(0.005)
            else:
                self.process()

    def _subject_caught_up(self, stream_id: UUID, known_head: int | None) -> tuple[bool, int]:
        # The extraction position and the heads come from one snapshot: if the worker
        # had passed the subject's newest capture, its results are in the log and the
        # content head covers them.
        # With partitions, both positions are those of the subject's partition.
        heads = self.app.subject_heads(
            stream_id, worker=self.extraction.tracking_name_for(stream_id)
        )
        if heads.captured > heads.extracted:
            return False, heads.content
        if known_head is not None and known_head == heads.content:
            return True, heads.content
        return self.projections.position_for(stream_id) >= heads.content, heads.content

    def process(self, progress: Progress | None = None) -> int:
        """Run extraction and projections, a batch of each in turn, until both have
        caught up with the log.

        In turn, not each until idle: under a steady stream of captures extraction is
        never idle, and projections, which erasures, freshness waits and reads wait on,
        would never get a turn (the server's worker runs this: three copies of the
        erasure-under-load test at once held the projection at one position for the
        whole 120 s of four erasure attempts while extraction kept pace with captures).
        One caller at a time in this process (the runners keep one position each);
        other processes are kept out by the position guard inside each batch.
        Reads still with the recorder are projected by a later run: a server's worker
        runs this every few tens of milliseconds, and making the recorder write at each
        run would undo its batching. Views that show reads drain it (``ensure_fresh``).
        """
        self.forget_erased_elsewhere()
        with self._process_lock:
            total = 0
            target = self.app.max_notification_id() if progress is not None else 0
            while True:
                try:
                    extracted = self.extraction.run_once()
                except ConcurrencyConflictError:
                    # Captures kept winning; project a batch, extract on the next run.
                    self.projections.run_once()
                    raise
                # A rebuild in another process may reset the views between a batch's read
                # and its apply: the batch is refused, nothing written (0103), and read
                # again from the new position, as a worker does. Passed up, it failed an
                # embedded erasure or read beside the rebuild (review of 0108/0109).
                projected = retry.WORKER_COLLISION.call(self.projections.run_once)
                if projected and progress is not None:
                    position = self.projections.position
                    progress(position, max(target, position))
                total += projected
                if extracted == 0 and projected == 0:
                    return total

    def process_to_log_end(self) -> int:
        """``uprof projections run``: extract and project up to the log's end as it is
        when this starts, and leave what is appended meanwhile to the running workers
        (the server's, ``uprof worker``), as a rebuild does (decision
        0108-rebuild-beside-live-traffic). Captures up to there are extracted unless
        another process's worker or captures keep winning the race for them (then that
        worker extracts them: an ``INFO`` line); the views are then projected up to the
        log's end after that extraction (its own events included). ``process`` runs
        until both are idle, which beside a live server never happens: it failed (exit
        6) on the lost races (decision 0112-late-check-durable)."""
        self.forget_erased_elsewhere()
        with self._process_lock:
            try:
                self.extraction.run_until(self.app.max_notification_id())
            except ConcurrencyConflictError:
                _log.info(
                    "projections run: extraction lost the race to another process; "
                    "its captures are left to the running workers"
                )
            return self.project_to(self.app.max_notification_id())

    def project_to(self, target: int) -> int:
        """Project this process's partitions until each has passed ``target``; what is
        appended meanwhile is left to the runners. The one catch-up to a target:
        ``uprof projections run`` and a start that must see the views at the log's head
        before it re-applies the erasure ledger (``recovery._project_to_head``).

        As ``process``: a rebuild in another process that reset the views between a
        batch's read and its apply refuses it (nothing written); it is read again from
        the new position. Passed up, it failed ``projections run`` (review of 0112) and
        every start beside a rebuild whose ledger names erased items, ``uprof backup``
        included (bug KB, exit 6)."""
        with self._process_lock:
            return retry.WORKER_COLLISION.call(lambda: self.projections.run_until(target))

    def process_once(self) -> int:
        """One batch of extraction, then one of projection, per partition this process
        runs; returns how many notifications they consumed (0: caught up).

        For a worker loop that must be able to stop between batches (``uprof worker``
        finishes the batch in hand on SIGTERM). Other processes running the same
        partitions are kept out by the guarded positions; a batch that lost to one is
        re-read, never applied twice.
        """
        self.forget_erased_elsewhere()
        with self._process_lock:
            try:
                extracted = self.extraction.run_once()
            except ConcurrencyConflictError:
                # Captures kept winning; project what is there, extract on the next run.
                self.projections.run_once()
                raise
            # As ``process``: a rebuild in another process that reset the views between
            # the batch's read and its apply refuses it (nothing written); read it again
            # from the new position. Passed up, ``uprof worker`` logged it as a failed
            # batch (ERROR, a traceback, a failure in its count) and waited its back-off
            # (decision 0118-idempotency-reclaim-and-worker-collisions).
            return extracted + retry.WORKER_COLLISION.call(self.projections.run_once)

    def catch_up(self, notification_id: int, timeout_s: float) -> bool:
        """Make sure projections have passed ``notification_id`` (bounded when in background)."""
        if self.settings.background_workers:
            return self.projections.wait_for(notification_id, timeout_s)
        self.process()
        return self.projections.position >= notification_id

    def audit_key_history(self) -> dict[str, Any] | None:
        """The audit key history document (public: every key, each endorsed by the one
        before), or None where the key source keeps no history."""
        history = getattr(self.audit_log.keys, "history", None)
        return None if history is None else dict(history().document)

    def settle_erasures_of_host(self, host: str, *, requested_by: str) -> HostSettled:
        """Settle the erasure requests a host gone for good left open
        (``ErasureService.settle_host``)."""
        return self.erasure_service.settle_host(host, requested_by=requested_by)

    def rotate_audit_key(self, *, requested_by: str, restart: bool = False) -> dict[str, Any]:
        """Make a new audit signing key current, endorsed by the current one, and record it
        (``audit.key_rotated``: old and new key ids, the new key's position in the history,
        who asked, when the history changed). A checkpoint signed by the new key follows.

        A rotation the log does not show yet (a process killed between the key switch and
        its entry) is recorded first (``reason_code`` recorded-late), once across processes.

        ``restart``: the log was put back from a backup shorter than the history's highest
        rotation point (``uprof restore --restart-audit-log``): the rotation also records
        that point as abandoned (``FileKeyRing.rotate``), and its entry says so
        (``reason_code`` log-restarted, ``tree_size`` where the log restarts)."""
        from audit.keyring import Rotation

        rotate = getattr(self.audit_log.keys, "rotate", None)
        if rotate is None:
            raise InvalidInputError("this deployment's audit key source cannot be rotated")
        if not restart:
            # A restart is recorded at the head of the backup's log, before any entry: the
            # rotations it lacks are recorded late by the next start, after it.
            self.record_audit_key_rotations()

        def record(done: Rotation, history: Mapping[str, Any]) -> None:
            # Under the key ring's lock: no other process records this rotation late.
            entries = _rotation_entries(history["keys"], seq=done.seq, requested_by=requested_by)
            if restart:
                point = history["keys"][done.seq]["previous_key_retired_at"]
                for _, fields in entries:
                    fields.update(reason_code="log-restarted", tree_size=point["tree_size"])
            self.audit.record_many(entries, once_by=("audit_key_id",))

        # The log's head under its append lock is where the old key stops signing.
        done: Rotation = rotate(
            record, log_head=self.audit_log.held_head, **({"restart": True} if restart else {})
        )
        self.audit_log.checkpoint()
        return {
            "seq": done.seq,
            "previous_key_id": done.previous_key_id,
            "key_id": done.key_id,
            "rotated_at": done.created_at,
        }

    def record_audit_key_rotations(self) -> int:
        """Check the key folder against the log's rotations, then append
        ``audit.key_rotated`` (``reason_code`` recorded-late) for every rotation of the
        key history the log does not hold yet; return how many rotations the history holds.

        A rotation on the log whose key the history lacks means the key folder is not the
        one that rotated (a history lost and made again from the current key, a key folder
        put back from a copy older than the rotation, another machine's copy of the
        folder): that raises ``AuditKeyError`` naming the history file, rather than sign
        with a retired key or a history verifiers do not know. The late entries are decided
        under the key ring's lock (``settled``), so a rotation still recording its own
        entry is never taken for a killed one. One indexed read of the log (its
        ``audit.key_rotated`` entries, read before the history: a rotation writes its
        history before its entry)."""
        from audit.errors import AuditKeyError

        keys = self.audit_log.keys
        if getattr(keys, "history", None) is None:
            return 0
        on_log = [e.entry for e in self.audit_log.entries(action="audit.key_rotated")]
        history = self.audit_key_history() or {"keys": []}
        ids = [record["key_id"] for record in history["keys"]]
        for entry in on_log:
            seq = entry.get("audit_key_seq")
            if not (
                isinstance(seq, int)
                and 0 < seq < len(ids)
                and ids[seq] == entry.get("audit_key_id")
                and ids[seq - 1] == entry.get("previous_audit_key_id")
            ):
                path = getattr(keys, "history_path", "the audit key history")
                raise AuditKeyError(
                    f"the audit log records a rotation to audit key "
                    f"{str(entry.get('audit_key_id'))[:16]}… (seq {entry.get('audit_key_seq')}) "
                    f"that {path} does not hold: this key folder is not the one that rotated "
                    "(a history lost and made again, a copy older than the rotation, or "
                    "another machine's copy); put back the key folder's newest "
                    "audit-keys.json and audit-signing.pem"
                )
        if len(ids) < 2 or {e.get("audit_key_id") for e in on_log} >= set(ids[1:]):
            return max(len(ids) - 1, 0)
        settled = getattr(keys, "settled", None)
        if settled is None:
            self.audit.record_many(_rotation_entries(history["keys"]), once_by=("audit_key_id",))
            return len(ids) - 1
        with settled() as document:
            self.audit.record_many(_rotation_entries(document["keys"]), once_by=("audit_key_id",))
            return len(document["keys"]) - 1

    def rotate_keys(self) -> dict[str, int]:
        """Re-wrap every data key under a new KEK epoch and forget the old KEK (audited)."""
        result: dict[str, int] = self.keystore.rotate_kek()
        self.audit.record("kek.rotated", counts=dict(result))
        return result

    # ------------------------------------------------------------ administration

    def issue_api_key(self, app_id: str, roles: Sequence[str]) -> IssuedKey:
        """Issue an API key for an app, audited (``apikey.issued``: its id and roles,
        never its secret). A key whose entry cannot be written is revoked at once, so no
        key works that the log does not show."""
        from uprof.apikeys.store import ApiKeyStore

        store = ApiKeyStore(self.keys_engine, tenant=self.subjects.tenant, now=self.clock.now)
        issued = store.create(app_id, roles)
        try:
            self.audit.record(
                "apikey.issued",
                app_id=app_id,
                api_key_id=issued.info.key_id,
                roles=list(issued.info.roles),
            )
        except BaseException:
            store.revoke(issued.info.key_id)
            raise
        return issued

    def list_api_keys(self, app_id: str | None = None) -> list[ApiKeyInfo]:
        """The API keys' metadata (ids, apps, roles, dates; never a secret), audited
        (``apikey.listed``: the app filter and how many keys were shown): a read of the
        key store is a read like any other."""
        from uprof.apikeys.store import ApiKeyStore

        rows = ApiKeyStore(self.keys_engine, tenant=self.subjects.tenant, now=self.clock.now).list(
            app_id
        )
        self.audit.record("apikey.listed", app_id=app_id, counts={"keys": len(rows)})
        return rows

    def key_material_moved(self, moved: Sequence[str]) -> None:
        """Record ``uprof keys move-out`` (``keys.moved_out``: how many key files moved,
        never their contents), once the moved keys have opened this kernel."""
        self.audit.record("keys.moved_out", counts={"files": len(moved)})

    def revoke_api_key(self, key_id: str) -> bool:
        """Revoke an API key, audited (``apikey.revoked``); False when no live key has
        that id and the log holds its revocation (nothing changes, nothing is recorded).
        The revocation stands even if its entry then fails to be written (the error is
        raised); asking again records it then (``reason_code`` recorded-late): a process
        killed between the key store's commit and the append left a revoked key the log
        said was live, and no later call could record it. Once across processes.
        False, and nothing recorded, also when the key was live as this call began and
        another process revoked it first: that process records it, as it happened."""
        from uprof.apikeys.store import ApiKeyStore
        from uprof.backends import backend_for

        store = ApiKeyStore(self.keys_engine, tenant=self.subjects.tenant, now=self.clock.now)
        # From the read to the entry under one lock of the deployment's, which a dead
        # holder drops: "revoked, and no entry" then means a crash, never a revocation
        # whose entry is on its way. Without it a call arriving between another
        # process's commit and its append (which waits for the log's write lock) wrote
        # the entry as recorded-late and the on-time one was left out (bug DL, decision
        # 0127-review-of-0121). Revocations are rare operator acts: one at a time is cheap.
        # A holder that hangs alive must not keep a leaked key usable: past the wait the
        # revocation goes on without the lock (its own UPDATE and entry are right; only a
        # key found revoked may then be recorded late while its revoker still appends).
        # The previous release's lock of the same name too (shared): a process of it may
        # still revoke during an upgrade, and 0159 moved the SQLite lock file (bug KJ).
        backend = backend_for(self.keys_engine)
        lock = backend.named_lock(
            self.keys_engine,
            "apikey-revocation",
            wait_s=self.REVOCATION_LOCK_WAIT_S,
            previous_release_shared="apikey-revocation",
        )
        with lock as held:
            if not held:
                _log.warning(
                    "another API-key revocation has held the revocation lock for %.0f s; "
                    "revoking without it",
                    self.REVOCATION_LOCK_WAIT_S,
                )
            return self._revoke_api_key(store, key_id)

    def _revoke_api_key(self, store: ApiKeyStore, key_id: str) -> bool:
        app_id = store.live_app_of(key_id)
        fields: dict[str, object] = {"app_id": app_id, "api_key_id": key_id}
        if app_id is not None and not store.revoke(key_id):
            # Live when read, revoked by another process before our UPDATE: its entry
            # is on its way. Recording it here as "recorded-late" told the log that a
            # crash had lost an on-time revocation, and the revoking process's own entry
            # was then left out (bug CN, decision 0121-read-then-write-sweep).
            return False
        if app_id is None:
            app_id = store.revoked_app_of(key_id)
            if app_id is None or any(
                e.entry.get("api_key_id") == key_id
                for e in self.audit_log.entries(app_id=app_id, action="apikey.revoked")
            ):
                return False
            fields = {"app_id": app_id, "api_key_id": key_id, "reason_code": "recorded-late"}
        self.audit.record_many([("apikey.revoked", fields)], once_by=("api_key_id",))
        return True

    def backup(self, dest: PathLike[str] | str) -> BackupReport:
        """Write a backup of the data stores (no key material) and audit it
        (``backup.written``: the audit entries it holds, as ``tree_size``, and its files)."""
        from pathlib import Path

        from uprof.services.backup import backup

        report = backup(self.settings, Path(dest))
        self.audit.record(
            "backup.written",
            tree_size=report.audit_entries,
            counts={"files": len(report.files), "bytes": sum(report.files.values())},
        )
        return report

    def project_log(self, timeout_s: float) -> bool:
        """Bring the projections (not extraction) up to the log head as it is now."""
        head = self.app.max_notification_id()
        if self.settings.background_workers:
            return self.projections.wait_for(head, timeout_s)
        with self._process_lock:
            self.projections.run_until_idle()
        return self.projections.position >= head

    def forget_erased_elsewhere(self) -> int:
        """Flush the caches of every subject erased (wholly or in part) since this
        process last looked, by any process; returns how many subjects.

        An erasure flushes the caches of the process that ran it; the others keep their
        decrypted copies (slice views, saved aggregates, keys, term sets) until they see
        it in the erasure ledger, which every process appends to before any key goes.
        This looks: a stat of the ledger when nothing was appended (the read path asks it
        before every slice, the pipeline worker before every run)."""
        ledger = self.keystore.ledger
        if ledger is None:
            return 0
        state = ledger.state()
        seen = self._ledger_seen
        if state is seen:  # the ledger hands out a new state whenever it changed
            return 0
        with self._ledger_lock:
            seen = self._ledger_seen or LedgerState()
            changed = set(state.streams - seen.streams)
            for erased, before in ((state.captures, seen.captures), (state.items, seen.items)):
                changed.update(s for s, ids in erased.items() if before.get(s) != ids)
            for stream in changed:
                try:
                    stream_id = UUID(stream)
                except ValueError:
                    continue  # not a stream of this store: nothing cached under it
                self.flush_caches(stream_id)
            self._ledger_seen = state
        return len(changed)

    def flush_caches(self, stream_id: UUID) -> None:
        """Forget everything cached about a subject (keys, slice indexes, the recorder's
        and the capture writer's saved state; stemmed words and term sets, which are keyed by
        content, all go)."""
        self.keystore.evict(str(stream_id))
        self.slice_service.flush(stream_id)
        self.reads.forget(stream_id)
        self.capture_service.writer.forget(stream_id)
        self.projections.forget_read_ahead()
        retrieval_text.clear_caches()

    def wait_until_caught_up(self, timeout_s: float) -> bool:
        """Wait (bounded) for background workers to reach the current log head."""
        deadline = time.monotonic() + timeout_s
        while not self.lag().caught_up:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def lag(self) -> Lag:
        extraction = self.extraction.pending_by_partition()
        return Lag(
            log_position=self.app.max_notification_id(),
            extraction_pending=sum(pending for _, pending in extraction),
            projection_pending=self.projections.lag(),
            quarantined=self.quarantine.count() if self.quarantine is not None else 0,
            worked_to=(*extraction, *self.projections.pending_by_partition()),
        )

    def quarantined(self) -> list[QuarantinedCapture]:
        """Every capture held in quarantine (its extraction failed on every attempt),
        oldest first: ids, the subject's pseudonym, the stage and the error's class."""
        return self._quarantine.captures()

    def retry_quarantined(self, capture_ids: Sequence[str] | None) -> list[RetryOutcome]:
        """Extract quarantined captures again (all with None); audited per capture
        (``capture.released``, or ``capture.retried`` when it still fails)."""
        self._settle_reads()
        return self._quarantine.retry(capture_ids)

    @property
    def _quarantine(self) -> QuarantineService:
        if self.quarantine is None:
            raise InvalidInputError("this kernel keeps no quarantine")
        return self.quarantine

    def rebuild(self, progress: Progress | None = None) -> int:
        """Drop the read models and replay the whole log into them (every memory is
        embedded again, by this process's model, which the store then records).

        One process at a time, under the views store's schema lock (a rebuild replaces
        every view, as a migration would): two processes that started at once after a
        restore both rebuilt, and on PostgreSQL one of them crashed on
        ``pk_profile_subjects`` (UniqueViolation). The second now waits, then rebuilds
        again from the log.

        Beside live traffic (a server's clients capturing, its worker running) the
        rebuild goes up to the log's end when it started and leaves the rest to the
        runners: captures up to there are extracted first unless another process's
        worker or captures keep winning the race for them (then that worker, or the
        next run, extracts them), and the views are replayed up to the log's end once
        that is done. It ran extraction until no capture was left, which beside a live
        server never happened, and failed (exit 6) on the lost races before emptying
        anything (decision 0108-rebuild-beside-live-traffic).
        """
        from uprof.storage import schema_lock

        with schema_lock(
            self.views_engine,
            wait_s=self.settings.schema_lock_wait_s,
            purpose="projections rebuild",
        ):
            # Before anything is dropped: a rebuild replays the log through the
            # notification reader, which reads no anchor, and would serve a stream cut
            # short as if it were whole (bug IS); the views stay as they were.
            self.app.refuse_damaged_streams("rebuilding the views")
            self._settle_reads()
            self._extract_before_rebuild()
            if self.vector_model is not None:
                model = self.vector_model
                self.app.record_embedder(model.name, model.dimension)
                model.recorded(model.name)
                self.slice_service.flush()  # cached vectors were the old model's
            replayed = self.projections.rebuild(progress)
        # Every read model was dropped and written again: an administrative write.
        self.audit.record("projections.rebuilt", counts={"events": replayed})
        return replayed

    def _extract_before_rebuild(self) -> None:
        """Extract the captures the log holds now, so a quiet deployment's rebuilt views
        show them; a batch lost again and again to another process (its worker took the
        range, its captures the subjects) is left to it: extraction is the runners' work,
        not the rebuild's, and the views are a replay of whatever the log holds."""
        try:
            self.extraction.run_until(self.app.max_notification_id())
        except ConcurrencyConflictError:
            _log.info(
                "rebuild: extraction lost the race to another process; "
                "its captures are left to the running workers"
            )

    def run_maintenance(self, *, now: datetime | None = None) -> dict[str, int]:
        """Expire overdue intents and archive cold memories (the decay job)."""
        result = self.maintenance.run(now=now or self.clock.now())
        if any(result.values()):  # a run that changed nothing wrote nothing
            self.audit.record("maintenance.ran", counts=dict(result))
        # The job's events are in the log either way; say whether the views show them yet.
        result["views_caught_up"] = int(self.ensure_fresh(self.settings.read_wait_timeout_s))
        return result

    def rate_limiter(self, spec: str, namespace: str) -> RateLimiter:
        """Limits of ``spec`` (the ``UPROF_RATE_LIMIT`` notation) per key of ``namespace``,
        counted in the deployment's database: one allowance for every process."""
        counters = self.rate_counters or RateCounters(self.views_engine)
        return RateLimiter(parse_rate_limit(spec), counters, namespace)

    def close(self) -> None:
        for stop in list(self.worker_stoppers):
            stop()
        try:
            self.reads.close()
            self.projections.close()
        finally:
            for close in self.closers:
                close()


def _rotation_entries(
    records: Sequence[Mapping[str, Any]], *, seq: int | None = None, requested_by: str = ""
) -> list[tuple[str, dict[str, object]]]:
    """The ``audit.key_rotated`` entries of a key history's rotations (only ``seq``'s, if
    given): the new and previous key ids, the position, when the history changed; who
    asked (``requested_by``), or ``reason_code`` recorded-late for one found unrecorded."""
    entries: list[tuple[str, dict[str, object]]] = []
    for previous, record in itertools.pairwise(records):
        if seq is not None and record["seq"] != seq:
            continue
        fields: dict[str, object] = {
            "audit_key_id": record["key_id"],
            "previous_audit_key_id": previous["key_id"],
            "audit_key_seq": record["seq"],
            "occurred_at": record["created_at"],
        }
        if requested_by:
            fields["requested_by"] = requested_by
        else:
            fields["reason_code"] = "recorded-late"
        entries.append(("audit.key_rotated", fields))
    return entries
