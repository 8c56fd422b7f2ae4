"""Ports: the capabilities the services need from the world, as Protocols.

Adapters in ``uprof/adapters`` and in the sibling packages satisfy them
structurally; every port has a fake in ``tests/fakes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from uuid import UUID

import numpy as np

from domain.values import CapturedInteraction, ProposalBatch

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from eventsourcing.persistence import Notification, Recording, Tracking

    from audit.keyring import SigningKeys
    from audit.log import AuditRecord, StoredEntry
    from domain.errors import StoredDataDamagedError, SubjectErasedError
    from domain.profile import SubjectProfile
    from projections.profile.queries import (
        AttributeRow,
        CaptureRow,
        ConsentRow,
        IntentRow,
        MemoryRow,
    )
    from uprof.crypto.keystore import Destruction, StreamHead, SubjectHandle
    from uprof.crypto.ledger import ErasureLedger

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> datetime:
        """Return the current time, timezone-aware UTC."""
        ...


class TokenCounter(Protocol):
    def count(self, text: str) -> int:
        """Return the number of cl100k tokens in text."""
        ...


class Embedder(Protocol):
    dimension: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return an (n, dimension) float32 matrix of L2-normalised rows."""
        ...


#: The vectors of the memories among a batch's events: float32 bytes by item id, from one
#: model call ({} when there are none, or no model). Not storage: ``ProjectionRunner``
#: calls it in its embedding thread, outside the view store's transaction, and hands the
#: result to ``ViewStore.apply_batch``. Production: ``projections.profile.projector.
#: embed_memories`` bound to the deployment's ``Embedder``.
MemoryEmbedding = Callable[[Sequence[Any]], dict[str, bytes]]


class Extractor(Protocol):
    name: str

    def extract(self, capture: CapturedInteraction) -> ProposalBatch:
        """Propose attributes, memories and intents, each citing the capture as evidence."""
        ...


class AuditTrail(Protocol):
    def record(self, action: str, **fields: object) -> None:
        """Append one entry (no personal plaintext: pseudonyms, ids, counts only)."""
        ...

    def record_many(
        self,
        entries: Sequence[tuple[str, dict[str, object]]],
        *,
        once_by: Sequence[str | tuple[str, ...]] = (),
        admitted: Callable[[], None] | None = None,
    ) -> None:
        """Append (action, fields) entries in order, all or nothing. With ``once_by``, an
        entry the log already holds (same action, subject and values of those fields) is
        left out, decided under the log's write lock: exactly once across processes.
        With ``admitted``, that is asked under the log's write lock before anything is
        written, and what it raises is raised (nothing written)."""
        ...


@dataclass(frozen=True)
class ErasureRecord:
    """One line of the erasure ledger: what was erased, by ids and keyed hashes only.

    ``kind``: ``subject`` (a whole subject: its stream, and ``mark``, a keyed hash of
    the subject reference, so that the name is refused until re-created), ``captures``
    (captured events of one stream), ``recreated`` (an operator lifted ``mark``),
    ``incomplete`` (a subject erasure whose keys are gone but whose derived rows were
    not yet purged when it answered ``erasure_incomplete``; ``draft`` holds its receipt's
    ids, commitments and counts, so that asking again finishes it) or ``receipted``
    (that erasure has since issued its receipt) or ``items`` (items of one stream erased
    without their evidence: every start and restore erases them again if a copy brought
    them back).
    """

    kind: str
    tenant: str
    at: str
    stream_id: str | None = None
    mark: str | None = None
    capture_ids: tuple[str, ...] = ()
    request_id: str = ""
    #: JSON of an incomplete erasure's receipt draft (ids, hashes, counts; no content).
    draft: str = ""
    #: ``items``: items of one stream erased without their evidence (decision 0053).
    item_ids: tuple[str, ...] = ()
    #: ``items``: a keyed hash of (stream, evidence capture, kind, identity) per capture
    #: the erased items cited, so that no proposal from those captures records them
    #: again under a new id (decision 0097-erased-items-not-reborn). Records written
    #: before it have none.
    fingerprints: tuple[str, ...] = ()


