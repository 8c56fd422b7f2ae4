"""Re-applying the erasure ledger: nothing erased comes back from a copy or a restore.

Run by every start (``bootstrap``) and at the end of every ``uprof restore``. For
every erased subject stream in the ledger it destroys, wherever they reappeared:
wrapped data keys, capture keys, index and alias rows (a restored key database),
view rows and snapshot rows (a copied or restored data folder). For every erased
capture it destroys the capture key; if the views still hold the capture (the data
predates the erasure), the snapshots of that stream are dropped and the read
models are rebuilt from the log, where the capture now reads as shredded. For every
item erased without its evidence (no key to destroy) that the views list again, the
erasure event is appended again (decision 0053).

The cost is a handful of indexed ``IN`` queries per start, whatever the data size;
see docs/decisions/0012-keys-apart-from-data.md for the measured figures.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from audit.tables import audit_entries
from domain.profile import recorded_identity
from projections.profile import tables as t
from uprof.backends import backend_for
from uprof.crypto.keydir import KeyMaterialError
from uprof.crypto.ledger import LedgerState
from uprof.crypto.tables import (
    capture_keys,
    shredded_streams,
    stream_heads,
    subject_aliases,
    subject_index,
    subject_keys,
)
from uprof.services import erased_keys
from uprof.storage import SchemaTurn, fold_log, schema_lock

_log = logging.getLogger(__name__)


@dataclass
class LedgerReapplied:
    """What re-applying the ledger found and destroyed (all zero on a live store)."""

    erased_streams: int = 0
    erased_captures: int = 0
    key_rows: int = 0
    view_rows: int = 0
    snapshot_rows: int = 0
    stale_captures: int = 0
    #: Items erased without their evidence that a copy brought back, erased again.
    items_reerased: int = 0
    #: Items erased by id only (ledger records older than fingerprints) whose
    #: fingerprints this start added from their streams' events.
    items_fingerprinted: int = 0
    rebuilt: bool = False
    adopted: int = 0
    #: Erasures the data stores recorded and the ledger lacked (a key folder older than
    #: them), and the other way round (data older than the ledger, or made before the
    #: data stores kept the record).
    from_data_record: int = 0
    to_data_record: int = 0
    details: dict[str, int] = field(default_factory=dict)

    @property
    def resurrected(self) -> int:
        return (
            self.key_rows
            + self.view_rows
            + self.snapshot_rows
            + self.stale_captures
            + self.items_reerased
        )


def _any_of(
    conn: sa.Connection, column: str, ids: Sequence[str], cast: str = ""
) -> tuple[str, Any]:
    """A condition "column is one of ids" with one bound parameter, and its value.

    One bound value (the backend's: an array, a JSON list) instead of an expanded IN
    list: the cost stays a few milliseconds per thousand ids.
    """
    return backend_for(conn).any_of(column, ids, cast)


def _delete_in(conn: sa.Connection, table: str, column: str, ids: Sequence[str]) -> int:
    if not ids:
        return 0
    where, value = _any_of(conn, column, ids)
    result = conn.execute(sa.text(f"DELETE FROM {table} WHERE {where}"), {"ids": value})
    return int(result.rowcount or 0)


def _select_in(
    conn: sa.Connection, table: str, column: str, ids: Sequence[str], what: str
) -> list[Any]:
    if not ids:
        return []
    where, value = _any_of(conn, column, ids)
    return list(conn.execute(sa.text(f"SELECT {what} FROM {table} WHERE {where}"), {"ids": value}))


def _drop_snapshots(kernel: Any, stream_ids: Sequence[str]) -> int:
    app = kernel.app
    if app.snapshots is None or not stream_ids:
        return 0
    table = app.snapshots.recorder.events_table_name
    keys = [app.backend.stream_key(UUID(s)) for s in stream_ids]  # eventsourcing's form
    with app.events_engine.begin() as conn:
        where, value = _any_of(conn, "originator_id", keys, cast="uuid")
        result = conn.execute(sa.text(f"DELETE FROM {table} WHERE {where}"), {"ids": value})
    return int(result.rowcount or 0)


def adopt_shredded_streams(kernel: Any) -> int:
    """Record in the ledger the streams an older uprof shredded before the ledger existed."""
    ledger = kernel.keystore.ledger
    if ledger is None:
        return 0
    known = ledger.state().streams
    missing = [s for s in kernel.keystore.shredded_stream_ids() if s not in known]
    for stream_id in missing:
        ledger.record_subject(kernel.subjects.tenant, None, stream_id)
    return len(missing)


def reapply_ledger(
    kernel: Any, *, rebuild_if_stale: bool = True, turn: SchemaTurn | None = None
) -> LedgerReapplied:
    """Destroy whatever a copy, a backup or a restore brought back of erased data.

    ``turn``: the start's turn at the schema locks (``bootstrap``), held from its
    upgrade on; the erased items' catch-up and read of the views run in it instead of a
    turn of their own, and it is let go of once they are done (0256-start-lock-turns)."""
    ledger = kernel.keystore.ledger
    report = LedgerReapplied()
    owed = [engine for engine in _engines(kernel) if _owed_marker(engine, exists=True)]
    if owed:  # an earlier process's re-application could not fold, and ended (bug DU)
        _fold_when_free(kernel, owed)
    if ledger is None:
        return report
    report.adopted = adopt_shredded_streams(kernel)
    report.from_data_record, report.to_data_record = _join_records(kernel, ledger.state())
    state: LedgerState = ledger.state()
    streams = sorted(state.streams)
    captures = sorted({c for ids in state.captures.values() for c in ids})
    report.erased_streams, report.erased_captures = len(streams), len(captures)
    report.items_fingerprinted = fingerprint_old_items(kernel, state)
    report.items_reerased = _erase_items_again(kernel, state, turn)
    if not streams and not captures:
        return report
    now = datetime.now(UTC)
    with kernel.keys_engine.begin() as conn:
        for table in (subject_keys, capture_keys, subject_aliases, subject_index):
            n = _delete_in(conn, table.name, "stream_id", streams)
            report.details[table.name] = n
            report.key_rows += n
        n = _delete_in(conn, capture_keys.name, "capture_id", captures)
        report.details["capture_keys_by_capture"] = n
        report.key_rows += n
        # An erased stream's anchors (decision 0132-stream-head-anchor) guard nothing once
        # its keys are gone; a copy of the key store brings them back with the keys. Not
        # key material: counted apart.
        report.details[stream_heads.name] = _delete_in(
            conn, stream_heads.name, "stream_id", streams
        )
        if report.key_rows:
            # Written down before the deletion commits (bug EV): from the commit on, the
            # fold is owed, and the fold below waits up to FOLD_TIMEOUT_S beside a reader;
            # a process killed in that wait (kill -9, Ctrl+C of a CLI command) left no
            # record, and the next start, with nothing to destroy again, owed nothing.
            _owe_fold(kernel.keys_engine)
        present = {
            r.stream_id
            for r in _select_in(conn, shredded_streams.name, "stream_id", streams, "stream_id")
        }
        absent = [s for s in streams if s not in present]
        if absent:
            conn.execute(
                shredded_streams.insert(), [{"stream_id": s, "shredded_at": now} for s in absent]
            )
    with kernel.views_engine.begin() as conn:
        for table in t.SUBJECT_TABLES:
            n = _delete_in(conn, table.name, "stream_id", streams)
            report.view_rows += n
            if n:
                report.details[table.name] = n
        if report.view_rows:
            _owe_fold(kernel.views_engine)  # before the commit, as the key store's (EV)
        rows = _select_in(conn, t.captures.name, "capture_id", captures, "stream_id")
        report.stale_captures = len(rows)
        stale_streams = {r.stream_id for r in rows}
    report.snapshot_rows = _drop_snapshots(kernel, [*streams, *sorted(stale_streams)])
    if report.snapshot_rows:
        _owe_fold(kernel.app.events_engine)  # just after its commit (EV)
    if report.resurrected:
        for stream_id in [*streams, *stale_streams]:
            kernel.keystore.evict(stream_id)
        _log.warning(
            "erasure ledger re-applied: destroyed %d key rows, %d view rows, %d snapshot rows "
            "of erased subjects, and found %d erased captures still projected (data or key "
            "store older than an erasure)",
            report.key_rows,
            report.view_rows,
            report.snapshot_rows,
            report.stale_captures,
        )
        unfolded = []
        for engine in _engines(kernel):
            if engine in owed:
                continue
            if fold_log(engine):
                _paid_fold(engine)
            else:
                unfolded.append(engine)
        if unfolded:
            _fold_when_free(kernel, unfolded)
    if stale_streams:
        # The restore rolled back their erasures' ref tokens too (bug IO).
        kernel.erasure_service.note_erased_refs(sorted(stale_streams))
    if report.stale_captures and rebuild_if_stale:
        kernel.rebuild()
        report.rebuilt = True
    return report


#: Audit actions around a rebuild of views found ahead of the log: the second is written
#: once the erasures and withdrawals are applied again, so a start that finds the first
#: without a later second (a start killed in between) does it all again.
AHEAD_REBUILD_STARTED = "views.ahead_of_log"
AHEAD_REBUILD_SETTLED = "views.ahead_of_log.settled"


def rebuild_views_ahead_of_log(kernel: Any) -> bool:
    """Rebuild the views when they claim a log position the log has not reached.

    A data folder copied file by file while a server wrote (SQLite: the log and the views
    are two files) can hold views copied after their log: items whose captured events the
    log lacks, and a projection position past the log's head, so the projection would
    skip every event captured from then on until the log caught up. The log is the
    record: the views are rebuilt from it, the idempotency answers kept beside them
    are forgotten, and the erasure ledger and the audit log's consent withdrawals are
    applied again to the rebuilt views (the log lacks the erasures and withdrawals made
    after it was copied: erased items and withdrawn consents came back). The position
    is read before the head, so a process projecting meanwhile never makes a sound
    store look ahead.

    A start killed on the way leaves views no longer ahead (reset, or rebuilt): the audit
    log's ``views.ahead_of_log`` entry without a later ``views.ahead_of_log.settled``
    makes the next start do it all again (one indexed read of each per start)."""
    position = kernel.projections.highest_position
    head = kernel.app.max_notification_id()
    ahead = position > head
    if not ahead and not _ahead_rebuild_unsettled(kernel):
        return False
    if ahead:
        _log.warning(
            "the views are ahead of the event log (projected to %d, the log ends at %d): a "
            "data folder copied while it was written? rebuilding the views from the log",
            position,
            head,
        )
        kernel.audit.record(AHEAD_REBUILD_STARTED, counts={"position": position, "head": head})
    else:
        _log.warning(
            "a start that rebuilt views found ahead of the event log did not finish: "
            "rebuilding them again and re-applying erasures and consent withdrawals"
        )
    if kernel.idempotency is not None:
        # Answers stored beside the views may be to writes this log lacks (see
        # IdempotencyStore.forget_answers); the streams keep what the log holds.
        forgotten = kernel.idempotency.forget_answers()
        _log.warning("forgot %d idempotency keys stored beside the views", forgotten)
    kernel.rebuild()
    # The ledger was re-applied to the views that were ahead, which no longer listed
    # what was erased after the log was copied; the log lacks those erasures, so the
    # rebuild brought the items back. Re-applied to the rebuilt views, it erases them
    # again; the audit log's withdrawals likewise.
    reapply_ledger(kernel)
    withdraw_again(kernel)
    kernel.audit.record(AHEAD_REBUILD_SETTLED)
    return True


def _ahead_rebuild_unsettled(kernel: Any) -> bool:
    """True when the audit log's last ``views.ahead_of_log`` has no settled entry after it."""
    with kernel.views_engine.connect() as conn:
        last = {
            action: conn.execute(
                sa.select(sa.func.max(audit_entries.c.leaf_index)).where(
                    audit_entries.c.action == action
                )
            ).scalar()
            for action in (AHEAD_REBUILD_STARTED, AHEAD_REBUILD_SETTLED)
        }
    started, settled = last[AHEAD_REBUILD_STARTED], last[AHEAD_REBUILD_SETTLED]
    return started is not None and (settled is None or settled < started)


#: The reason code of a withdrawal the start wrote again (``withdraw_again``).
WITHDRAWAL_REAPPLIED = "withdrawal-reapplied"


def withdraw_again(kernel: Any) -> int:
    """Withdraw again the consents the audit log records as withdrawn and the views
    show in force; returns how many.

    The audit log sits beside the views: in a data folder copied log first, it records
    withdrawals made after the log was copied, which the rebuilt views (from that log)
    show in force. Each is written again into its subject's stream, at the time the
    audit log recorded, and audited (``consent.withdrawn``, reason
    ``withdrawal-reapplied``). Subjects erased since are left alone: nothing is
    collected for them. Erasure requested with a withdrawal is the ledger's to redo.
    Only this tenant's withdrawals (``AuditLog.tenant_scope``): before 2026-12-05 a start
    wrote another tenant's on the same stores again and recorded them as its own.
    """
    entries: dict[str, dict[str, Any]] = {}
    # This tenant's withdrawals only: tenants on one set of stores share the log and the
    # views, and another tenant's are its own start's to write again (and to record).
    scope = kernel.audit_log.tenant_scope(kernel.settings.tenant)
    for stored in kernel.audit_log.entries(action="consent.withdrawn", scope=scope):
        entry = stored.entry
        if isinstance(entry.get("consent_id"), str):
            entries.setdefault(entry["consent_id"], entry)
    if not entries:
        return 0
    with kernel.views_engine.connect() as conn:
        rows = _select_in(
            conn,
            t.consents.name,
            "consent_id",
            sorted(entries),
            "consent_id, stream_id, withdrawn_at",
        )
    ledger = kernel.keystore.ledger
    erased = set(ledger.state().streams) if ledger is not None else set()
    again = 0
    for row in sorted(rows, key=lambda r: r.consent_id):
        if row.withdrawn_at is not None or row.stream_id in erased:
            continue
        entry = entries[row.consent_id]
        at = datetime.fromisoformat(entry["recorded_at"])
        written = kernel.app.with_retry(
            functools.partial(_withdraw, kernel.app, UUID(row.stream_id), row.consent_id, at)
        )
        if written:
            kernel.audit.record(
                "consent.withdrawn",
                subject_ref=entry.get("subject_ref"),
                consent_id=row.consent_id,
                reason_code=WITHDRAWAL_REAPPLIED,
            )
            again += 1
    if again:
        _log.warning(
            "%d consents the audit log records as withdrawn were in force in the log "
            "(a data folder copied log first?): withdrawn again",
            again,
        )
    return again


def _withdraw(app: Any, stream: UUID, consent_id: str, at: datetime) -> bool:
    profile = app.load(stream)
    if profile.erased or consent_id not in profile.consents:
        return False
    profile.withdraw_consent(consent_id=consent_id, withdrawn_at=at)
    app.save(profile)
    return True


def settle_subjects_without_keys(kernel: Any, *, accept: str | None) -> list[str]:
    """Refuse to run when the data stores hold subjects whose data keys the key store
    lacks and no erasure names: a key folder put back from a copy older than them. Going
    on would answer "no such subject" for them and let their names start over as new
    subjects, while a newer key folder might still be found. With ``accept`` equal to
    this loss's name (``lost_keys_name``: the operator says these keys are gone for good)
    they are recorded as erased, as an erasure records them, and their rows purged. An
    ``accept`` naming another loss accepts nothing: a value left set after the start it
    was given for must not turn a later loss into permanent erasures. Returns the streams
    so recorded."""
    lost = _streams_without_keys(kernel)
    if not lost:
        return []
    name = lost_keys_name(lost)
    if accept != name:
        given = (
            ""
            if accept is None
            else f" (UPROF_ACCEPT_LOST_KEYS is set, but names another loss: {accept!r})"
        )
        raise KeyMaterialError(
            f"the key folder lacks the data keys of {len(lost)} subjects the data stores "
            f"hold: it is older than the data (put back from an older copy?){given}. Put "
            "back a key folder at least as new as the data; if those keys are gone for "
            f"good, start once with UPROF_ACCEPT_LOST_KEYS={name} to record those subjects "
            "as erased"
        )
    ledger, now = kernel.keystore.ledger, datetime.now(UTC)
    for stream_id in lost:
        if ledger is not None:
            ledger.record_subject(kernel.subjects.tenant, None, stream_id)
        erased_keys.record(kernel.views_engine, stream_id, now=now)
        kernel.keystore.destroy(stream_id, now=now)
    _log.warning(
        "%d subjects whose data keys the key folder lacked are recorded as erased "
        "(UPROF_ACCEPT_LOST_KEYS=%s)",
        len(lost),
        name,
    )
    reapply_ledger(kernel)  # purges their rows, as for any erased subject
    return lost


def lost_keys_name(streams: list[str]) -> str:
    """The name of one key loss: how many subjects and a digest of their (random, not
    personal) stream ids. The acceptance must repeat it, so it accepts this loss only."""
    digest = hashlib.sha256("\n".join(sorted(streams)).encode("ascii")).hexdigest()
    return f"{len(streams)}-{digest[:16]}"


def _streams_without_keys(kernel: Any) -> list[str]:
    """Subjects the views hold with no data key, not shredded and in no erasure. Read
    views first: a subject's keys are stored before any of its rows exist."""
    with kernel.views_engine.connect() as conn:
        streams = set(conn.execute(sa.select(t.subjects.c.stream_id)).scalars())
    if not streams:
        return []
    with kernel.keys_engine.connect() as conn:
        keyed = set(conn.execute(sa.select(subject_keys.c.stream_id).distinct()).scalars())
        shredded = set(conn.execute(sa.select(shredded_streams.c.stream_id)).scalars())
    ledger = kernel.keystore.ledger
    erased = set(ledger.state().streams) if ledger is not None else set()
    return sorted(streams - keyed - shredded - erased)


def _join_records(kernel: Any, state: LedgerState) -> tuple[int, int]:
    """Bring the ledger (key folder) and the data stores' record of erased keys to their
    union: (erasures written into the ledger, erasures written into the data stores).

    An erasure the data stores record and the ledger lacks means the key folder is older
    than it (put back from a copy): its keys are back and would decrypt the log again.
    The ledger gets it back, and the re-application that follows destroys the keys."""
    ledger, views, tenant = kernel.keystore.ledger, kernel.views_engine, kernel.subjects.tenant
    data = erased_keys.read(views)
    to_ledger = 0
    for stream_id in sorted(data.streams - state.streams):
        ledger.record_subject(tenant, None, stream_id, mark=data.marks.get(stream_id))
        to_ledger += 1
    for stream_id, ids in sorted(data.captures.items()):
        missing = ids - set(state.captures.get(stream_id, ()))
        if missing:
            ledger.record_captures(tenant, stream_id, sorted(missing))
            to_ledger += len(missing)
    now = datetime.now(UTC)
    to_data = 0
    for stream_id in sorted(set(state.streams) - data.streams):
        erased_keys.record(views, stream_id, now=now, mark=state.stream_marks.get(stream_id))
        to_data += 1
    for stream_id, erased in sorted(state.captures.items()):
        absent = set(erased) - data.captures.get(stream_id, set())
        if absent:
            erased_keys.record(views, stream_id, absent, now=now)
            to_data += len(absent)
    if to_ledger:
        _log.warning(
            "the key folder is older than %d erasures the data stores record (put back from "
            "a copy?): they are written into its ledger again and their keys destroyed",
            to_ledger,
        )
    return to_ledger, to_data


def _erase_items_again(kernel: Any, state: LedgerState, turn: SchemaTurn | None = None) -> int:
    """Erase again the erased items that the views list (a copy or a restore of data
    older than their erasure brought their events back without the erasure's).

    An item erased without its evidence destroys no key, so unlike a subject or a
    capture it would be served again; its ``items`` ledger record names it. The erasure
    event is appended again (the log may no longer hold it) and the projections purge
    the item as they pass it.

    The views are brought up to the log's head first (this process's partitions): views
    behind the log (a backup taken while projection lagged, a restore of one, a server
    killed with a lag) do not list an item whose event they have not projected yet, and
    would list it, served again, once they had. Projecting first costs the start the lag
    that its workers would project right after, and only when the ledger names items.
    """
    try:
        listed = _listed_again(kernel, state, turn)
    finally:
        if turn is not None:
            turn.release()  # the start's last use of its turn: erasing runs without it
    for stream_id, ids in sorted(listed.items()):
        kernel.erasure_service.reapply_items(UUID(stream_id), ids)  # audited (bug KZ)
        _log.warning(
            "erasure ledger re-applied: %d erased items of one stream were listed again "
            "(data older than their erasure); erased again",
            len(ids),
        )
    return sum(len(ids) for ids in listed.values())


def _listed_again(kernel: Any, state: LedgerState, turn: SchemaTurn | None) -> dict[str, set[str]]:
    """The erased items of ``state`` the views list, by stream, read whole (see
    ``_erase_items_again``); in ``turn`` when it holds the views' lock."""
    wanted = {
        stream: ids for stream, ids in state.items.items() if ids and stream not in state.streams
    }
    if not wanted:
        return {}
    all_ids = sorted({i for ids in wanted.values() for i in ids})
    listed: dict[str, set[str]] = {}
    # Under the views' schema lock, which a rebuild holds from before its reset until its
    # replay has reached its target (``Uprof.rebuild``): beside a rebuild in another
    # process the start waits for it, then projects what is left and reads whole views.
    # Without it the start's batches met the rebuild's reset and replay, and the first
    # batch refused (``PositionMovedError``) ended the start: ``uprof backup`` beside
    # ``uprof projections rebuild`` failed with exit 6 (bug KB). Reading the batch again
    # alone would still read the views' items halfway through a replay, before it brings
    # an erased item back. A start's own turn holds that lock already (one turn per
    # start, 0256-start-lock-turns); another take would wait for itself.
    held = turn is not None and turn.holds(kernel.views_engine)
    with (
        contextlib.nullcontext()
        if held
        else schema_lock(
            kernel.views_engine,
            wait_s=kernel.settings.schema_lock_wait_s,
            purpose="start: re-applying erasures",
        )
    ):
        _project_to_head(kernel)
        with kernel.views_engine.connect() as conn:
            for table in (t.attributes, t.intents, t.memories):
                for row in _select_in(conn, table.name, "item_id", all_ids, "item_id, stream_id"):
                    if row.item_id in wanted.get(row.stream_id, ()):
                        listed.setdefault(row.stream_id, set()).add(row.item_id)
    return listed


def fingerprint_old_items(kernel: Any, state: LedgerState) -> int:
    """Add the fingerprints of items that ledger records older than fingerprints erased
    by id only (decision 0097-erased-items-not-reborn); returns how many items.

    Without them, a capture of such an item extracted again (a restore of data older
    than its extraction) records it again under a new id. The item's capture is kept
    (only the item was erased), so its events are still in the stream: the recording
    event gives its identity, and it and the events that reinforced or restated it give
    the captures it cited. Once per stream: the record added names the items, and an item
    with no recording event left (shredded since) is recorded as having none. Only this
    tenant's live subjects; concurrent starts may both add one (the same fingerprints).
    """
    ledger = kernel.keystore.ledger
    tenant = kernel.subjects.tenant
    added = 0
    for stream_id, item_ids in sorted(state.unfingerprinted.items()):
        if stream_id in state.streams:
            continue
        if kernel.keystore.pseudonym_of_stream(stream_id, tenant=tenant) is None:
            continue  # another tenant's, or gone
        identities: dict[str, tuple[str, str]] = {}
        cited: dict[str, set[str]] = {}
        for event in kernel.app.stream_events(UUID(stream_id)):
            item_id = getattr(event, "item_id", None)
            if item_id not in item_ids:
                continue
            identity = recorded_identity(event)
            if identity is not None:
                identities.setdefault(item_id, identity)
            cited.setdefault(item_id, set()).update(getattr(event, "evidence", ()))
        fingerprints = [
            ledger.fingerprint(stream_id, capture_id, *identity)
            for item_id, identity in identities.items()
            for capture_id in cited.get(item_id, ())
        ]
        ledger.record_fingerprints(tenant, stream_id, item_ids, fingerprints)
        added += len(item_ids)
    if added:
        _log.warning(
            "erasure ledger: added the fingerprints of %d items erased before the ledger "
            "kept them, so that no capture extracted again records them again",
            added,
        )
    return added


def _project_to_head(kernel: Any) -> None:
    """Project the log up to its head as it is now, when the views are behind it: not
    beyond (``run_until``), so a start under a write load faster than one projector
    ends; what is appended after the start looked at the head is no ledger item's."""
    projections = kernel.projections
    head = kernel.app.max_notification_id()
    if projections.position >= head:
        return
    _log.warning(
        "the views are behind the event log (projected to %d, the log ends at %d) and the "
        "erasure ledger names erased items: projecting the log before re-applying it",
        projections.position,
        head,
    )
    kernel.project_to(head)  # a batch lost to another runner is read again


#: Pause between a start's tries to fold a WAL that a reader held (bug CU).
REFOLD_PAUSE_S = 1.0


def _fold_when_free(kernel: Any, engines: Sequence[sa.Engine]) -> None:
    """Keep folding ``engines``' WALs in the background until each is truncated or the
    kernel closes (bug CU).

    The re-destruction above deleted erased subjects' key rows again, but while another
    process holds a read transaction (a backup tool, a shell) the deletion stays in the
    WAL and the old pages, wrapped keys and all, stay in the main file beside the KEK.
    Nothing else folded them: the next start finds nothing to re-destroy, and only the
    next erasure or the last close would. The start is not refused for it (the service
    serves nothing of those subjects: their rows are gone for every reader from now on);
    the fold is owed, said at ERROR, and tried again until it is done."""
    # A start may re-apply the ledger more than once (after a rebuild, after settling lost
    # keys): one background fold per store and process is enough.
    engines = [e for e in engines if e not in _FOLDING]
    if not engines:
        return
    _FOLDING.update(engines)
    names = ", ".join(Path(e.url.database or "").name or str(e.url) for e in engines)
    _log.error(
        "erasure ledger re-applied, but another process holds a read transaction on %s: "
        "its file still holds the erased rows until the write-ahead log is folded; "
        "trying again in the background",
        names,
    )
    # The fold is owed beyond this process (bug DU): one that ends first (a CLI command,
    # a start that fails later) leaves the marker, and the next start folds; that start
    # would not owe it otherwise (nothing left to destroy again), and a server started
    # then would keep the old pages for as long as it runs.
    for engine in engines:
        _owe_fold(engine)
    stop = threading.Event()
    owed = list(engines)

    def run() -> None:
        try:
            fold_until_done()
        finally:
            _FOLDING.difference_update(engines)

    def fold_until_done() -> None:
        while owed and not stop.wait(REFOLD_PAUSE_S):
            try:
                # One short try per store and pause (timeout 0), never the fold's full
                # patience (30 s of tries): the stop is looked at between tries, so a
                # close does not return with this thread still opening and locking the
                # stores after the kernel let go of them (bug DT).
                for engine in list(owed):
                    if stop.is_set():
                        return
                    if fold_log(engine, timeout_s=0):
                        owed.remove(engine)
                        _paid_fold(engine)
            except Exception:
                _log.exception("the background fold of %s failed; it is not tried again", names)
                return
        if not owed:
            _log.warning("the write-ahead logs held at start are folded: %s", names)

    thread = threading.Thread(target=run, name="uprof-refold", daemon=True)

    def stop_and_wait() -> None:
        # The kernel's close runs its stoppers before it releases and disposes the
        # stores: wait for the one try in progress (at most FOLD_TRY_MS per store).
        stop.set()
        thread.join()

    thread.start()
    kernel.worker_stoppers.append(stop_and_wait)


#: The engines a background fold of this process is folding.
_FOLDING: weakref.WeakSet[sa.Engine] = weakref.WeakSet()

#: Beside a SQLite file whose fold a re-application owes: the next start folds it (DU).
FOLD_OWED_SUFFIX = ".fold-owed"


def _owed_marker(engine: sa.Engine, *, exists: bool = False) -> Path | None:
    """The owed-fold marker of ``engine``'s file (SQLite files only; None otherwise, or
    when ``exists`` and there is none)."""
    database = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if engine.url.query.get("mode") == "memory":
        return None
    marker = Path(database + FOLD_OWED_SUFFIX)
    return marker if not exists or marker.exists() else None


def _owe_fold(engine: sa.Engine) -> None:
    """Write down that ``engine``'s file owes a fold (its marker; SQLite files only)."""
    marker = _owed_marker(engine)
    if marker is not None:
        try:
            marker.touch(mode=0o600)
        except OSError as error:
            _log.error("could not record the owed fold of %s: %s", marker.name, error)


def _paid_fold(engine: sa.Engine) -> None:
    """``engine``'s file folded: its marker goes."""
    marker = _owed_marker(engine)
    if marker is not None:
        try:
            marker.unlink(missing_ok=True)
        except OSError as error:  # left: one extra fold at the next start, not a failed one
            _log.warning("could not remove %s after the fold: %s", marker.name, error)


def _engines(kernel: Any) -> Iterable[sa.Engine]:
    engines = (kernel.views_engine, kernel.keys_engine, kernel.app.events_engine)
    return {id(e): e for e in engines}.values()
