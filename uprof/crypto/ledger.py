"""The erasure ledger: what was erased, kept with the key material, never with the data.

Every erasure appends a record *before* any key is destroyed (so a crash between
the two is finished at the next start, never forgotten). Every start and every
restore re-applies the whole ledger: wrapped keys, index rows, view rows and
snapshots of erased streams that a copy, a backup or a restored key database
brought back are destroyed before anything is served (``uprof.services.recovery``).

A subject erasure also records a *mark*: an HMAC of (tenant, subject reference)
under a key derived from the master secret. The subject reference is refused
(``SubjectErasedError``) while its latest record is an erasure; an operator lifts
it with ``recreate_subject``, and the new subject gets a fresh random pseudonym.
The mark is not the index hash and not a pseudonym, so neither the audit log nor
the key database can be joined to it without the master secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from domain.profile import ErasedItems
from uprof.ports import ErasureRecord, KeyMaterialStore


def _derive(master: bytes, label: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label.encode()).derive(master)


@dataclass(frozen=True)
class LedgerState:
    """The ledger folded: erased streams, erased captures per stream, refused marks."""

    streams: frozenset[str] = frozenset()
    captures: dict[str, frozenset[str]] = field(default_factory=dict)
    items: dict[str, frozenset[str]] = field(default_factory=dict)
    #: Per stream, the erased items' fingerprints (``ErasureLedger.fingerprint``).
    fingerprints: dict[str, frozenset[str]] = field(default_factory=dict)
    #: Per stream, erased items whose fingerprints no record holds (records written
    #: before records held them): a start adds them (``recovery.fingerprint_old_items``).
    unfingerprinted: dict[str, frozenset[str]] = field(default_factory=dict)
    marks: frozenset[str] = frozenset()
    #: The erased name's mark of each erased stream that has one.
    stream_marks: dict[str, str] = field(default_factory=dict)
    records: int = 0


class ErasureLedger:
    """Read and append erasure records through a ``KeyMaterialStore``."""

    def __init__(self, store: KeyMaterialStore, master_secret: bytes) -> None:
        self._store = store
        self._mark_key = _derive(master_secret, "uprof/erased-mark/1")
        self._item_key = _derive(master_secret, "uprof/erased-item/1")
        self._lock = threading.Lock()
        self._state = LedgerState()
        #: The store's record sequence ``_state`` was folded from (a store hands out a new
        #: one whenever the ledger changed, appended to or replaced).
        self._folded: object = None

    def mark(self, tenant: str, subject_ref: str) -> str:
        msg = f"{tenant}\x1f{subject_ref}".encode()
        return hmac.new(self._mark_key, msg, hashlib.sha256).hexdigest()

    def fingerprint(self, stream_id: str, capture_id: str, kind: str, identity: str) -> str:
        """A keyed hash of an erased item as one capture proposed it: (stream, capture,
        kind, identity). Without the master secret it tells nothing of the item (its
        identity is its normalised value: a few words, easy to guess, hence keyed)."""
        msg = "\x1f".join((stream_id, capture_id, kind, identity)).encode()
        return hmac.new(self._item_key, msg, hashlib.sha256).hexdigest()

    def erased_items(self, stream_id: str) -> ErasedItems | None:
        """What the update engine asks before it records a proposal for this stream
        (``SubjectProfile.apply_proposals``): whether an item erased from this stream
        had the proposal's identity and cited one of its captures. None when the ledger
        names no such item of the stream (then nothing is asked: one dictionary look-up
        per subject and batch)."""
        fingerprints = self.state().fingerprints.get(stream_id)
        if not fingerprints:
            return None

        def erased(kind: str, identity: str, evidence: tuple[str, ...]) -> bool:
            return any(
                self.fingerprint(stream_id, capture_id, kind, identity) in fingerprints
                for capture_id in evidence
            )

        return erased

    def state(self) -> LedgerState:
        """The folded ledger, refreshed from the store (other processes append too)."""
        records = self._store.erasure_records()
        with self._lock:
            if records is self._folded:
                return self._state
            streams: set[str] = set()
            captures: dict[str, set[str]] = {}
            items: dict[str, set[str]] = {}
            fingerprints: dict[str, set[str]] = {}
            fingerprinted: set[tuple[str, str]] = set()
            marks: set[str] = set()
            stream_marks: dict[str, str] = {}
            for r in records:
                if r.kind == "subject":
                    if r.stream_id:
                        streams.add(r.stream_id)
                    if r.mark:
                        marks.add(r.mark)
                        if r.stream_id:
                            stream_marks[r.stream_id] = r.mark
                elif r.kind == "captures" and r.stream_id:
                    captures.setdefault(r.stream_id, set()).update(r.capture_ids)
                elif r.kind == "items" and r.stream_id:
                    items.setdefault(r.stream_id, set()).update(r.item_ids)
                    if r.fingerprints:
                        found = set(r.fingerprints) - {NO_FINGERPRINT}
                        fingerprints.setdefault(r.stream_id, set()).update(found)
                        fingerprinted.update((r.stream_id, i) for i in r.item_ids)
                elif r.kind == "recreated" and r.mark:
                    marks.discard(r.mark)
            self._state = LedgerState(
                streams=frozenset(streams),
                captures={s: frozenset(c) for s, c in captures.items()},
                items={s: frozenset(i) for s, i in items.items()},
                fingerprints={s: frozenset(f) for s, f in fingerprints.items() if f},
                unfingerprinted=_without(items, fingerprinted),
                marks=frozenset(marks),
                stream_marks=stream_marks,
                records=len(records),
            )
            self._folded = records
            return self._state

    def is_erased(self, tenant: str, subject_ref: str) -> bool:
        return self.mark(tenant, subject_ref) in self.state().marks

    def record_subject(
        self,
        tenant: str,
        subject_ref: str | None,
        stream_id: str,
        *,
        request_id: str = "",
        draft: str = "",
        mark: str | None = None,
    ) -> None:
        """A subject erasure, before its keys go; ``draft`` (the receipt's draft) lets a
        retry after a crash finish it with its receipt (``unfinished``). ``mark``: the
        erased name's mark when the name is not known here (a record copied back)."""
        if subject_ref is not None:
            mark = self.mark(tenant, subject_ref)
        self._store.append_erasure(
            ErasureRecord(
                "subject", tenant, _now(), stream_id, mark, request_id=request_id, draft=draft
            )
        )

    def record_captures(
        self,
        tenant: str,
        stream_id: str,
        capture_ids: Iterable[str],
        *,
        request_id: str = "",
        subject_ref: str | None = None,
        draft: str = "",
    ) -> None:
        """Captured events' erasure, before their keys go. With ``subject_ref`` and
        ``draft``, a retry after a crash finishes it with its receipt; the mark here only
        finds the record, it refuses nothing."""
        self._store.append_erasure(
            ErasureRecord(
                "captures",
                tenant,
                _now(),
                stream_id,
                self.mark(tenant, subject_ref) if subject_ref is not None else None,
                capture_ids=tuple(sorted(set(capture_ids))),
                request_id=request_id,
                draft=draft,
            )
        )

    def record_items(
        self,
        tenant: str,
        stream_id: str,
        item_ids: Iterable[str],
        *,
        request_id: str,
        subject_ref: str,
        draft: str,
        fingerprints: Iterable[str] = (),
    ) -> None:
        """Items erased without their evidence, before the erasure's event is written:
        every start and restore erases them again if a copy brought them back, and
        ``draft`` lets a retry after a crash finish it with its receipt. ``fingerprints``
        (``fingerprint`` of each item and capture it cited) keep the update engine from
        recording them again from those captures under a new id."""
        self._store.append_erasure(
            ErasureRecord(
                "items",
                tenant,
                _now(),
                stream_id,
                self.mark(tenant, subject_ref),
                item_ids=tuple(sorted(set(item_ids))),
                request_id=request_id,
                draft=draft,
                fingerprints=tuple(sorted(set(fingerprints))) or (NO_FINGERPRINT,),
            )
        )

    def record_fingerprints(
        self, tenant: str, stream_id: str, item_ids: Iterable[str], fingerprints: Iterable[str]
    ) -> None:
        """Fingerprints of items an older record erased by id only (a start adds them):
        an ``items`` record with no draft (it finishes nothing) and no mark."""
        self._store.append_erasure(
            ErasureRecord(
                "items",
                tenant,
                _now(),
                stream_id,
                item_ids=tuple(sorted(set(item_ids))),
                fingerprints=tuple(sorted(set(fingerprints))) or (NO_FINGERPRINT,),
            )
        )

    def record_incomplete(
        self, tenant: str, subject_ref: str, stream_id: str, *, request_id: str, draft: str
    ) -> None:
        """An erasure answered ``erasure_incomplete``: keep what finishing it needs.

        ``draft`` is the receipt's draft as JSON; its ``scope`` and ``target`` (what the
        caller named: nothing for a subject, capture ids, a consent id or an item id) are
        how a later request finds it (``unfinished``)."""
        self._store.append_erasure(
            ErasureRecord(
                "incomplete",
                tenant,
                _now(),
                stream_id,
                self.mark(tenant, subject_ref),
                request_id=request_id,
                draft=draft,
            )
        )

    def record_receipted(self, tenant: str, request_id: str) -> None:
        """An incomplete erasure has finished and issued its receipt."""
        self._store.append_erasure(
            ErasureRecord("receipted", tenant, _now(), request_id=request_id)
        )

    def unfinished(
        self,
        tenant: str,
        subject_ref: str,
        *,
        scope: str = "subject",
        target: Sequence[str] = (),
        receipted_too: bool = False,
    ) -> ErasureRecord | None:
        """The subject's latest erasure of this scope and target that recorded a draft
        and has issued no receipt since: one that answered ``erasure_incomplete``, or one
        whose process died after its ledger record (None when there is none, or the name
        was re-created after it). Of one request, the latest record's draft wins: an
        ``incomplete`` record holds the counts known after the keys went. With
        ``receipted_too``, also one that has issued its receipt."""
        mark = self.mark(tenant, subject_ref)
        wanted = (scope, sorted(target))
        found: ErasureRecord | None = None
        for record in self._store.erasure_records():
            if record.tenant != tenant:
                continue
            if record.kind in _DRAFTED and record.draft and record.mark == mark:
                if draft_key(record.draft) == wanted:
                    found = record
            elif found is not None and (
                (
                    record.kind == "receipted"
                    and record.request_id == found.request_id
                    and not receipted_too
                )
                or (record.kind == "recreated" and record.mark == mark)
            ):
                found = None
        return found

    def records(self) -> Sequence[ErasureRecord]:
        """Every record, in ledger order."""
        return self._store.erasure_records()

    def in_flight(self, request_id: str) -> AbstractContextManager[None]:
        """Mark an erasure request in flight (``KeyMaterialStore.erasure_in_flight``)."""
        return self._store.erasure_in_flight(request_id)

    def finishing(self, request_id: str) -> AbstractContextManager[bool]:
        """The request's mark for a process finishing it (``erasure_finishing``)."""
        return self._store.erasure_finishing(request_id)

    def mark_state(self, request_id: str) -> str:
        """The request's mark, looked at only (``erasure_mark_state``)."""
        return self._store.erasure_mark_state(request_id)

    def open_requests(
        self, records: Sequence[ErasureRecord] | None = None
    ) -> dict[str, ErasureRecord]:
        """request id -> its latest record, for every erasure whose record carries a
        receipt's draft and that has issued no receipt since (``record_receipted``):
        begun and not completed, whether its process runs or died, or it answered
        ``erasure_incomplete``. Of ``records`` (default: the ledger now)."""
        found: dict[str, ErasureRecord] = {}
        for record in self._store.erasure_records() if records is None else records:
            if record.kind in _DRAFTED and record.draft and record.request_id:
                found[record.request_id] = record
            elif record.kind == "receipted":
                found.pop(record.request_id, None)
        return found

    def owner_gone(self, request_id: str) -> AbstractContextManager[bool]:
        """Whether the request's process died in flight (``erasure_owner_gone``)."""
        return self._store.erasure_owner_gone(request_id)

    def settled_mark(self) -> str | None:
        """The start's settled-up-to mark (``KeyMaterialStore.settled_mark``)."""
        return self._store.settled_mark()

    def write_settled_mark(self, text: str) -> None:
        self._store.write_settled_mark(text)

    def settle_host_turn(self) -> AbstractContextManager[None]:
        """A settle-host run's turn (``KeyMaterialStore.settle_host_turn``)."""
        return self._store.settle_host_turn()

    def mark_of_host(
        self, request_id: str, host: str, *, keep: bool = False
    ) -> AbstractContextManager[str]:
        """Another host's in-flight mark (``erasure_mark_of_host``)."""
        return self._store.erasure_mark_of_host(request_id, host, keep=keep)

    def drafts_of_stream(self, tenant: str, stream_id: str) -> list[ErasureRecord]:
        """The tenant's records of this stream that carry a receipt's draft, in ledger
        order (each written before the keys its draft cites were destroyed)."""
        return [
            r
            for r in self._store.erasure_records()
            if r.tenant == tenant and r.stream_id == stream_id and r.kind in _DRAFTED and r.draft
        ]

    def erased_stream(self, tenant: str, subject_ref: str) -> str | None:
        """The stream of the name's latest subject erasure while the name is still
        refused; None when it was never erased or was re-created since."""
        mark = self.mark(tenant, subject_ref)
        stream: str | None = None
        for record in self._store.erasure_records():
            if record.tenant != tenant or record.mark != mark:
                continue
            if record.kind == "subject":
                stream = record.stream_id
            elif record.kind == "recreated":
                stream = None
        return stream

    def record_recreated(self, tenant: str, subject_ref: str) -> None:
        self._store.append_erasure(
            ErasureRecord("recreated", tenant, _now(), mark=self.mark(tenant, subject_ref))
        )


#: What a record's fingerprints hold for items that have none (their recording event is
#: shredded: nothing can record them again), so that the record counts as fingerprinted.
NO_FINGERPRINT = "-"


def _without(
    items: dict[str, set[str]], fingerprinted: set[tuple[str, str]]
) -> dict[str, frozenset[str]]:
    left = {s: frozenset(i for i in ids if (s, i) not in fingerprinted) for s, ids in items.items()}
    return {s: ids for s, ids in left.items() if ids}


#: Record kinds that may carry a receipt's draft.
_DRAFTED = frozenset({"subject", "captures", "items", "incomplete"})


def draft_key(draft: str) -> tuple[str, list[str]]:
    """(scope, sorted target) of an incomplete erasure's draft; a draft that names no
    scope is a subject erasure's."""
    try:
        raw = json.loads(draft)
    except ValueError:
        return ("", [])
    if not isinstance(raw, dict):
        return ("", [])
    return (str(raw.get("scope", "subject")), sorted(str(x) for x in raw.get("target", [])))


def _now() -> str:
    return datetime.now(UTC).isoformat()