class KeyMaterialStore(Protocol):
    """Where the secrets that open the data live, apart from the data (decision 0012).

    The file implementation (``uprof.crypto.keydir.FileKeyMaterialStore``) is the
    default; a secrets manager or KMS is another class with these methods, and no
    caller changes. Everything here is needed to read the data, so none of it may
    sit beside the data or in a data backup.
    """

    #: Where the material is, for log lines and errors (never the material itself).
    location: str

    def master_secret(self) -> bytes:
        """Return the root secret (at least 32 bytes), creating it on first use."""
        ...

    def has_master_secret(self) -> bool:
        """Whether the root secret exists already (``master_secret`` would not create it)."""
        ...

    def load_kek_ring(self) -> dict[int, bytes]:
        """Return the key-encryption keys by epoch, creating epoch 1 on first use.

        Two processes starting together must end up with the same ring.
        """
        ...

    def save_kek_ring(self, keys: dict[int, bytes]) -> None:
        """Replace the ring atomically and durably (rotation adds and forgets epochs)."""
        ...

    def ring_lock(self, *, exclusive: bool) -> AbstractContextManager[None]:
        """Held by every process that uses the material: shared while a new data key is
        wrapped and stored under the newest epoch, exclusive while a rotation adds an
        epoch, re-wraps every stored key and forgets the older epochs, so no key is
        wrapped under an epoch a rotation forgets."""
        ...

    def data_upgraded(self, name: str) -> bool:
        """Whether the one-off upgrade of stored data ``name`` finished on this deployment
        (kept with the key material: a writer of the stores cannot make it run again)."""
        ...

    def record_data_upgrade(self, name: str) -> None:
        """Record durably that ``name`` finished (a second record is a no-op)."""
        ...

    def forget_data_upgrade(self, name: str) -> None:
        """Remove the record ``name`` durably (none: a no-op); a marker of work in
        progress, removed once the work's own record is written."""
        ...

    def audit_signing_key(self) -> Ed25519PrivateKey:
        """Return the audit log's current Ed25519 signing key, creating it on first use."""
        ...

    def audit_keys(self) -> SigningKeys:
        """The audit log's current key and the keys of its endorsed history (a
        ``audit.keyring.FileKeyRing`` also rotates)."""
        ...

    def append_erasure(self, record: ErasureRecord) -> None:
        """Append one record durably before returning (an erasure relies on it)."""
        ...

    def erasure_records(self) -> Sequence[ErasureRecord]:
        """Every record appended so far by any process, in order."""
        ...

    def erasure_in_flight(self, request_id: str) -> AbstractContextManager[None]:
        """Mark an erasure request in flight while the block runs (from before its
        ``erasure.requested`` entry to its ledger record or outcome), so that every
        process of the deployment can tell it from a request whose process died; the
        mark goes with the process however it ends."""
        ...

    def erasure_finishing(self, request_id: str) -> AbstractContextManager[bool]:
        """The request's in-flight mark for a process finishing it (asked again), taken
        without waiting: True inside the block when taken (removed at its end), False
        when a live process holds it."""
        ...

    def erasure_mark_state(self, request_id: str) -> str:
        """The request's mark, looked at only: ``"held"``, ``"free"`` (its process
        died), ``"none"``, or ``"host:NAME"`` (another host's, not judged from here)."""
        ...

    def erasure_owner_gone(self, request_id: str) -> AbstractContextManager[bool]:
        """True inside the block when the request's in-flight mark exists and no process
        holds it (its process died in flight); the mark is then held until the block
        ends, and removed. False when a process holds it, or there is none."""
        ...

    def settled_mark(self) -> str | None:
        """The text ``write_settled_mark`` last wrote (None: never)."""
        ...

    def write_settled_mark(self, text: str) -> None:
        """Replace the start's settled-up-to mark, whole (``ErasureService``)."""
        ...

    def settle_host_turn(self) -> AbstractContextManager[None]:
        """Held for a whole settle-host run: another run (any process) waits for it."""
        ...

    def erasure_mark_of_host(
        self, request_id: str, host: str, *, keep: bool = False
    ) -> AbstractContextManager[str]:
        """For an operator declaring ``host`` gone for good: ``"none"`` (no mark of that
        host), ``"held"`` (a process holds it) or ``"gone"`` (then held until the block
        ends, and removed unless ``keep``). Raises ValueError for this host's own name."""
        ...


# --------------------------------------------------------------------------- storage
#
# The four stores the services write and read through. Each is what the services call,
# no more: operator tools (KEK rotation, residue scans, backups) keep the concrete
# adapters. The SQL adapters satisfy these structurally (checked by mypy in
# ``uprof/adapters/conformance.py``); the in-memory fakes in ``tests/fakes`` pass the
# same contract suite (``tests/contracts``) as SQLite and PostgreSQL.


