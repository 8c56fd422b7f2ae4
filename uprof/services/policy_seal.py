"""The policy store, sealed: every row authenticated, every stream's head anchored.

The policy store (``PolicyApplication``) is an event log like the profile log, and a
writer of the stores could forge, alter, move, cut or roll back its rows: a forged
``RuleAdded`` was served at the next start (bug HA), a revocation cut from the tail or an
older ``policies.sqlite`` put back granted the revoked right again (bug HB). It now gets
the profile log's two guarantees, by the same mechanisms (decision
0140-sealed-policy-store):

- **Every row tagged** (decision 0136): ``0x03 | key id | HMAC-SHA256 | JSON state``
  under the deployment's plain-row key (``KeyStore.current_plain_row_key``, wrapped by
  the KEK), over the row's stream, version and topic (``uprof.crypto.mapper``'s
  ``tagged_plain_state``). Events and snapshots alike. A row without a valid tag is
  damage (``PolicyStoreDamagedError``).
- **Every stream's head anchored** (decision 0132, review 0135) in the key store's
  ``stream_heads``, under a log id of the policy store's own (``policy_log_id``). Read
  before the events on each load, raised after each save only over the anchor that save
  found whole (compare-and-set in the database). A stream that ends below its anchor, or
  whose anchored row changed, is damage.

``seal_legacy_policy_rows`` is the one-off upgrade of a store of before this change,
run at start under the event log's schema lock, with 0137's defence (bug GR): it tags
only when nothing shows it ran before.

Damage never grants: the authorizer denies every check, naming the policy store and
``stored_data_damaged``, and the service logs and audits it (``policy.store_damaged``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.domain import OriginatorIDError, OriginatorVersionError
from eventsourcing.persistence import Mapper, StoredEvent, Transcoder

from domain.errors import StoredDataDamagedError, StoreShapeDamagedError
from uprof.backends import reading_connection
from uprof.backends.damage import EVENT_ROW_COLUMNS as _EVENT_COLUMNS
from uprof.backends.damage import reshaped_tables
from uprof.crypto.keystore import StreamHead
from uprof.crypto.mapper import PLAIN_TAG, PLAIN_TAGGED, plain_row_tag, tagged_plain_state
from uprof.eventstore import AnchorBrokenError, head_of, head_to_adopt, heads_after_save
from uprof.ports import KeyMaterialStore

_log = logging.getLogger(__name__)

#: The upgrade's name in the key folder's record, and its "begun" marker (0137).
UPGRADE = "policy-rows-tagged-1"
BEGUN = "policy-rows-tagging-begun-1"
_HEADER = 1 + 4 + PLAIN_TAG


class PolicyStoreDamagedError(StoredDataDamagedError):
    """A policy row failed authentication, or the policy stream was cut short or rolled
    back: every policy check denies (500 ``stored_data_damaged`` where it surfaces)."""

    hint = (
        "the policy store (policies.sqlite, or the policies_* tables) was damaged or "
        "altered; every policy check denies. Restore it from a backup (uprof restore), "
        "or see docs/security.md"
    )


class PolicyStoreMissingError(PolicyStoreDamagedError):
    """A starting process found the policy store's events table missing while the key
    store holds an anchor of the policy log: the table was there, and was dropped or
    renamed, or its file replaced (bug PX). Nothing is created in its place: an empty
    table stood in the way of putting the old one back, and was then refused as damage
    ("rows removed") without saying what was missing. Not an outage: retrying does not
    bring it back."""

    hint = (
        "put the policy store's table back: rename it back, or restore the stores from a "
        "backup (uprof restore). No process starts until it is back"
    )


def _damaged(what: str) -> PolicyStoreDamagedError:
    return PolicyStoreDamagedError(f"policy store damaged (stored_data_damaged): {what}")


def policy_log_id(env: Any) -> str:
    """The policy store's log id for its anchors: its file on SQLite (as 0132's
    ``log_identity``: a copy opened elsewhere is another log, an older file put in the
    live one's place the same log rolled back), one constant on PostgreSQL. Labelled
    apart from the profile log's ids."""
    module = str(env.get("PERSISTENCE_MODULE") or "")
    if module.endswith("sqlite"):
        name = str(env.get("SQLITE_DBNAME") or "")
        memory = name == ":memory:" or "mode=memory" in name
        where = "sqlite:" + (name if memory or not name else str(Path(name).resolve()))
    else:
        where = module or "memory"
    return hashlib.sha256(b"uprof/policy-log/1\x00" + where.encode()).hexdigest()[:32]


