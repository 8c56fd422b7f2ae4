"""Identity resolution at the kernel boundary.

Order (kernel-managed shared memory, fixed): 1) the subject named explicitly on
the request; 2) the subject a registered session belongs to; 3) the known
identifier registry (e.g. an e-mail an app knows the user by). Never the
calling agent's own id. Sources that disagree, or none at all, is an error:
ambiguity is never resolved by guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from domain.errors import (
    AmbiguousIdentityError,
    IdentityError,
    InvalidInputError,
    SubjectErasedError,
    SubjectNotFoundError,
)
from domain.values import text_problem
from uprof.crypto.keystore import SubjectHandle
from uprof.ports import AuditTrail, SubjectKeyStore

MAX_REF_LENGTH = 256
#: What a write naming an erased subject is told.
ERASED_SUBJECT = (
    "this subject was erased; an operator can re-create it "
    "(`uprof subjects recreate`), as a new subject with no link to the old"
)
SESSION, IDENTIFIER = "session", "identifier"


@dataclass(frozen=True)
class SubjectRequest:
    """What a request says about whom it concerns."""

    subject: str | None = None
    session_id: str | None = None
    identifier: str | None = None


def check_subject_ref(subject_ref: str) -> str:
    ref = subject_ref.strip()
    if not ref:
        raise InvalidInputError("subject must not be empty", field="subject")
    if len(ref) > MAX_REF_LENGTH:
        raise InvalidInputError(
            f"subject must be at most {MAX_REF_LENGTH} characters", field="subject"
        )
    problem = text_problem(ref)
    if problem:
        # NUL, and bytes of a command line that are not UTF-8 (a lone surrogate), which
        # raised UnicodeEncodeError where the reference is hashed (bug NA).
        raise InvalidInputError(f"subject {problem}", field="subject")
    return ref


#: Between the app an identifier or session id belongs to and the id itself, in the
#: keys the alias registry is asked for (``uprof.facade``); app ids cannot contain it.
NAMESPACE_SEPARATOR = "\x1f"


def _fold_identifier(identifier: str) -> str:
    """Identifiers match whatever their case (an e-mail address); the app namespace in
    front of one is kept as it is: app ids are case-sensitive (``app:CRM`` and
    ``app:crm`` are two apps), and folded they shared their identifiers."""
    namespace, separator, value = identifier.partition(NAMESPACE_SEPARATOR)
    if not separator:
        return identifier.strip().casefold()
    return f"{namespace}{separator}{value.strip().casefold()}"


#: How many streams a resolver remembers as written (each a UUID, ~100 bytes): past it
#: the memory starts again, and a stream is asked about once more.
_WRITTEN_REMEMBERED = 100_000


class SubjectResolver:
    """Map a request to a subject stream in the fixed priority order.

    A subject exists once its stream holds events (its first consent saved). The index
    row and first key are made before that save (``find_or_create``), and stay when the
    save is refused (a key revoked while the grant waited, an outage): such a row names
    no subject, and every road that finds subjects here treats it as a name never made
    (bug UT), until a grant writes its stream. ``stream_written`` asks the event store
    (None: every row counts, for stores without one).
    """

    def __init__(
        self,
        keystore: SubjectKeyStore,
        tenant: str,
        *,
        stream_written: Callable[[UUID], bool] | None = None,
    ) -> None:
        self._keystore = keystore
        self.tenant = tenant
        self._stream_written = stream_written
        # Streams seen written: a stream holds its events until its erasure, which
        # deletes the index row first, so a row found again with a remembered stream
        # needs no read of the event store.
        self._written: set[UUID] = set()

    def written(self, stream_id: UUID) -> bool:
        """Whether the stream holds events (a subject), remembered once seen."""
        if self._stream_written is None or stream_id in self._written:
            return True
        if not self._stream_written(stream_id):
            return False
        if len(self._written) >= _WRITTEN_REMEMBERED:
            self._written.clear()
        self._written.add(stream_id)
        return True

    # ------------------------------------------------------------- registries

    def register_session(self, session_id: str, subject_ref: str, *, now: datetime) -> None:
        """Bind a session to a subject (apps do this when the user signs in)."""
        handle = self._require(subject_ref)
        bound = self._keystore.bind_alias(
            self.tenant, SESSION, session_id, handle.stream_id, now=now
        )
        self._bound_or_gone(bound, subject_ref)

    def register_identifier(self, identifier: str, subject_ref: str, *, now: datetime) -> None:
        """Record that an identifier (e-mail, handle) names a subject."""
        handle = self._require(subject_ref)
        bound = self._keystore.bind_alias(
            self.tenant, IDENTIFIER, _fold_identifier(identifier), handle.stream_id, now=now
        )
        self._bound_or_gone(bound, subject_ref)

    def _bound_or_gone(self, bound: bool, subject_ref: str) -> None:
        """Nothing was bound: the subject found live was erased (by another process)
        before the binding was stored (bug DK); the caller is told as if it had asked
        after the erasure."""
        if not bound:
            if self.is_erased(subject_ref):
                raise SubjectErasedError(ERASED_SUBJECT)
            raise SubjectNotFoundError("no such subject")

    def _require(self, subject_ref: str) -> SubjectHandle:
        handle = self.find(subject_ref)
        if handle is None:
            raise SubjectNotFoundError("no such subject")
        return handle

    # -------------------------------------------------------------- resolution

    def resolve(
        self, request: SubjectRequest, *, calling_agent: str = "", max_age_s: float = 0.0
    ) -> SubjectHandle:
        """Return the subject the request concerns, or raise IdentityError.

        ``max_age_s``: an explicit subject looked up that recently may be reused (reads).
        """
        found: list[tuple[str, SubjectHandle]] = []
        # The app's own names first, each refused when it resolves to nothing: a name
        # sent is never dropped (I5, bug QK), and looked up before any subject, so the
        # refusal says nothing of whether the subject beside it exists. Another app's
        # session is outside this app's namespace: refused as unknown, alike.
        for source, kind, field, name in (
            ("session", SESSION, "session_id", request.session_id),
            ("identifier", IDENTIFIER, "identifier", request.identifier),
        ):
            if name:
                key = _fold_identifier(name) if kind == IDENTIFIER else name
                handle = self._keystore.resolve_alias(self.tenant, kind, key)
                if handle is None:
                    # The message names the name as every surface calls it (the CLI's
                    # is ``--session``); ``field`` is the wire field, for REST's fields.
                    raise IdentityError(
                        f"the {source} is not registered to any subject by this app",
                        field=field,
                    )
                found.append((source, handle))
        if request.subject:
            ref = check_subject_ref(request.subject)
            if calling_agent and ref == calling_agent:
                raise IdentityError("a request may not name the calling agent as its subject")
            handle = self.find(ref, max_age_s=max_age_s)
            if handle is None:
                raise SubjectNotFoundError("no such subject")
            found.insert(0, ("subject", handle))
        if not found:
            raise IdentityError("the request names no subject (subject, session or identifier)")
        if len({h.stream_id for _, h in found}) > 1:
            sources = ", ".join(source for source, _ in found)
            raise AmbiguousIdentityError(f"ambiguous identity: {sources} name different subjects")
        return found[0][1]

    def find(self, subject_ref: str, *, max_age_s: float = 0.0) -> SubjectHandle | None:
        """The subject's stream, None if unknown; SubjectErasedError if it was erased.

        The erased check comes after the index lookup: an erasure appends its ledger
        record before it deletes the index row, so a miss here sees the record.
        """
        ref = check_subject_ref(subject_ref)
        found = self._keystore.resolve(self.tenant, ref, max_age_s=max_age_s)
        if found is None and self.is_erased(ref):
            raise SubjectErasedError(ERASED_SUBJECT)
        if found is not None and not self.written(found.stream_id):
            return None  # a grant's row whose save was refused: no subject (UT)
        return found

    def find_many(self, subject_refs: Iterable[str]) -> tuple[dict[str, SubjectHandle], set[str]]:
        """``find`` for several checked references with one index lookup: the handles
        found, and which of the others are erased (the rest name no subject)."""
        refs = set(subject_refs)
        found = {
            ref: handle
            for ref, handle in self._keystore.resolve_many(self.tenant, refs).items()
            if self.written(handle.stream_id)  # as ``find`` (UT)
        }
        # The same order as ``find``: the ledger is read after the index missed.
        erased = {ref for ref in refs - found.keys() if self.is_erased(ref)}
        return found, erased

    def is_erased(self, subject_ref: str) -> bool:
        """True while the reference is marked erased in the erasure ledger."""
        ledger = self._keystore.ledger
        return ledger is not None and ledger.is_erased(self.tenant, check_subject_ref(subject_ref))

    def forget(self, stream_id: UUID) -> None:
        """Drop cached lookups of a stream (a reader found it erased)."""
        self._keystore.evict(str(stream_id))

    def find_or_create(
        self, subject_ref: str, *, now: datetime, audit: AuditTrail | None = None
    ) -> SubjectHandle:
        """The subject's stream, created on first use; refused for an erased subject.

        The call that creates it records the first data key in ``audit`` (``key.created``
        with its ``dek_commitment``, the value ``key.destroyed`` and an erasure receipt
        cite when it goes), before anything is written under it.
        """
        found = self.find(subject_ref)
        if found is not None:
            return found
        handle = self._keystore.resolve_or_create(
            self.tenant, check_subject_ref(subject_ref), now=now
        )
        if handle.created and audit is not None and handle.dek_commitment is not None:
            audit.record(
                "key.created",
                subject_ref=handle.pseudonym,
                key_version=1,
                dek_commitment=handle.dek_commitment,
            )
        return handle

    def pseudonym(self, subject_ref: str) -> str:
        """The subject's pseudonym; for an unknown reference a fresh one each call."""
        return self._keystore.pseudonym(self.tenant, check_subject_ref(subject_ref))

    def stream_ids(self) -> list[UUID]:
        return self._keystore.stream_ids(self.tenant)