class EventStore(Protocol):
    """Every subject's event stream, with the log's notifications and worker positions.

    Adapter: ``uprof.eventstore.ProfilesApplication`` (SQLite, PostgreSQL).
    """

    @property
    def name(self) -> str:
        """The log's name (the default tracking position is named after it)."""
        ...

    def exists(self, stream_id: UUID) -> bool:
        """Whether the stream holds any event."""
        ...

    def load(self, stream_id: UUID) -> SubjectProfile:
        """The subject at its head (snapshot plus tail).

        Raises SubjectErasedError for a shredded stream, SubjectNotFoundError for none.
        """
        ...

    def stream_events(self, stream_id: UUID) -> list[Any]:
        """Every event of a stream, decoded, in version order."""
        ...

    def erased_item_ids(self, stream_id: UUID) -> set[str]:
        """The items an ``ItemsErased`` of the stream names."""
        ...

    def append_subject_tombstone(
        self, stream_id: UUID, *, request_id: str, basis: str, now: datetime
    ) -> int:
        """Append ``SubjectErased`` without decrypting the stream; its log position, or 0
        when the stream already holds it. Raises as ``load`` does."""
        ...

    def save(self, *aggregates: SubjectProfile) -> list[Recording[UUID]]:
        """Append the aggregates' pending events in one transaction, all or nothing.

        Raises VersionConflictError (a ConcurrencyConflictError) when another writer
        saved to one of the streams first: the version each event expects is taken.
        """
        ...

    def save_tracked(
        self,
        aggregates: Sequence[SubjectProfile],
        tracking: Tracking | None,
        *,
        events: Sequence[Any] = (),
    ) -> None:
        """``save`` plus ``events`` built without an aggregate, plus a worker position, in
        the same transaction.

        A ``GuardedTracking`` only replaces the position it started from, else
        PositionMovedError (nothing written).
        """
        ...

    def with_retry(
        self,
        command: Callable[[], T],
        *,
        subject: UUID | None = None,
        credential: Callable[[], None] | None = None,
    ) -> T:
        """Run a load-decide-save command again while another writer saved first; with
        ``credential``, asked before each attempt and under the store's write lock."""
        ...

    def writer_turns(self, subjects: Iterable[UUID]) -> AbstractContextManager[None]:
        """Hold the in-process writer turns of several subjects."""
        ...

    def catch_up(self, profile: SubjectProfile) -> SubjectProfile:
        """A loaded subject brought up to its stream's head."""
        ...

    def catch_up_many(
        self, profiles: Sequence[SubjectProfile]
    ) -> dict[UUID, SubjectProfile | SubjectErasedError | StoredDataDamagedError]:
        """``catch_up`` for several subjects; an erased one maps to its error, a stream
        below its anchor to damage (bug GO)."""
        ...

    def notification_ids(self, stream_id: UUID, versions: Sequence[int]) -> list[int]:
        """The log positions of a stream's events at ``versions`` (in that order)."""
        ...

    def max_notification_id(self) -> int:
        """The newest log position (0: empty log)."""
        ...

    def notifications_after(
        self, position: int, limit: int, topics: Iterable[str] = ()
    ) -> Sequence[Notification]:
        """Up to ``limit`` notifications after ``position``, in log order."""
        ...

    def stream_versions(self, stream_ids: Sequence[UUID]) -> dict[UUID, int]:
        """The version of each stream's newest event (streams without events left out),
        read from the stored rows without decrypting anything."""
        ...

    def decode(self, notification: Notification) -> Any:
        """The domain event a notification holds (``ContentShredded`` once its key is gone)."""
        ...

    def tracking_position(self, name: str) -> int:
        """Where the named worker position stands (0: never saved)."""
        ...

    def check_position(self, name: str) -> int | None:
        """Where the named check position stands (None: never started). Check positions
        sit beside the worker positions (the late ``capture.accepted`` check's)."""
        ...

    def start_check_position(self, name: str, at: int) -> int:
        """Start the named check position at ``at`` unless it has started; where it stands."""
        ...

    def move_check_position(self, name: str, expected: int, to: int) -> bool:
        """Move the named check position from ``expected`` to ``to`` (compare-and-set,
        across processes); False when it stands elsewhere (another process moved it)."""
        ...

    def drop_snapshots(self, stream_id: UUID) -> int:
        """Delete a stream's snapshots; returns how many went."""
        ...