def authentic_body(keystore: Any, stored: StoredEvent) -> bytes | None:
    """The JSON state of a tagged policy row whose tag verifies, else None."""
    import hmac

    state = bytes(stored.state)
    if state[:1] != PLAIN_TAGGED or len(state) < _HEADER:
        return None
    key_id = int.from_bytes(state[1:5], "big")
    key = keystore.plain_row_key(key_id)
    if key is None:
        return None
    body = state[_HEADER:]
    want = plain_row_tag(
        key, key_id, stored.originator_id, stored.originator_version, stored.topic, body
    )
    return body if hmac.compare_digest(want, state[5:_HEADER]) else None


class PolicyRowMapper(Mapper[UUID]):
    """Tags every policy row on write; refuses, as damage, every row whose tag does not
    verify on read (events and snapshots)."""

    def __init__(self, transcoder: Transcoder, keystore: Any) -> None:
        super().__init__(transcoder=transcoder)
        self.keystore = keystore

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        stored = super().to_stored_event(domain_event)
        key_id, key = self.keystore.current_plain_row_key()
        state = tagged_plain_state(
            key, key_id, stored.originator_id, stored.originator_version, stored.topic, stored.state
        )
        return StoredEvent(stored.originator_id, stored.originator_version, stored.topic, state)

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        body = authentic_body(self.keystore, stored_event)
        if body is None:
            raise _damaged(
                f"the row at version {stored_event.originator_version} of a tenant's policy "
                "stream is not authenticated (forged, altered or moved)"
            )
        return super().to_domain_event(
            StoredEvent(
                stored_event.originator_id,
                stored_event.originator_version,
                stored_event.topic,
                body,
            )
        )


_CUT = (
    "a tenant's policy stream ends before the last version known committed "
    "(rows removed, or an older policy store put back)"
)
_RESHAPED = (
    "a table of the policy store is not of the shape uprof made (a column renamed, dropped "
    "or of another type, or a row of another shape: altered by hand)"
)
_REPLACED = "the row at the head of a tenant's policy stream is not the one committed there"


