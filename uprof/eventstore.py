"""The profiles event store: an eventsourcing application over SQLite or PostgreSQL.

It uses a *process* recorder, so that events and a tracking position can commit
in one transaction: the extraction worker reads captures from this same log and
appends its results atomically with the position it reached (exactly once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.application import Application, ProcessingEvent, project_aggregate
from eventsourcing.domain import OriginatorIDError, OriginatorVersionError
from eventsourcing.persistence import (
    EventStore,
    JSONTranscoder,
    Mapper,
    Notification,
    PersistenceError,
    ProcessRecorder,
    Recording,
    StoredEvent,
    Tracking,
    Transcoding,
)
from eventsourcing.utils import get_topic, resolve_topic

from domain.errors import (
    ConcurrencyConflictError,
    StoredDataDamagedError,
    SubjectErasedError,
    SubjectNotFoundError,
)
from domain.profile import STATE_VALUE_TYPES, SubjectProfile
from domain.under_lock import KEY_CHECK_IN_TURN, asked_within
from uprof import retry, vector_model
from uprof.backends import Backend, backend_for
from uprof.backends.damage import EVENT_ROW_COLUMNS, TRACKING_COLUMNS, refuse_reshaped_tables
from uprof.crypto.keystore import StreamHead
from uprof.crypto.mapper import SubjectKeyMapper
from uprof.crypto.tables import stream_heads
from uprof.partitions import claim
from uprof.ports import SubjectKeyStore
from uprof.recorders import (
    ConflictsAsDomainErrors,
    asked_under_the_store_lock,
    key_check_within_s,
)
from uprof.storage import migrate

T = TypeVar("T")
_log = logging.getLogger(__name__)


class ValueObjectAsDict(Transcoding):
    """A frozen dataclass of the domain as a JSON object of its fields (by class name)."""

    def __init__(self, value_type: type) -> None:
        self.type = value_type
        self.name = value_type.__name__
        self._fields = tuple(f.name for f in dataclasses.fields(value_type))

    def encode(self, obj: Any) -> dict[str, Any]:
        return {name: getattr(obj, name) for name in self._fields}

    def decode(self, data: Any) -> Any:
        return self.type(**data)


class SetAsSortedList(Transcoding):
    """A set of strings (the aggregate's archived memory ids) as a sorted JSON list."""

    type = set
    name = "set"

    def encode(self, obj: set[str]) -> list[str]:
        return sorted(obj)

    def decode(self, data: list[str]) -> set[str]:
        return set(data)


def _gave_up(error: BaseException) -> ConcurrencyConflictError:
    return ConcurrencyConflictError(
        f"gave up after {retry.SUBJECT_WRITE.attempts} attempts: other writers kept saving first"
    )


#: Snapshot every N events, so loading a subject costs the same at any history length.
SNAPSHOT_INTERVAL = 100
#: Lock stripes that in-process writers of one subject queue on.
WRITER_STRIPES = 64


def _with_guarded_recorder(env: dict[str, str], backend: Backend) -> dict[str, str]:
    """The eventsourcing settings plus the recorder class whose tracking save is guarded."""
    module = env.get("PERSISTENCE_MODULE", "")
    if module != backend.persistence_module:
        raise ValueError(
            f"PERSISTENCE_MODULE {module!r}: the profiles log's store is "
            f"{backend.name}, whose module is {backend.persistence_module!r}"
        )
    return {**env, "PROCESS_RECORDER_TOPIC": backend.guarded_recorder_topic}


def rows_checked_snapshot_store(app: Application[UUID], topic: str) -> EventStore[UUID]:
    """``app``'s snapshot store with its recorder of ``topic`` (a ``RowsChecked...``
    recorder: its row reads tell a table or row of the wrong shape as damage), made on the
    library's datastore and table. eventsourcing has no topic setting for this recorder.
    The profiles log's and the policy store's (0238-shapes-under-running-processes)."""
    made = app.factory.aggregate_recorder(purpose="snapshots")
    checked = resolve_topic(topic)(
        datastore=made.datastore,  # type: ignore[attr-defined]
        events_table_name=made.events_table_name,  # type: ignore[attr-defined]
    )
    return app.factory.event_store(mapper=app.mapper, recorder=checked)


def topic_of(event_class: type) -> str:
    return get_topic(event_class)


#: Recording a read changes nothing a later read depends on; every other event may.
READ_TOPIC = topic_of(SubjectProfile.SliceServed)
CAPTURED_TOPIC = topic_of(SubjectProfile.InteractionCaptured)
_ERASED_TOPIC = topic_of(SubjectProfile.SubjectErased)


def head_digest(stream_id: str, version: int, topic: str, state: bytes) -> str:
    """SHA-256 of one stored row as the event store holds it (the sealed state, AEAD tag
    included, or the plaintext one), bound to its stream and version: what a stream's
    anchor keeps of its head row (decision 0132-stream-head-anchor)."""
    h = hashlib.sha256(b"uprof/stream-head/1\x00")
    h.update(f"{stream_id}\x00{version}\x00{topic}\x00".encode())
    h.update(state)
    return h.hexdigest()


def log_identity(backend: Backend, engine: sa.Engine) -> str:
    """Which event log this is, for its streams' anchors: where it lives.

    A SQLite log is its file: a copy of the data folder opened elsewhere with the same key
    folder (an operator's recovery, decision 0088) is another log, whose streams start
    unknown, while an older file put in the live one's place is the same log, rolled back.
    A PostgreSQL log shares its database with the key tables, and a copy of the database
    copies its anchors with it: one identity.
    """
    where = backend.log_location(engine)
    return hashlib.sha256(b"uprof/event-log/1\x00" + where.encode()).hexdigest()[:32]


def head_of(row: StoredEvent, over: StreamHead | None = None) -> StreamHead:
    """The anchor of a committed head row; for a raise, ``over`` is the anchor its
    writer checked (``StreamHead.over_version``; None: there was none)."""
    stream_id = str(UUID(str(row.originator_id)))
    version = int(row.originator_version)
    digest = head_digest(stream_id, version, row.topic, bytes(row.state))
    if over is None:
        return StreamHead(stream_id, version, digest)
    return StreamHead(stream_id, version, digest, over.version, over.digest)


class AnchorBrokenError(Exception):
    """A stream no longer holds the head row its anchor names: it ends below the anchor
    or that row is gone (``cut_short``), or the row there is another one. Each store
    words its own error (the event log's, the policy store's)."""

    def __init__(self, *, cut_short: bool) -> None:
        super().__init__("cut short" if cut_short else "head row replaced")
        self.cut_short = cut_short


def head_to_adopt(
    recorder: Any, stream_id: UUID, loaded: int, anchor: StreamHead | None
) -> StreamHead | None:
    """Check a stream loaded at version ``loaded`` against its anchor; return the head
    to raise the anchor to, if any. Raises ``AnchorBrokenError``.

    A head above the anchor is an append whose anchor write has not landed (a crash
    between the two commits, or another process's write in flight): its rows are
    committed, so anchoring them never runs ahead of the log. No anchor at all: a stream
    written before anchors existed, or whose anchor write never landed; its head is
    adopted. One function for the event log and the policy store (0132, 0140).
    """
    if anchor is not None and loaded < anchor.version:
        raise AnchorBrokenError(cut_short=True)
    if anchor is None:
        rows = recorder.select_events(stream_id, desc=True, limit=1)
    else:
        rows = recorder.select_events(stream_id, gt=anchor.version - 1)
        if not rows or rows[0].originator_version != anchor.version:
            raise AnchorBrokenError(cut_short=True)
        if head_of(rows[0]).digest != anchor.digest:
            raise AnchorBrokenError(cut_short=False)
    if rows and (anchor is None or rows[-1].originator_version > anchor.version):
        return head_of(rows[-1], anchor)
    return None


def heads_after_save(
    keystore: Any,
    log_id: str,
    recorder: Any,
    newest: Mapping[str, StoredEvent],
    first: Mapping[str, int],
) -> list[StreamHead]:
    """The heads a committed save may raise its streams' anchors to (``newest``: each
    stream's newest row written; ``first``: its first version written): over each
    anchor whose row is still the one anchored and below the save's first row (bug GM).

    A writer that did not load the stream (a cached copy, a verdict at ``head + 1``)
    never checked its anchor, and a stream cut short takes its next rows into the
    emptied slots. An anchor at or above the save's first version, or whose row is gone
    or changed, is left as it is: the next load fails closed on it. One function for
    the event log and the policy store (0135, 0140).
    """
    anchors = keystore.stream_heads_of(log_id, newest)
    heads = []
    for stream, row in newest.items():
        anchor = anchors.get(stream)
        if anchor is not None:
            if anchor.version >= first[stream]:
                continue
            rows = recorder.select_events(UUID(stream), gt=anchor.version - 1, lte=anchor.version)
            if not rows or head_of(rows[0]).digest != anchor.digest:
                continue
        heads.append(head_of(row, anchor))
    return heads


def _holds_anchored_row(rows: Sequence[StoredEvent], anchor: StreamHead) -> bool:
    """Whether ``rows`` (a stream's rows after some version, in order) hold the anchored
    row unchanged, or start above the anchor's version (nothing to check there)."""
    if not rows or rows[0].originator_version > anchor.version:
        return True
    at = [r for r in rows if r.originator_version == anchor.version]
    return bool(at) and head_of(at[0]).digest == anchor.digest


def damaged_among(
    anchors: dict[str, StreamHead],
    heads: dict[str, StreamHead],
    anchored_row: Callable[[str, int], StoredEvent | None],
) -> list[str]:
    """The anchored streams a load would refuse: no head, a head below the anchor, or a
    row at the anchor's version that is not the one anchored (``anchored_row`` reads it,
    asked only for a head above its anchor). ``anchors`` must have been read before
    ``heads``: a version an anchor names was committed before the anchor was written."""
    damaged = []
    for stream, anchor in sorted(anchors.items()):
        head = heads.get(stream)
        if head is None or head.version < anchor.version:
            damaged.append(stream)
        elif head.version == anchor.version:
            if head.digest != anchor.digest:
                damaged.append(stream)
        else:
            row = anchored_row(stream, anchor.version)
            if row is None or head_of(row).digest != anchor.digest:
                damaged.append(stream)
    return damaged


def _heads_sql(table: str) -> str:
    return (
        f"SELECT e.originator_id, e.originator_version, e.topic, e.state "
        f"FROM {table} e JOIN (SELECT originator_id, MAX(originator_version) AS v "
        f"FROM {table} GROUP BY originator_id) m "
        "ON e.originator_id = m.originator_id AND e.originator_version = m.v"
    )


def log_anchors(conn: sa.Connection, log_id: str) -> dict[str, StreamHead]:
    """Every anchor of that log, read through ``conn`` (a connection to the key store):
    ``KeyStore.stream_heads_in`` for a process that runs no application (``uprof
    backup``), inside the transaction it reads the log in, where there is one."""
    c = stream_heads.c
    return {
        r.stream_id: StreamHead(r.stream_id, int(r.version), str(r.digest))
        for r in conn.execute(sa.select(c.stream_id, c.version, c.digest).where(c.log_id == log_id))
    }


def damaged_in(conn: sa.Connection, anchors: dict[str, StreamHead]) -> list[str]:
    """``ProfilesApplication.damaged_streams`` for the event log that ``conn`` reads
    (``uprof backup``: the copied file, or the dump's own snapshot) against ``anchors``,
    which must have been read before that log was: every version they name is then in
    it. Reads only."""
    if not anchors:
        return []
    backend = backend_for(conn.engine)
    inspector = sa.inspect(conn)
    found = [
        (schema, name)
        for schema, name in backend.events_table_candidates(conn.engine)
        if inspector.has_table(name, schema=schema)
    ]
    if not found:
        return sorted(anchors)  # anchored streams, and no log at all
    schema, name = found[0]
    table = f'"{schema}"."{name}"' if schema else name
    heads = {
        h.stream_id: h
        for h in (
            head_of(StoredEvent(r[0], int(r[1]), str(r[2]), bytes(r[3])))
            for r in conn.execute(sa.text(_heads_sql(table))).all()
        )
    }

    def anchored_row(stream: str, version: int) -> StoredEvent | None:
        r = conn.execute(
            sa.text(
                f"SELECT originator_id, originator_version, topic, state FROM {table} "
                "WHERE originator_id = :s AND originator_version = :v"
            ),
            {"s": backend.stream_key(UUID(stream)), "v": version},
        ).first()
        return None if r is None else StoredEvent(r[0], int(r[1]), str(r[2]), bytes(r[3]))

    return damaged_among(anchors, heads, anchored_row)


_CUT_SHORT = (
    "stored events of this subject's stream end before the last version known committed "
    "(rows removed from its end, or an older copy of the event store: damaged or altered "
    "storage)"
)
_HEAD_REPLACED = (
    "the stored event at the head of this subject's stream is not the one committed there "
    "(replaced: damaged or altered storage)"
)


@dataclass(frozen=True)
class SubjectHeads:
    """Where one subject's latest events sit in the log (0: none), read in one snapshot.

    ``content`` is the newest event that can change what a read of the subject
    returns (anything but a recorded read); ``captured`` the newest capture, which
    the extraction worker must have passed before its results are in the log;
    ``extracted`` is how far that worker had got.
    """

    captured: int
    content: int
    extracted: int


class ProfilesApplication(ConflictsAsDomainErrors[UUID]):
    """Event store of every subject's stream, sealed per subject."""

    name = "profiles"
    snapshotting_intervals = {SubjectProfile: SNAPSHOT_INTERVAL}  # noqa: RUF012

    def __init__(
        self, env: dict[str, str], keystore: SubjectKeyStore, events_engine: sa.Engine
    ) -> None:
        self._keystore = keystore
        #: One re-entrant lock per stripe of subjects, for writers in this process.
        self._writer_turns = [threading.RLock() for _ in range(WRITER_STRIPES)]
        #: A SQLAlchemy view of the same store, for snapshot purges and WAL checkpoints.
        self.events_engine = events_engine
        #: What this log's store does its own way (uuid form, SQL parameter style, ...).
        self.backend = backend_for(events_engine)
        #: Which log this is, for the streams' anchors in the key store (``log_identity``).
        self.log_id = log_identity(self.backend, events_engine)
        # The library's table creation off: its own statements on a table of the wrong
        # shape fail first (a tracking table's "no such column", naming no table), and
        # SQLite's reads a tracking table it cannot query as one to migrate.
        super().__init__({**_with_guarded_recorder(env, self.backend), "CREATE_TABLE": "n"})
        try:
            self.check_table_shapes()
            self.recorder.create_table()  # type: ignore[attr-defined]
            if self.snapshots is not None:
                self.snapshots.recorder.create_table()  # type: ignore[attr-defined]
        except BaseException:
            self.close()
            raise
        # Our indexes on the library's table: the alembic ``events`` branch, run once the
        # library has created its tables (at head: one query, no alembic import).
        migrate(events_engine, "events")
        self._heads_sql = self._build_heads_sql()

    def construct_snapshot_store(self) -> EventStore[UUID]:
        """The library's snapshot store, its recorder's row reads checked as the event
        table's are: a subject with a snapshot is read from that table first, so a column
        renamed there under a running process was the library's ``IndexError``/
        ``KeyError``, 500 ``internal`` per load (0224-review-of-0220-and-0223, bug UN)."""
        return rows_checked_snapshot_store(self, self.backend.snapshot_recorder_topic)

    def check_table_shapes(self) -> None:
        """Refuse (``StoreShapeDamagedError``, exit 7, naming table and column) a log whose
        event, snapshot or tracking table lacks a column the library reads by name: met
        at run time, it is an ``IndexError``/``KeyError`` inside eventsourcing that no
        driver names, so a start went on and a server answered 500 ``internal`` with a
        traceback per request (0220-event-table-shape-at-start). One catalog read per
        start, before the library creates the tables that are missing (a new log's)."""
        recorder = self.recorder
        # PostgreSQL keeps notification ids in a column the library reads by name;
        # SQLite's are the rowid, which no one can rename.
        _, id_column = self.backend.events_table(recorder)
        events_table: str = recorder.events_table_name  # type: ignore[attr-defined]
        wanted = {
            events_table: EVENT_ROW_COLUMNS | ({id_column} - {"rowid"}),
            # SQLite's tracking table has a fixed name and no attribute for it.
            getattr(recorder, "tracking_table_name", "tracking"): TRACKING_COLUMNS,
        }
        if self.snapshots is not None:
            snapshots: str = self.snapshots.recorder.events_table_name  # type: ignore[attr-defined]
            wanted[snapshots] = EVENT_ROW_COLUMNS
        schema = getattr(recorder.datastore, "schema", None)  # type: ignore[attr-defined]
        found = self.backend.table_columns(self.events_engine, list(wanted), schema=schema)
        refuse_reshaped_tables(
            wanted,
            found,
            self.backend.column_type_fits,
            exactly=self.backend.writes_rows_by_position,
        )

    def construct_mapper(self) -> Mapper[UUID]:
        return SubjectKeyMapper(self.construct_transcoder(), self._keystore)

    def register_transcodings(self, transcoder: JSONTranscoder) -> None:
        super().register_transcodings(transcoder)
        # Snapshots hold the aggregate's state, whose parts are frozen value objects.
        for value_type in STATE_VALUE_TYPES:
            transcoder.register(ValueObjectAsDict(value_type))
        transcoder.register(SetAsSortedList())

    def construct_recorder(self) -> ProcessRecorder:
        recorder = self.factory.process_recorder()
        if not getattr(recorder, "guards_tracking", False):
            # Without the guard, two workers that read the same batch both commit it.
            raise TypeError(
                f"the profiles log needs a guarded process recorder, got {type(recorder).__name__}"
            )
        return recorder

    @property
    def process_recorder(self) -> ProcessRecorder:
        assert isinstance(self.recorder, ProcessRecorder)
        return self.recorder

    # ------------------------------------------------------------------ subjects

    def load(self, stream_id: UUID) -> SubjectProfile:
        """Load a subject (snapshot plus tail); refuse erased or unknown subjects, and
        a stream cut short or whose head row was replaced (its anchor, ``_check_head``)."""
        if self._keystore.is_shredded(str(stream_id)):
            raise SubjectErasedError("this subject has been erased")
        # The anchor before the events: an anchor is written after its event commits, so
        # every version it names is in the read that follows (read the other way round,
        # another process's append between the two reads would look like a cut).
        anchor = self._keystore.stream_head(self.log_id, str(stream_id))
        try:
            profile: SubjectProfile = self.repository.get(stream_id)
        except (OriginatorVersionError, OriginatorIDError):
            # Every genuine stream is numbered 1, 2, 3... with no gap: a row deleted from
            # the middle of it (storage damage, or a writer of the event store dropping a
            # consent's withdrawal) is damage, named as such on every surface rather than
            # the library's anonymous error (review of 0126, bug EM). Still fails closed.
            raise StoredDataDamagedError(
                "stored events of this subject's stream are not in sequence "
                "(a version is missing or out of place: damaged or altered storage)"
            ) from None
        except Exception as e:  # AggregateNotFoundError
            if type(e).__name__ == "AggregateNotFoundError":
                if anchor is not None:  # every row gone, or a copy from before the stream
                    raise StoredDataDamagedError(_CUT_SHORT) from None
                raise SubjectNotFoundError("no such subject stream") from None
            raise
        assert isinstance(profile, SubjectProfile)
        self._check_head(stream_id, profile.version, anchor)
        return profile

    def _check_head(self, stream_id: UUID, loaded: int, anchor: StreamHead | None) -> None:
        """Refuse a stream below its anchor or whose anchored row changed (bug EL);
        adopt a head above it (``head_to_adopt``)."""
        try:
            head = head_to_adopt(self.recorder, stream_id, loaded, anchor)
        except AnchorBrokenError as broken:
            raise StoredDataDamagedError(
                _CUT_SHORT if broken.cut_short else _HEAD_REPLACED
            ) from None
        if head is not None:
            self._raise_anchors(lambda: [head])  # checked just above

    def _record(self, processing_event: ProcessingEvent[UUID]) -> list[Recording[UUID]]:
        """Record, then raise each written stream's anchor in the key store.

        After the commit, never before or inside it: the two stores commit apart, and an
        anchor ahead of its event would make an honest stream look cut short after a
        crash between them. So an anchor lags its stream by at most the save of a
        process killed (or whose key store failed) between its event commit and its
        anchor commit; the next load or append of the stream adopts it.
        """
        recordings = super()._record(processing_event)
        newest: dict[str, Notification] = {}
        first: dict[str, int] = {}
        for recording in recordings:
            n = recording.notification
            stream = str(UUID(str(n.originator_id)))
            held = newest.get(stream)
            if held is None or held.originator_version < n.originator_version:
                newest[stream] = n
            first[stream] = min(first.get(stream, n.originator_version), n.originator_version)
        if newest:
            self._raise_anchors(
                lambda: heads_after_save(self._keystore, self.log_id, self.recorder, newest, first)
            )
        return recordings

    def _raise_anchors(self, heads: Callable[[], Sequence[StreamHead]]) -> None:
        """Raise committed head rows' anchors; a store that refuses is logged.

        The events are committed: failing the request now would report a write that
        happened as one that did not (I12), and failing a load would refuse a stream
        that is whole. The anchor lags as after a crash, until the stream's next load or
        append raises it.
        """
        try:
            self._keystore.raise_stream_heads(self.log_id, heads())
        except (sa.exc.SQLAlchemyError, PersistenceError) as error:
            _log.warning(
                "stream anchors not written after a committed write: %s",
                type(error).__name__,
            )

    def damaged_streams(self) -> list[str]:
        """The streams of this log that a load would refuse for their anchor: below it,
        or whose row at the anchor's version is not the one anchored (the checks of
        ``_check_head``, for every anchored stream at once). For readers of the whole log
        that do not load each subject (a rebuild of the views): they must not replay a
        stream cut short as if it were whole (bug IS).

        The anchors are read before the heads, as a load reads them: a version an anchor
        names was committed before the anchor was written. A head above its anchor (an
        anchor lagging, or another process's append in flight) costs one read of the
        anchored row. Streams without an anchor are unknown, not damaged (a load adopts
        them); shredded streams have none."""
        anchors = self._keystore.stream_heads_in(self.log_id)
        if not anchors:
            return []
        heads = {h.stream_id: h for h in self.current_heads()}

        def anchored_row(stream: str, version: int) -> StoredEvent | None:
            rows = self.recorder.select_events(UUID(stream), gt=version - 1, lte=version)
            return rows[0] if rows else None

        return damaged_among(anchors, heads, anchored_row)

    def refuse_damaged_streams(self, what: str) -> None:
        """Raise ``StoredDataDamagedError`` when any stream is ``damaged_streams``: a
        reader of the whole log fails closed as a load of that stream does."""
        damaged = self.damaged_streams()
        if damaged:
            raise StoredDataDamagedError(
                f"{what} refused: {len(damaged)} subject stream(s) end before the last "
                "version known committed, or their head row is not the one committed there "
                "(damaged or altered storage: restore the stores, or erase those subjects)"
            )

    def current_heads(self) -> list[StreamHead]:
        """Every stream's head row as the event store holds it now (one statement)."""
        table, _ = self._events_table()
        with self.events_engine.connect() as conn:
            rows = conn.execute(sa.text(_heads_sql(table))).all()
        return [head_of(StoredEvent(r[0], int(r[1]), str(r[2]), bytes(r[3]))) for r in rows]

    def move_anchors(self, rewrites: Sequence[tuple[StoredEvent, bytes]]) -> int:
        """Before committed rows are re-written in place (``uprof.crypto.plain_rows``), move
        the anchor of each row that is its stream's anchored head from the row's stored
        bytes to its new state: only if the anchor still names exactly the old row
        (compare-and-set in the key store). An anchor at another version (the row is not
        the anchored head, or another process's append raised it past) or with another
        digest (already moved by an earlier, killed run; or a head replaced, which stays
        damage) is left alone. Call it, and let it return, *before* the rows are
        re-written: killed between the two, the anchor names the new bytes and the old
        row is still there, which the re-run that must follow re-writes (a row re-written
        first would leave an anchor naming bytes no longer stored, and a re-run would not
        find the row to re-write). Returns how many anchors moved."""
        moves = [
            (head_of(row), head_of(dataclasses.replace(row, state=state)).digest)
            for row, state in rewrites
        ]
        return self._keystore.move_stream_heads(self.log_id, moves)

    def reanchor(self) -> int:
        """Make the event store's current heads the anchors (``uprof restore``, run alone
        on the stores: the operator chose this log). Returns how many were written."""
        return self._keystore.replace_stream_heads(self.log_id, self.current_heads())

    def append_subject_tombstone(
        self, stream_id: UUID, *, request_id: str, basis: str, now: datetime
    ) -> int:
        """Append ``SubjectErased`` to a stream without decrypting any of it; return its
        log position, or 0 when the stream already holds its tombstone.

        Erasure must not depend on the data being readable: a stored event whose
        ciphertext was damaged (a flipped byte, a bad copy) fails authentication, and a
        tombstone that replayed the aggregate first could never be appended, so the
        subject could never be erased (bug BX). Tombstones are stored in plaintext
        (ids only), so topics and versions are all this needs; the version check of
        the insert still orders it against concurrent writers (``with_retry``).
        """
        if self._keystore.is_shredded(str(stream_id)):
            raise SubjectErasedError("this subject has been erased")
        # The newest event only, whatever the stream's length: nothing is ever appended
        # after a tombstone (every writer reloads on a version conflict and is refused).
        stored = self.recorder.select_events(stream_id, desc=True, limit=1)
        if not stored:
            raise SubjectNotFoundError("no such subject stream")
        if stored[-1].topic == _ERASED_TOPIC:
            return 0
        tombstone = SubjectProfile.SubjectErased(  # type: ignore[call-arg]  # made by @event
            originator_id=stream_id,
            originator_version=stored[-1].originator_version + 1,
            timestamp=SubjectProfile.SubjectErased.create_timestamp(),
            request_id=request_id,
            basis=basis,
            erased_at=now,
        )
        return self.save(tombstone)[-1].notification.id

    def catch_up(self, profile: SubjectProfile) -> SubjectProfile:
        """Bring a loaded copy of a subject up to its stream's head (the events saved
        since it was loaded, usually none or a few): far cheaper than a new load.
        Refuses a subject erased meanwhile, as ``load`` does."""
        caught_up = self.catch_up_many([profile])[profile.id]
        if isinstance(caught_up, (SubjectErasedError, StoredDataDamagedError)):
            raise caught_up
        return caught_up

    def catch_up_many(
        self, profiles: Sequence[SubjectProfile]
    ) -> dict[UUID, SubjectProfile | SubjectErasedError | StoredDataDamagedError]:
        """``catch_up`` for several subjects: three queries for all of them (which are
        shredded, their anchors, and how far each stream is), then a read of the new
        events of each stream that moved. A subject erased meanwhile maps to its error;
        a stream now below its anchor to damage, as a load refuses it (bug GO: a copy
        kept from before a cut would otherwise go on as if nothing were missing)."""
        shredded = self._keystore.shredded_among(str(p.id) for p in profiles)
        # The anchors before the heads: every version an anchor names is committed
        # before it is written, so it is in the read that follows.
        anchors = self._keystore.stream_heads_of(self.log_id, (str(p.id) for p in profiles))
        heads = self.stream_versions([p.id for p in profiles])
        caught_up: dict[UUID, SubjectProfile | SubjectErasedError | StoredDataDamagedError] = {}
        for profile in profiles:
            if str(profile.id) in shredded:
                caught_up[profile.id] = SubjectErasedError("this subject has been erased")
                continue
            anchor = anchors.get(str(profile.id))
            if anchor is not None and heads.get(profile.id, 0) < anchor.version:
                caught_up[profile.id] = StoredDataDamagedError(_CUT_SHORT)
                continue
            current = profile
            if heads.get(profile.id, 0) > profile.version:
                rows = self.recorder.select_events(profile.id, gt=profile.version)
                if anchor is not None and not _holds_anchored_row(rows, anchor):
                    # The anchored row, among the new ones, is not the one committed
                    # there: a cut slot filled again (bug GQ).
                    caught_up[profile.id] = StoredDataDamagedError(_HEAD_REPLACED)
                    continue
                newer = [self.mapper.to_domain_event(r) for r in rows]
                projected = project_aggregate(profile, newer)
                assert isinstance(projected, SubjectProfile)
                current = projected
            caught_up[profile.id] = (
                SubjectErasedError("this subject has been erased") if current.erased else current
            )
        return caught_up

    def stream_versions(self, stream_ids: Sequence[UUID]) -> dict[UUID, int]:
        """The version of each stream's newest event (streams without events left out),
        in one statement.

        One ``MAX`` subquery per stream, each a single probe of the primary key at any
        history length (a ``GROUP BY`` over an ``IN`` list reads every event of every
        stream). The capture writer asks this for every group, so it goes to the driver
        directly, as ``subject_heads`` does.
        """
        if not stream_ids:
            return {}
        table, _ = self._events_table()
        backend = self.backend
        marks = [backend.driver_param(f"s{i}") for i in range(len(stream_ids))]
        query = "SELECT " + ", ".join(
            f"(SELECT MAX(originator_version) FROM {table} WHERE originator_id = {mark})"
            for mark in marks
        )
        params = {f"s{i}": backend.stream_key(s) for i, s in enumerate(stream_ids)}
        raw = self.events_engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(query, params)
            row = cursor.fetchone()
            cursor.close()
            backend.end_raw_read(raw)
        finally:
            raw.close()
        assert row is not None
        return {s: int(v) for s, v in zip(stream_ids, row, strict=True) if v is not None}

    def exists(self, stream_id: UUID) -> bool:
        """Whether the stream holds events; a stream its anchor says was written and
        that holds none is damage (an older copy of the event store), not a new one."""
        if self.recorder.select_events(stream_id, limit=1):
            return True
        if self._keystore.stream_head(self.log_id, str(stream_id)) is None:
            return False
        # Read again after the anchor: a first append by another process may have
        # committed (and anchored) between the two reads above.
        if self.recorder.select_events(stream_id, limit=1):
            return True
        raise StoredDataDamagedError(_CUT_SHORT)

    def stream_events(self, stream_id: UUID) -> list[Any]:
        """Every event of a stream, decoded, in version order (no snapshot)."""
        return [self.mapper.to_domain_event(r) for r in self.recorder.select_events(stream_id)]

    def erased_item_ids(self, stream_id: UUID) -> set[str]:
        """The items an ``ItemsErased`` of the stream names: only those events decoded
        (stored in plaintext, ids only), not the whole stream."""
        topic = topic_of(SubjectProfile.ItemsErased)
        erased: set[str] = set()
        for stored in self.recorder.select_events(stream_id):
            if stored.topic == topic:
                event: Any = self.mapper.to_domain_event(stored)  # an ItemsErased
                erased.update(event.item_ids)
        return erased

    def save_tracked(
        self,
        aggregates: Sequence[SubjectProfile],
        tracking: Tracking | None,
        *,
        events: Sequence[Any] = (),
    ) -> None:
        """Save aggregates' pending events, and ``events`` built without an aggregate
        (the pipeline's verdicts on streams that cannot be loaded), together with a
        tracking position."""
        processing_event: ProcessingEvent[UUID] = ProcessingEvent(tracking=tracking)
        processing_event.collect_events(*aggregates, *events)
        self._record(processing_event)
        self._take_snapshots(processing_event)

    def _take_snapshots(self, processing_event: ProcessingEvent[UUID]) -> None:
        """Take one snapshot per saved subject when the save crossed an interval boundary.

        The library snapshots at every boundary crossed and reloads the stream for
        each; a batch of 1,000 captures would rebuild the subject ten times. The saved
        aggregate in memory is exactly the state at its new version, so snapshot it.
        """
        if self.snapshots is None:
            return
        for aggregate in processing_event.aggregates.values():
            if not isinstance(aggregate, SubjectProfile):
                continue
            versions = [
                e.originator_version
                for e in processing_event.events
                if e.originator_id == aggregate.id
            ]
            if (
                versions
                and max(versions) // SNAPSHOT_INTERVAL > (min(versions) - 1) // SNAPSHOT_INTERVAL
            ):
                self.snapshots.put([SubjectProfile.Snapshot.take(aggregate)])

    @contextlib.contextmanager
    def writer_turns(self, subjects: Iterable[UUID]) -> Iterator[None]:
        """Hold the turns of several subjects (in stripe order, so two holders of many
        never wait on each other in a cycle; holders of one never wait for a second)."""
        stripes = sorted({hash(s) % len(self._writer_turns) for s in subjects})
        with contextlib.ExitStack() as held:
            for stripe in stripes:
                held.enter_context(self._writer_turns[stripe])
            yield

    def with_retry(
        self,
        command: Callable[[], T],
        *,
        subject: UUID | None = None,
        credential: Callable[[], None] | None = None,
    ) -> T:
        """Run a load-decide-save command, retrying when another writer saved first.

        With ``subject``, writers of that subject in this process take turns (a striped
        lock) instead of racing: under eight threads on one subject, optimistic retries
        alone let an unlucky writer lose every attempt. Writers in other processes are
        still only kept apart by the version check and the retries.

        ``credential``: the check of the key the write is made for (raising once it is
        revoked; ``acting_credential``). Asked in the turn before each attempt, before
        anything is loaded or staged (bugs TX, UJ), and again inside the save once the
        store's own write lock is held, where another process's lock may have kept it
        waiting (bug US): a key revoked meanwhile writes nothing.

        Raises ConcurrencyConflictError (nothing written) when every attempt lost.
        """
        turn = (
            self._writer_turns[hash(subject) % len(self._writer_turns)]
            if subject is not None
            else contextlib.nullcontext()
        )

        def attempt() -> T:
            if credential is not None:
                # Bounded as under the store's lock: the check may read the key store, and
                # this thread holds the subject's turn (other subjects share its stripe);
                # on the capture writer's thread (its fallback) every app's captures wait
                # for it (bug WI). Past the bound: an outage, 503, nothing written.
                asked_within(credential, key_check_within_s(), name=KEY_CHECK_IN_TURN)
            return command()

        with turn, asked_under_the_store_lock(credential):
            # A version conflict means another writer saved first: the command reloads
            # and decides again, after a jittered wait so that writers interleave.
            return retry.SUBJECT_WRITE.call(attempt, give_up=_gave_up)

    # --------------------------------------------------------------------- log

    def max_notification_id(self) -> int:
        return self.recorder.max_notification_id() or 0

    # Per-subject read-your-writes asks "where is this subject's newest event of a kind?"
    # Two partial indexes answer it with one index probe each, at any history length.
    # The library owns the events table; these indexes are ours, created by the alembic
    # ``events`` branch with exactly these conditions (migrations/versions/0001_events_*).
    # Topics are inlined as literals: a planner can only match a partial index to a
    # query whose condition it can see (a bound parameter hides it).
    _HEAD_INDEXES = (
        ("uprof_head_content", "topic <> '{read}'"),
        ("uprof_head_captured", "topic = '{captured}'"),
    )

    def _head_condition(self, template: str) -> str:
        for topic in (READ_TOPIC, CAPTURED_TOPIC):
            assert "'" not in topic  # class paths; never caller input
        return template.format(read=READ_TOPIC, captured=CAPTURED_TOPIC)

    def _events_table(self) -> tuple[str, str]:
        """(qualified table name, notification id column) for this backend."""
        return self.backend.events_table(self.recorder)

    def _tracking_table(self) -> str:
        """The library's table of process positions."""
        return self.backend.tracking_table(self.recorder)

    def subject_heads(self, stream_id: UUID, *, worker: str | None = None) -> SubjectHeads:
        """The subject's heads and the extraction worker's position, in one statement
        (one snapshot: no write can fall between the position and the heads).

        ``worker``: the extraction position that covers the subject (its partition's;
        default: the unpartitioned one, named after this application).

        Every read asks this, so it goes to the driver directly: the statement is
        built once, and SQLAlchemy's per-execution work would cost more than the query.
        """
        key = self.backend.stream_key(stream_id)
        raw = self.events_engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(self._heads_sql, {"stream_id": key, "worker": worker or self.name})
            row = cursor.fetchone()
            cursor.close()
            self.backend.end_raw_read(raw)
        finally:
            raw.close()
        assert row is not None
        return SubjectHeads(
            captured=int(row[1] or 0), content=int(row[0] or 0), extracted=int(row[2] or 0)
        )

    def _build_heads_sql(self) -> str:
        table, nid = self._events_table()
        # The driver's own named-parameter style: :name (sqlite3), %(name)s (psycopg).
        stream, worker = (self.backend.driver_param(p) for p in ("stream_id", "worker"))
        content, captured = (
            f"(SELECT MAX({nid}) FROM {table} WHERE originator_id = {stream} "
            f"AND {self._head_condition(template)})"
            for _, template in self._HEAD_INDEXES
        )
        extracted = (
            f"(SELECT MAX(notification_id) FROM {self._tracking_table()} "
            f"WHERE application_name = {worker})"
        )
        return f"SELECT {content}, {captured}, {extracted}"

    def notifications_after(
        self, position: int, limit: int, topics: Iterable[str] = ()
    ) -> Sequence[Notification]:
        return self.recorder.select_notifications(
            start=position, limit=limit, topics=tuple(topics), inclusive_of_start=False
        )

    def decode(self, notification: Notification) -> Any:
        return self.mapper.to_domain_event(notification)

    def claim_partitioning(self, count: int) -> None:
        """Record this log's pipeline partition count, or check it (uprof.partitions)."""
        claim(self.events_engine, self._tracking_table(), self.name, count)

    def claim_embedder(self, name: str, dimension: int) -> str:
        """Record the model that makes this store's vectors, or return the recorded one
        (uprof.vector_model)."""
        return vector_model.claim(self.events_engine, self._tracking_table(), name, dimension)

    def recorded_embedder(self) -> str | None:
        """The model this store's vectors are recorded as (None: none yet); reads only."""
        return vector_model.recorded(self.events_engine, self._tracking_table())

    def record_embedder(self, name: str, dimension: int) -> None:
        """Record ``name`` as this store's vector model, whatever was recorded (a rebuild)."""
        vector_model.replace(self.events_engine, self._tracking_table(), name, dimension)

    def tracking_position(self, name: str) -> int:
        return self.process_recorder.max_tracking_id(name) or 0

    # Check positions: rows of the library's tracking table beside the worker positions
    # (single-row tracking: one row per name), named by their owner, so
    # no migration: the table is the library's and a row is only added.

    def check_position(self, name: str) -> int | None:
        with self.events_engine.connect() as conn:
            at = conn.execute(
                sa.text(
                    f"SELECT notification_id FROM {self._tracking_table()} "
                    "WHERE application_name = :n"
                ),
                {"n": name},
            ).scalar()
        return None if at is None else int(at)

    def start_check_position(self, name: str, at: int) -> int:
        with self.events_engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {self._tracking_table()} (application_name, notification_id) "
                    "VALUES (:n, :at) ON CONFLICT (application_name) DO NOTHING"
                ),
                {"n": name, "at": at},
            )
            stands = conn.execute(
                sa.text(
                    f"SELECT notification_id FROM {self._tracking_table()} "
                    "WHERE application_name = :n"
                ),
                {"n": name},
            ).scalar_one()
        return int(stands)

    def move_check_position(self, name: str, expected: int, to: int) -> bool:
        with self.events_engine.begin() as conn:
            moved = conn.execute(
                sa.text(
                    f"UPDATE {self._tracking_table()} SET notification_id = :to "
                    "WHERE application_name = :n AND notification_id = :expected"
                ),
                {"n": name, "expected": expected, "to": to},
            )
        return bool(moved.rowcount)

    def drop_snapshots(self, stream_id: UUID) -> int:
        """Delete a stream's snapshot rows: a snapshot is a cache of state that may hold
        content an erasure just shredded. Returns how many rows went."""
        if self.snapshots is None:
            return 0
        table = self.snapshots.recorder.events_table_name  # type: ignore[attr-defined]
        key = self.backend.stream_key(stream_id)  # eventsourcing's stored form
        with self.events_engine.begin() as conn:
            result = conn.execute(
                sa.text(f"DELETE FROM {table} WHERE originator_id = :stream_id"),
                {"stream_id": key},
            )
        return int(result.rowcount or 0)

    def notification_ids(self, stream_id: UUID, versions: Sequence[int]) -> list[int]:
        """The log positions of a stream's events at ``versions`` (in that order)."""
        if not versions:
            return []
        table, nid = self._events_table()
        key = self.backend.stream_key(stream_id)
        wanted = sorted({int(v) for v in versions})
        marks = ", ".join(f":v{i}" for i in range(len(wanted)))
        params: dict[str, Any] = {f"v{i}": v for i, v in enumerate(wanted)}
        params["stream_id"] = key
        with self.events_engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT originator_version, {nid} FROM {table} "
                    f"WHERE originator_id = :stream_id AND originator_version IN ({marks})"
                ),
                params,
            ).all()
        found = {int(v): int(n) for v, n in rows}
        return [found[int(v)] for v in versions]