class SubjectKeyStore(Protocol):
    """Subjects' stream index and their wrapped data keys; crypto-shredding deletes keys.

    Adapter: ``uprof.crypto.keystore.KeyStore`` (tables in the keys database).
    """

    #: The erasure ledger (kept with the key material); None only in bare test stores.
    ledger: ErasureLedger | None

    def pseudonym(self, tenant: str, subject_ref: str) -> str:
        """The subject's pseudonym; for an unknown reference a fresh one each call."""
        ...

    def resolve(
        self, tenant: str, subject_ref: str, *, max_age_s: float = 0.0
    ) -> SubjectHandle | None:
        """A known subject's stream, or None."""
        ...

    def resolve_many(self, tenant: str, subject_refs: Iterable[str]) -> dict[str, SubjectHandle]:
        """``resolve`` for several references; unknown ones left out."""
        ...

    def resolve_or_create(self, tenant: str, subject_ref: str, *, now: datetime) -> SubjectHandle:
        """The subject's stream, created with its first data key on first use."""
        ...

    def stream_ids(self, tenant: str | None = None) -> list[UUID]:
        """Every live subject's stream (of one tenant)."""
        ...

    def bind_alias(
        self, tenant: str, kind: str, alias: str, stream_id: UUID, *, now: datetime
    ) -> bool:
        """Bind a session id or identifier to a stream (rebinding replaces); False, and
        nothing bound, when the stream is no longer a live subject's."""
        ...

    def resolve_alias(self, tenant: str, kind: str, alias: str) -> SubjectHandle | None:
        """The subject an alias is bound to, or None."""
        ...

    def current_key(self, stream_id: str) -> tuple[int, bytes]:
        """(version, DEK) for new events; SubjectErasedError once destroyed."""
        ...

    def key(self, stream_id: str, version: int) -> bytes | None:
        """The DEK of one version, or None when destroyed or unknown."""
        ...

    def view_key(self, stream_id: str) -> bytes | None:
        """The key sealing the subject's read-model fields, or None once destroyed."""
        ...

    def create_capture_keys(
        self, stream_id: str, capture_ids: list[str], *, now: datetime
    ) -> dict[str, str]:
        """Create one key per captured event, before the events are saved; returns each
        capture id's key commitment."""
        ...

    def create_capture_keys_many(
        self, capture_ids: Mapping[str, Sequence[str]], *, now: datetime
    ) -> dict[str, str]:
        """Create several streams' capture keys in one transaction; returns each capture
        id's key commitment."""
        ...

    def capture_key(self, stream_id: str, capture_id: str) -> bytes | None:
        """A capture's key, or None when it (or its subject's DEK) is gone."""
        ...

    def capture_key_commitment(self, stream_id: str, capture_id: str) -> str | None:
        """What ``destroy_capture_key`` would return now; nothing is deleted."""
        ...

    def destroy_capture_key(
        self, stream_id: str, capture_id: str, *, request_id: str | None = None
    ) -> str | None:
        """Delete one capture's key; a commitment to the key this call deleted, or None
        if there was none left. The deletion is recorded as ``request_id``'s in the same
        transaction (``capture_keys_destroyed_by``)."""
        ...

    def capture_keys_destroyed_by(
        self, stream_id: str, capture_ids: Iterable[str]
    ) -> dict[str, tuple[str | None, str]]:
        """Per capture whose key a destroy deleted: (that destroy's request, None when no
        request's; the key's commitment). A start's re-application records none."""
        ...

    def destruction_preview(self, stream_id: str) -> Destruction:
        """What ``destroy`` would destroy now (key commitments, counts); deletes nothing.

        An erasure writes its receipt's draft to the ledger with these before any key
        goes, so that a retry after a crash can finish it (decision 0052)."""
        ...

    def destroy(
        self, stream_id: str, *, now: datetime, request_id: str | None = None
    ) -> Destruction:
        """Delete every key, alias and index row of a stream; mark it shredded. The keys
        returned are those this call deleted: none when another call deleted them first,
        even one this call waited for (bug GK). Each is recorded, in the same
        transaction, as destroyed by ``request_id`` (``destroyed_by``, bug GW)."""
        ...

    def destroyed_by(self, stream_id: str) -> dict[int, tuple[str | None, str]]:
        """Per destroyed key version: (the request whose ``destroy`` deleted it, None
        when no request did; its commitment). Keys destroyed before the key store kept
        this are left out."""
        ...

    def evict(self, stream_id: str) -> None:
        """Forget a stream's cached keys and lookups."""
        ...

    def is_shredded(self, stream_id: str) -> bool:
        """Whether the stream's keys were destroyed."""
        ...

    def plain_row_key(self, key_id: int) -> bytes | None:
        """The deployment key that authenticates plaintext event rows under ``key_id``,
        or None when there is no such key."""
        ...

    def current_plain_row_key(self) -> tuple[int, bytes]:
        """(key id, key) tagging new plaintext event rows, created on first use."""
        ...

    def shredded_among(self, stream_ids: Iterable[str]) -> set[str]:
        """Which of these streams are shredded."""
        ...

    def stream_head(self, log_id: str, stream_id: str) -> StreamHead | None:
        """The stream's anchor in that event log (its newest version known committed)."""
        ...

    def stream_heads_of(self, log_id: str, stream_ids: Iterable[str]) -> dict[str, StreamHead]:
        """The anchors of these streams in that event log (unknown ones left out)."""
        ...

    def stream_heads_in(self, log_id: str) -> dict[str, StreamHead]:
        """Every anchor of that event log, by stream id."""
        ...

    def raise_stream_heads(self, log_id: str, heads: Iterable[StreamHead]) -> None:
        """Raise each stream's anchor in that log to ``heads``, only from the anchor its
        writer checked (``StreamHead.over_version``), never lowering one; none for a
        shredded stream."""
        ...

    def move_stream_heads(self, log_id: str, moves: Iterable[tuple[StreamHead, str]]) -> int:
        """Give each anchor that still is exactly the given one (version and digest) the
        new digest (compare-and-set); how many moved."""
        ...

    def replace_stream_heads(self, log_id: str, heads: Iterable[StreamHead]) -> int:
        """Make ``heads`` the only anchors, of that log; other logs keep none (a restore,
        bug GN); how many were written."""
        ...