class SealedPolicyLog:
    """What ``PolicyApplication`` does to keep its streams anchored: the checked load and
    the raise after a save. Mixed into the application (it needs its recorder)."""

    recorder: Any
    repository: Any
    snapshots: Any
    keystore: Any
    log_id: str

    def load_checked(self, stream_id: UUID) -> Any | None:
        """The stream's aggregate (None: no stream and no anchor); damage raised as
        ``PolicyStoreDamagedError``. The anchor is read before the events (0132)."""
        try:
            return self._load_checked(stream_id)
        except StoreShapeDamagedError as reshaped:
            # The recorders' look at a failed or odd read (a column renamed or of another
            # type, a row of another shape), logged there naming the column: the policy
            # store's damage for the checks, audited (0238-shapes-under-running-processes).
            raise _damaged(_RESHAPED) from reshaped

    def _load_checked(self, stream_id: UUID) -> Any | None:
        anchor = self.keystore.stream_head(self.log_id, str(stream_id))
        try:
            aggregate = self.repository.get(stream_id)
        except (OriginatorVersionError, OriginatorIDError):
            raise _damaged("a tenant's policy stream is not in sequence") from None
        except Exception as error:
            if type(error).__name__ != "AggregateNotFoundError":
                raise
            if anchor is not None:
                raise _damaged(_CUT) from None
            return None
        self.check_head(stream_id, int(aggregate.version), anchor)
        return aggregate

    def check_head(self, stream_id: UUID, loaded: int, anchor: StreamHead | None) -> None:
        """Refuse a stream below its anchor or whose anchored row changed; adopt a head
        above it (an append whose anchor write has not landed, or no anchor yet)."""
        try:
            head = head_to_adopt(self.recorder, stream_id, loaded, anchor)
        except AnchorBrokenError as broken:
            raise _damaged(_CUT if broken.cut_short else _REPLACED) from None
        if head is not None:
            self.raise_anchors([head])

    def anchor_saved(self, newest: dict[str, StoredEvent], first: dict[str, int]) -> None:
        """After a save committed: raise each stream's anchor over the one still whole
        and below the save's first row (0135, bug GM); others stay for the next load."""
        self.raise_anchors(
            heads_after_save(self.keystore, self.log_id, self.recorder, newest, first)
        )

    def open_tables(self, engine: sa.Engine) -> None:
        """Create the store's tables (built with eventsourcing's ``CREATE_TABLE`` off),
        unless its events table is missing from ``engine``'s database while the key store
        holds an anchor of this log: then ``PolicyStoreMissingError``, nothing created
        (bug PX). The anchors are read first: a process starting beside a new deployment
        that another one is creating sees no anchor, and creates (if not there) as before;
        an anchor only ever follows its table."""
        anchored = self.keystore.stream_heads_in(self.log_id)
        table = str(self.recorder.events_table_name)
        if anchored and not _has_table(engine, table):
            from uprof.backends import backend_for

            where = backend_for(engine).log_location(engine)
            raise PolicyStoreMissingError(
                f"policy store missing (stored_data_damaged): its table {table} ({where}) is "
                f"not there, though the key store holds the anchors of {len(anchored)} "
                "tenant policy stream(s) stored in it (the table was dropped or renamed, "
                "or its file replaced); nothing was created in its place"
            )
        self.require_shape(engine)
        self.recorder.create_table()
        if self.snapshots is not None:
            self.snapshots.recorder.create_table()

    def require_shape(self, engine: sa.Engine) -> None:
        """Refuse, once at start, an events or snapshot table not of the shape uprof made:
        a column every row is read by missing or of a type the library cannot read back,
        or, on SQLite, a column more (its rows are written by position). Met later, it
        was each policy check's driver error or the library's traceback (review of 0203
        and 0205, bug RF, for the events table's columns missing), or, for the snapshot
        table, a policy change failing at the hundredth version
        (0228-review-of-0224-and-store-shapes, bug VB). The event store's rule
        (``uprof.backends.damage.reshaped_tables``). A missing table is left to
        ``open_tables`` above (and the library makes a new deployment's). ``uprof
        restore`` asks it of a live policy it would keep (bug VC)."""
        from uprof.backends import backend_for

        backend = backend_for(engine)
        _, id_column = backend.events_table(self.recorder)
        wanted = {str(self.recorder.events_table_name): _EVENT_COLUMNS | ({id_column} - {"rowid"})}
        if self.snapshots is not None:
            wanted[str(self.snapshots.recorder.events_table_name)] = _EVENT_COLUMNS
        schema = getattr(self.recorder.datastore, "schema", None)
        found = backend.table_columns(engine, list(wanted), schema=schema)
        said = reshaped_tables(
            wanted, found, backend.column_type_fits, exactly=backend.writes_rows_by_position
        )
        if said:
            raise _damaged(f"{'; '.join(said)} (made again or altered by hand, or replaced)")

    def policy_streams(self) -> list[UUID]:
        """Every stream of the policy store (one per tenant; the store is small)."""
        notes = self.recorder.select_notifications(start=None, limit=1_000_000)
        return sorted({UUID(str(n.originator_id)) for n in notes})

    def check_every_stream(self) -> None:
        """Load every tenant's policy stream against its anchor (``load_checked``);
        raise the first damage found. ``uprof restore`` keeping the live policy runs it
        before it replaces the anchors: anchored again, a damaged policy (a cut
        revocation, an older store put back) would be the policy in force (bug HS)."""
        for stream_id in self.policy_streams():
            self.load_checked(stream_id)

    def anchor_missing_heads(self, stream_ids: Sequence[UUID]) -> None:
        """Anchor each stream without an anchor at its head as stored now (the upgrade
        once its rows are tagged; ``uprof restore`` once 0132's ``reanchor`` replaced
        every anchor: the operator chose the stores). An existing anchor is left alone.
        Raised, not flushed: one lost in a power cut is adopted again at the next load."""
        heads = []
        for stream_id in stream_ids:
            rows = self.recorder.select_events(stream_id, desc=True, limit=1)
            if rows:
                heads.append(head_of(rows[0]))
        self.keystore.raise_stream_heads(self.log_id, heads)

    def raise_anchors(self, heads: Sequence[StreamHead]) -> None:
        """Raise anchors; a key store that refuses is logged (the rows are committed:
        the anchor lags, as after a crash, I12)."""
        try:
            self.keystore.raise_stream_heads(self.log_id, heads)
        except Exception as error:
            _log.warning("policy store anchors not written: %s", type(error).__name__)