class AuditStore(Protocol):
    """The append-only Merkle audit log.

    Adapter: ``audit.log.AuditLog`` (SQL tables, RFC 9162 hashing).
    """

    def append(self, entry: Mapping[str, Any]) -> AuditRecord:
        """Validate and append one entry; its leaf index and hash."""
        ...

    def append_many(
        self,
        entries: Iterable[Mapping[str, Any]],
        *,
        once_by: Sequence[str | tuple[str, ...]] = (),
        admitted: Callable[[], None] | None = None,
    ) -> list[AuditRecord]:
        """Append entries at consecutive indexes, all or nothing (AuditEntryError); with
        ``once_by``, leaving out those the log already holds; with ``admitted``, asked
        under the log's write lock first (``AuditLog.append_many``)."""
        ...

    def holding(
        self,
        action: str,
        subject_refs: Iterable[str],
        field: str,
        values: Iterable[str | int],
    ) -> list[dict[str, Any]]:
        """Stored entries of ``action`` naming one of ``subject_refs`` whose ``field`` is
        one of ``values``: one narrowed read, no lock (``AuditLog.holding``)."""
        ...

    def size(self) -> int:
        """The number of entries (the next leaf index)."""
        ...

    def root(self, tree_size: int | None = None) -> bytes:
        """The Merkle root (the head) of the first ``tree_size`` entries (default: all)."""
        ...

    def inclusion_proof(self, leaf_index: int, tree_size: int | None = None) -> list[bytes]:
        """The RFC 9162 inclusion proof of a leaf."""
        ...

    def entries(
        self,
        subject_ref: str | None = None,
        app_id: str | None = None,
        action: str | None = None,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
        *,
        tree_size: int | None = None,
        after_leaf: int = -1,
        page_size: int = 1000,
    ) -> Iterator[StoredEntry]:
        """Stored entries in leaf order, filtered (``since`` inclusive, ``until`` exclusive)."""
        ...


class ViewStore(Protocol):
    """The subjects' read models: what the projector writes and the services query.

    Every query is scoped to one subject stream, except ``captures`` (callers check the
    stream of what comes back). Personal fields come back in plaintext, or empty once
    the subject's keys are gone. Adapter: ``projections.profile.views.SqlViewStore``
    (``ProfileProjector`` writing, ``ProfileQueries`` reading, one SQL database).

    ``ProjectionRunner`` drives it with ``name``, ``ensure_positions``, ``position``,
    ``lowest_position``, ``apply_batch`` and ``reset``; the services only query.
    """

    @property
    def name(self) -> str:
        """The projection's name: ``apply_batch``'s default position is named after it,
        and a partition's position is ``Partitioning.name(name, k)``."""
        ...

    def ensure_positions(self, projection_names: Sequence[str], application_name: str) -> None:
        """Create the named positions at 0 where they do not exist yet; a position that
        exists (another process created it first, or it has moved) is left as it is.

        Batches lock their position row, so it must exist before the first batch.
        """
        ...

    def lowest_position(self, projection_names: Sequence[str], application_name: str) -> int:
        """The lowest of the named positions that exist (0 when none does)."""
        ...

    def reset(self, projection_names: Sequence[str]) -> None:
        """Drop every subject's view rows and set the named positions of every
        application to 0, in one transaction (a rebuild then starts from event 1).

        Every application's: the rows of every subject are gone, so no position may
        claim any of them is projected.
        """
        ...

    def apply_batch(
        self,
        application_name: str,
        batch: Sequence[tuple[int, Any]],
        last_position: int,
        vectors: dict[str, bytes] | None = None,
        *,
        projection_name: str | None = None,
        read_after: int | None = None,
    ) -> int:
        """Project (notification id, event) pairs and move the position, all or nothing.

        Pairs at or below the stored position are skipped (exactly once); a position
        moved by another runner meanwhile raises PositionMovedError (nothing written),
        and so does a stored position below ``read_after`` (the position the batch was
        read after: the views were reset since, and the events between are in neither).
        ``vectors``: memory embeddings by item id (computed when None and an embedder
        is wired). Returns how many events were applied.
        """
        ...

    def position(self, projection_name: str, application_name: str) -> int:
        """Where the named projection position stands (0: never moved)."""
        ...

    def attributes(self, stream_id: str, *, include_superseded: bool = True) -> list[AttributeRow]:
        """The subject's attributes, by category then key."""
        ...

    def memories(
        self, stream_id: str, *, include_archived: bool = False, with_vectors: bool = False
    ) -> tuple[list[MemoryRow], np.ndarray | None]:
        """Memories, oldest first, and (if asked and all have one) their vectors."""
        ...

    def memories_after(
        self, stream_id: str, *, after: tuple[datetime, str] | None, limit: int
    ) -> list[MemoryRow]:
        """Up to ``limit`` memories (archived too) after (occurred_at, item_id)."""
        ...

    def intents(self, stream_id: str, *, status: str | None = None) -> list[IntentRow]:
        """Intents (of one status), oldest observed first."""
        ...

    def consents(self, stream_id: str) -> list[ConsentRow]:
        """Every consent of the subject, withdrawn ones too, by grant time."""
        ...

    def consents_after(
        self,
        stream_id: str,
        *,
        app_id: str | None,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[ConsentRow]:
        """Up to ``limit`` consents after (granted_at, consent_id)."""
        ...

    def captures(self, capture_ids: Iterable[str]) -> dict[str, CaptureRow]:
        """Captures by id, of any subject (the evidence check compares streams)."""
        ...

    def all_captures(self, stream_id: str) -> list[CaptureRow]:
        """Every capture of the subject, in log order."""
        ...

    def captures_by(
        self,
        stream_id: str,
        *,
        app_id: str,
        purposes: Sequence[str],
        after_position: int | None = None,
        before_position: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[str]:
        """Ids of the subject's captures by one app for these purposes, within bounds.

        Log positions bound them exclusively (``after_position`` < notification_id <
        ``before_position``), times inclusively (``since`` <= recorded_at <= ``until``);
        every bound given applies.
        """
        ...

    def session_activity(self, stream_id: str) -> dict[str, int]:
        """Captures per session, keyed by the session's keyed hash."""
        ...

    def captured_source_refs(
        self, stream_id: str, app_id: str, source_refs: Sequence[str]
    ) -> set[str]:
        """Which of one app's source refs the subject already has captures for."""
        ...

    def item_reads(self, stream_id: str) -> list[tuple[str, str, str, int, datetime]]:
        """(item, app, purpose, reads, last read) of every item served."""
        ...