def seal_legacy_policy_rows(
    app: Any,
    engine: sa.Engine,
    material: KeyMaterialStore,
    *,
    again: bool = False,
    after_rows: Any = None,
) -> int | None:
    """Tag the policy rows written before the store was sealed, once per deployment; the
    rows tagged, or None when nothing was to be done. ``again``: a restore (the operator's
    chosen backup may hold untagged rows). ``after_rows``: called once the rows are
    committed, before the anchors and the record (tests stop the process there).

    Safe to kill and to repeat: one flushed transaction re-writes every untagged row by
    compare-and-set, and drops the untagged snapshots (a cache, rebuilt from the events);
    then every stream's head is anchored (a raise: an anchor never goes down); only then
    is it recorded done in the key folder. A pass killed after its begun marker is
    finished by the next start. With no record at all (the key folder lost it, GR) the
    pass tags nothing if the store holds a tagged row or the key store an anchor of this
    log: the upgrade ran, so an untagged row is someone else's, and stays damage.
    """
    if not again and material.data_upgraded(UPGRADE):
        material.forget_data_upgrade(BEGUN)
        return None
    from uprof.backends import backend_for

    backend = backend_for(engine)
    events, _ = backend.events_table(app.recorder)
    snapshots, _ = backend.events_table(app.snapshots.recorder)
    select = sa.text(f"SELECT originator_id, originator_version, topic, state FROM {events}")
    with engine.connect() as conn:
        rows = [
            StoredEvent(str(r[0]), int(r[1]), str(r[2]), bytes(r[3]))
            for r in conn.execute(select).all()
        ]
    if not material.data_upgraded(BEGUN):
        # No pass in progress. A tagged row means the store was sealed before: any
        # untagged row beside it was written since by someone without the key, and stays
        # damage, at a start whose record is lost (GR) and at a restore alike (a restore
        # keeps the live policy, and a backup's policy is either all tagged or, taken
        # before the seal, all untagged). A start (not a restore, which replaces the
        # anchors) also takes an anchor of this log as that evidence.
        streams = {str(UUID(str(r.originator_id))) for r in rows}
        if any(r.state[:1] == PLAIN_TAGGED for r in rows) or (
            not again and app.keystore.stream_heads_of(app.log_id, streams)
        ):
            material.record_data_upgrade(UPGRADE)
            return None
    material.record_data_upgrade(BEGUN)
    key_id, key = app.keystore.current_plain_row_key()
    update = sa.text(
        f"UPDATE {events} SET state = :new "
        "WHERE originator_id = :s AND originator_version = :v AND state = :old"
    )
    tagged = 0
    with backend.flushed_transaction(engine) as conn:
        for row in rows:
            if row.state[:1] == PLAIN_TAGGED:
                continue
            new = tagged_plain_state(
                key,
                key_id,
                UUID(str(row.originator_id)),
                row.originator_version,
                row.topic,
                row.state,
            )
            tagged += conn.execute(
                update,
                {"new": new, "s": row.originator_id, "v": row.originator_version, "old": row.state},
            ).rowcount
        # Snapshots are a cache: an untagged one is dropped, not tagged (the events rebuild it).
        for s in conn.execute(
            sa.text(f"SELECT originator_id, originator_version, state FROM {snapshots}")
        ).all():
            if bytes(s[2])[:1] != PLAIN_TAGGED:
                conn.execute(
                    sa.text(
                        f"DELETE FROM {snapshots} WHERE originator_id = :s "
                        "AND originator_version = :v"
                    ),
                    {"s": s[0], "v": s[1]},
                )
    if after_rows is not None:
        after_rows(tagged)
    app.anchor_missing_heads(sorted({UUID(str(r.originator_id)) for r in rows}))
    material.record_data_upgrade(UPGRADE)
    material.forget_data_upgrade(BEGUN)
    return tagged


def _has_table(engine: sa.Engine, table: str) -> bool:
    """Whether ``engine``'s database has ``table``, asked on the start's schema-lock
    connection where this thread holds one (``reading_connection``)."""
    with reading_connection(engine) as conn:
        return sa.inspect(conn).has_table(table)
