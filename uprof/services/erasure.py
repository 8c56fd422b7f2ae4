"""Erasure: of a whole subject, of one captured event, or of one item — with a receipt.

The subject cascade, in order (FIELD-NOTES §3.5):
1. audit ``erasure.requested`` (pseudonymous, no content);
2. append the ``SubjectErased`` tombstone while the key still exists; the stream
   refuses every later write;
3. destroy every data key of the stream (subject DEKs and capture keys) and its
   index and alias rows; evict key caches; delete the stream's snapshot rows;
4. projections purge every derived row (views, embeddings) on the tombstone;
   slice caches are flushed;
5. wait until projections have passed the tombstone; checkpoint SQLite WALs so
   no deleted bytes linger;
6. issue the signed receipt citing tombstone position, destroyed-key commitments
   and purge counts, with an honest ``residual`` statement.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import sqlalchemy as sa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from audit.log import AuditLog
from audit.receipts import issue_erasure_receipt, new_commitment_nonce, subject_commitment
from domain.errors import (
    ErasureIncompleteError,
    ErasureRolledBackError,
    InvalidInputError,
    ItemNotFoundError,
    ReadTimeoutError,
    SubjectErasedError,
    SubjectNotFoundError,
    UprofError,
)
from domain.profile import proposal_identity
from domain.values import (
    AttributeProposal,
    ExperienceProposal,
    IntentProposal,
    MemoryProposal,
    text_problem,
)
from projections.profile import tables as t
from uprof.ports import AuditTrail, Clock, ErasureRecord, EventStore, SubjectKeyStore, ViewStore
from uprof.services import erased_keys
from uprof.services.capture_writer import CAPTURE_KEY
from uprof.services.subjects import SubjectResolver, check_subject_ref
from uprof.storage import fold_log

if TYPE_CHECKING:
    from uprof.crypto.keystore import Destruction
    from uprof.crypto.ledger import ErasureLedger

_log = logging.getLogger(__name__)

DEFAULT_BASIS = "GDPR-Art.17(1)"

#: The caller's decision (its credential and the policy), asked again: raises to refuse.
StillAllowed = Callable[[], object]


def _still_allowed(still_allowed: StillAllowed | None) -> None:
    """Ask the caller's decision again, after the request's wait (the views catching up,
    the reads settling, retries) and before its first write: erasure cannot be undone, so
    a credential revoked or a right the policy took away during that wait erases nothing
    (review of 0176, bug NI), as a read or a proposal decided after its wait (0106). A
    request finishing its own earlier erasure (``resume``) is not asked: its keys are
    already gone, and finishing only purges and issues the receipt."""
    if still_allowed is not None:
        still_allowed()


#: A ``key.destroyed`` entry is written once per request and key (with the same action and
#: subject), whichever processes finish the erasure and however often (decision 0071); a
#: late ``key.created`` once per key, found by its commitment whether an entry names it
#: alone (``dek_commitment``) or among a capture request's (``dek_commitments``, decision 0085).
KEY_ENTRY_IDENTITY: tuple[str | tuple[str, ...], ...] = (
    "request_id",
    ("dek_commitment", "dek_commitments"),
)
#: ``reason_code`` of a key's ``key.created`` entry written by its erasure: the entry of
#: its creation is not on the log (the process that made the key died before appending
#: it, or the append failed; a retry finds the subject, or the request, and writes none).
CREATED_AT_ERASURE = "recorded-at-erasure"
#: The audit actions that end an erasure request (each names its ``request_id``): one of
#: them follows every ``erasure.requested`` entry (bugs EY, GX, GY).
_OUTCOMES = ("projection.purged", "erasure.refused", "erasure.failed", "erasure.abandoned")


def subject_key_entries(
    pseudonym: str, request_id: str, keys: Sequence[tuple[int, str]]
) -> list[tuple[str, dict[str, Any]]]:
    """The entries of an erasure destroying a subject's (key_version, commitment) keys,
    to append with ``once_by=KEY_ENTRY_IDENTITY``: each key's ``key.destroyed``, after its
    ``key.created`` when the log lacks that one (the log leaves it out when it holds the
    creation's entry, which has no ``request_id`` either), so that every destruction on
    the log has its creation before it, as docs/audit-format.md tells an auditor."""
    created = [
        (
            "key.created",
            {
                "subject_ref": pseudonym,
                "reason_code": CREATED_AT_ERASURE,
                "key_version": version,
                "dek_commitment": commitment,
            },
        )
        for version, commitment in keys
    ]
    destroyed = [
        (
            "key.destroyed",
            {
                "subject_ref": pseudonym,
                "request_id": request_id,
                "key_version": version,
                "dek_commitment": commitment,
            },
        )
        for version, commitment in keys
    ]
    return [*created, *destroyed]


def capture_key_entries(
    pseudonym: str, request_id: str, commitments: Sequence[str]
) -> list[tuple[str, dict[str, Any]]]:
    """The entries of an event erasure destroying capture keys of these commitments, to
    append with ``once_by=KEY_ENTRY_IDENTITY``: each key's ``key.destroyed`` (``reason_code``
    capture-key, decision 0071), after a ``key.created`` listing that commitment alone
    (``reason_code`` recorded-at-erasure), which the log leaves out when any
    ``key.created`` of the subject lists it: the capture request's own entry (decision
    0072), or one an earlier finish of this erasure wrote (decision 0085)."""
    created = [
        (
            "key.created",
            {"subject_ref": pseudonym, "reason_code": CREATED_AT_ERASURE, "dek_commitments": [c]},
        )
        for c in commitments
    ]
    destroyed = [
        (
            "key.destroyed",
            {
                "subject_ref": pseudonym,
                "request_id": request_id,
                "reason_code": CAPTURE_KEY,
                "dek_commitment": c,
            },
        )
        for c in commitments
    ]
    return [*created, *destroyed]


#: Stated in every receipt: what a receipt cannot rule out (docs/governance.md).
RESIDUAL = {
    "backup_retention_days": 35,
    "kek_rotation_days": 90,
    "note": (
        "Event ciphertext stays in the log and in backups; it is unreadable once the keys "
        "are destroyed. Key-store backups taken before this erasure can unwrap the destroyed "
        "keys until the key-encryption key of their epoch is rotated away. PostgreSQL dead "
        "tuples and WAL may hold deleted view rows until vacuumed and recycled. A receipt "
        "proves what the operator recorded, not that no other copy exists."
    ),
}


@dataclass(frozen=True)
class HostSettled:
    """What ``uprof erase settle-host`` did: the requests it settled as abandoned, or
    the marks of that host a process holds (then it settled none)."""

    host: str
    settled: list[str]
    held: list[str]


@dataclass(frozen=True)
class ErasureResult:
    """The signed receipt, and the nonce that lets only the subject link it to themselves."""

    receipt: dict[str, Any]
    subject_nonce_hex: str
    counts: dict[str, int]


class ErasureService:
    def __init__(
        self,
        app: EventStore,
        keystore: SubjectKeyStore,
        subjects: SubjectResolver,
        queries: ViewStore,
        views: sa.Engine,
        engines: Sequence[sa.Engine],
        clock: Clock,
        audit: AuditTrail,
        log: AuditLog,
        catch_up: Callable[[int, float], bool],
        flush_caches: Callable[[UUID], None],
        tenant: str,
        ref_token: Callable[[str, str], str | None] = lambda app_id, ref: None,
    ) -> None:
        """``ref_token(app_id, source_ref)``: the keyed token an import computes for a
        record's ref (None when there is none); an erased capture's is kept in its
        subject's stream so that no import brings it back (bug IC)."""
        self._app = app
        self._keystore = keystore
        self._subjects = subjects
        self._queries = queries
        self._views = views
        self._engines = engines
        self._clock = clock
        self._audit = audit
        self._log = log
        self._catch_up = catch_up
        self._flush_caches = flush_caches
        self._tenant = tenant
        self._ref_token = ref_token
        #: (stream, ledger items of it) whose erasure the log holds: appended by this
        #: process, or found there with the views listing none of them (bugs IP, WF).
        self._items_gone: set[tuple[str, frozenset[str]]] = set()

    # ----------------------------------------------------------------- subject

    def erase_subject(
        self,
        subject_ref: str,
        *,
        basis: str = DEFAULT_BASIS,
        timeout_s: float = 30.0,
        still_allowed: StillAllowed | None = None,
    ) -> ErasureResult:
        """Erase a whole subject and return the signed receipt.

        ``still_allowed`` (the caller's decision) is asked again before the first write,
        after what the request waited for (``_still_allowed``).

        When projections have not purged the subject within ``timeout_s``, the keys are
        already destroyed and ``ErasureIncompleteError`` says so; the ledger keeps the
        receipt's draft, and asking again (from any process) waits for the purge and
        issues the receipt of that same request instead of refusing an erased name.
        """
        resumed = self.resume(subject_ref, "subject", (), timeout_s=timeout_s)
        if resumed is not None:
            return resumed
        _still_allowed(still_allowed)
        handle = self._require(subject_ref)
        stream = handle.stream_id
        request_id = str(uuid.uuid4())
        received_at = self._clock.now()
        # In flight until its outcome: a start tells a request whose process died
        # before its ledger record from a live one by this mark (bug GY), and the
        # residue audit an erasure still running from one left unfinished (bug PS).
        with self._in_flight(request_id):
            self._audit.record(
                "erasure.requested",
                subject_ref=handle.pseudonym,
                request_id=request_id,
                legal_basis=_token(basis),
                reason_code="subject",
            )
            ledger = self._keystore.ledger
            preview = None
            others: tuple[_OthersKey, ...] = ()
            # Refused before its ledger record (the subject was erased meanwhile and the log
            # holds no tombstone to cite, a restore rolled it back): the log says so (bug EY).
            with self._refusal_recorded(handle.pseudonym, request_id):
                before = self._row_counts(str(stream))
                tombstone_id = self._append_subject_tombstone(
                    stream, request_id, basis, received_at
                )
                draft = _Draft(
                    request_id=request_id,
                    received_at=received_at.isoformat(),
                    basis=basis,
                    scope="subject",
                    target=[],
                    pseudonym=handle.pseudonym,
                    stream=str(stream),
                    tombstone_id=tombstone_id,
                    actions=[],
                    counts={},
                )
                if tombstone_id == 0:
                    # The stream already ends with a tombstone: another request's, running
                    # now, or one killed after appending it. This request finishes on it
                    # and its receipt says whose it is.
                    draft = self._at_subject_tombstone(draft)
                # The ledger record comes before the keys go: a crash in between is finished
                # by the next start, and no copy or restore can bring the keys back (decision
                # 0012). It carries the receipt's draft, so that a retry after such a crash
                # still gets the receipt (decision 0052).
                if ledger is not None:
                    preview = self._keystore.destruction_preview(str(stream))
                    # Keys gone before this preview were destroyed after another request's
                    # ledger record named them (records come first): cite that record (bug EW).
                    others = self._destroyed_by_others(draft, preview)
                    drafted = _subject_drafted(
                        draft, preview, before, snapshots=None, others=others
                    )
                    ledger.record_subject(
                        self._tenant,
                        check_subject_ref(subject_ref),
                        str(stream),
                        request_id=request_id,
                        draft=drafted.to_json(),
                    )
            # Its mirror in the data stores: a key folder put back from an older copy does
            # not undo the erasure either (uprof.services.erased_keys).
            erased_keys.record(
                self._views,
                str(stream),
                now=self._clock.now(),
                mark=ledger.mark(self._tenant, check_subject_ref(subject_ref)) if ledger else None,
            )
            destroyed = self._keystore.destroy(
                str(stream), now=self._clock.now(), request_id=request_id
            )
            destruction = destroyed
            if preview is not None:
                # A key this preview found and this destroy did not was destroyed meanwhile:
                # by another request of the subject whose ledger record names it (absorbed
                # on this tombstone, it previewed the key before it went, bug GH), cited as
                # that request's; else by a retry finishing this erasure from its ledger
                # record, cited as this erasure's own, whichever process did it.
                others = self._destroyed_by_others(draft, destroyed)
                named = {key.key_version for key in others}
                destruction = _destroyed_either(
                    replace(
                        preview, deks=tuple(k for k in preview.deks if k.key_version not in named)
                    ),
                    destroyed,
                )
            self._audit.record_many(
                subject_key_entries(
                    handle.pseudonym,
                    request_id,
                    [(key.key_version, key.dek_commitment) for key in destruction.deks],
                )
                + _others_key_entries(handle.pseudonym, others),
                once_by=KEY_ENTRY_IDENTITY,
            )
            snapshots = self._app.drop_snapshots(stream)
            self._flush_caches(stream)
            draft = _subject_drafted(draft, destruction, before, snapshots=snapshots, others=others)
            return self._finish(subject_ref, draft, timeout_s, resumed=False)

    # ---------------------------------------------------------------- captures

    def erase_capture(
        self,
        subject_ref: str,
        capture_id: str,
        *,
        basis: str = DEFAULT_BASIS,
        timeout_s: float = 30.0,
        still_allowed: StillAllowed | None = None,
    ) -> ErasureResult:
        """Erase one captured event and every item derived only from it."""
        return self.erase_captures(
            subject_ref,
            [capture_id],
            scope="capture",
            basis=basis,
            timeout_s=timeout_s,
            still_allowed=still_allowed,
        )

    def erase_captures(
        self,
        subject_ref: str,
        capture_ids: Sequence[str],
        *,
        scope: str,
        target: Sequence[str] | None = None,
        basis: str = DEFAULT_BASIS,
        timeout_s: float = 30.0,
        still_allowed: StillAllowed | None = None,
    ) -> ErasureResult:
        """Erase captured events of one subject, each with what derives only from it.

        Each capture's key is destroyed, which shreds the event and every item
        sealed under it; attributes that other evidence backs are restated first.
        ``target`` is what the caller named (the capture ids unless given: a consent
        id, an item id); asking again with the same scope and target finishes an
        erasure that answered ``erasure_incomplete``.
        """
        ids = sorted(set(capture_ids))
        named = sorted(set(target if target is not None else ids))
        # Asked again after it answered incomplete, or after its process died past its
        # ledger record: finished, even when a subject erasure has erased the subject
        # since (it cites that erasure's destruction, bug GZ), as a subject erasure is.
        resumed = self.resume(subject_ref, scope, named, timeout_s=timeout_s)
        if resumed is not None:
            return resumed
        handle = self._require(subject_ref)
        stream = handle.stream_id
        self._require_views_current(timeout_s)
        _still_allowed(still_allowed)
        rows = self._queries.captures(ids)
        # A capture the views dropped whose key this stream still holds: an earlier request
        # appended its ``CaptureErased`` and failed before its ledger record (bug HX). The
        # key is the stream's own (keyed by stream and capture), so erase it again.
        foreign = [
            c
            for c in ids
            if (c in rows and rows[c].stream_id != str(stream))
            or (c not in rows and self._keystore.capture_key_commitment(str(stream), c) is None)
        ]
        if foreign:
            raise InvalidInputError(
                f"no captured event {foreign[0]!r} for this subject", field="capture_id"
            )
        request_id = str(uuid.uuid4())
        received_at = self._clock.now()
        # In flight until its outcome: a start tells a request whose process died
        # before its ledger record from a live one by this mark (bug GY), and the
        # residue audit an erasure still running from one left unfinished (bug PS).
        with self._in_flight(request_id):
            self._audit.record(
                "erasure.requested",
                subject_ref=handle.pseudonym,
                request_id=request_id,
                legal_basis=_token(basis),
                reason_code=scope,
                event_ids=ids[:1000],
            )

            def command() -> tuple[int, dict[str, int]]:
                profile = self._app.load(stream)
                totals = {"items_erased": 0, "attributes_restated": 0}
                for capture_id in ids:
                    outcome = profile.erase_capture(
                        capture_id,
                        cited_by=cited[capture_id],
                        now=received_at,
                        ref_token=refs[capture_id],
                    )
                    for name, n in outcome.items():
                        totals[name] += n
                return self._app.save(profile)[-1].notification.id, totals

            # Refused before anything is written (the subject erased meanwhile by another
            # request): the log says so (bug EY). Anything else failing up to the ledger
            # record, the key preview and the record included, ends it ``erasure.failed``
            # (bugs GX, HX).
            with self._refusal_recorded(handle.pseudonym, request_id):
                cited = {c: self._items_citing(str(stream), c) for c in ids}
                # Read while the capture's key still opens its ref (the view row goes
                # with it). A capture the views dropped (bug HX) had its token noted by
                # the request that appended its ``CaptureErased``.
                refs = {
                    c: self._ref_token(row.app_id, row.source_ref)
                    if (row := rows.get(c)) is not None and row.source_ref
                    else None
                    for c in ids
                }
                tombstone_id, totals = self._app.with_retry(command)
                draft = _Draft(
                    request_id=request_id,
                    received_at=received_at.isoformat(),
                    basis=basis,
                    scope=scope,
                    target=named,
                    pseudonym=handle.pseudonym,
                    stream=str(stream),
                    tombstone_id=tombstone_id,
                    actions=[],
                    counts={},
                    captures=ids,
                    sealed_refs=[
                        self._seal_ref(str(stream), request_id, token)
                        for token in sorted({r for r in refs.values() if r})
                    ],
                )
                previews: list[str | None] = [None] * len(ids)
                if self._keystore.ledger is not None:
                    previews = [
                        self._keystore.capture_key_commitment(str(stream), cid) for cid in ids
                    ]
                    self._keystore.ledger.record_captures(
                        self._tenant,
                        str(stream),
                        ids,
                        request_id=request_id,
                        subject_ref=check_subject_ref(subject_ref),
                        draft=_captures_drafted(
                            draft, [c for c in previews if c], totals, snapshots=None
                        ).to_json(),
                    )
            erased_keys.record(self._views, str(stream), ids, now=self._clock.now())
            destroyed = {
                cid: self._keystore.destroy_capture_key(str(stream), cid, request_id=request_id)
                for cid in ids
            }
            # A capture key already gone: a subject erasure of the same subject at once
            # destroyed it with the subject's keys (bug GI, before this request's preview; bug
            # GZ, after it). Cite that destruction as that request's, as a subject erasure
            # does; a key a retry of this request destroyed is its own (the commitment its
            # ledger record names).
            commitments, others, by_others = self._capture_citations(
                draft,
                [destroyed[cid] or preview for cid, preview in zip(ids, previews, strict=True)],
            )
            # As a subject key's: the entry names the commitment its ``key.created`` recorded
            # (written now if a crash kept that one off the log).
            self._audit.record_many(
                capture_key_entries(handle.pseudonym, request_id, commitments)
                + _others_key_entries(handle.pseudonym, others)
                + _others_capture_entries(handle.pseudonym, by_others),
                once_by=KEY_ENTRY_IDENTITY,
            )
            # Snapshots may hold the shredded items' values: they are caches, drop them.
            snapshots = self._app.drop_snapshots(stream)
            self._flush_caches(stream)
            draft = _captures_drafted(
                draft, commitments, totals, snapshots=snapshots, others=others, by_others=by_others
            )
            return self._finish(subject_ref, draft, timeout_s, resumed=False)

    # -------------------------------------------------------------------- item

    def erase_item(
        self,
        subject_ref: str,
        item_id: str,
        *,
        with_evidence: bool = False,
        basis: str = DEFAULT_BASIS,
        timeout_s: float = 30.0,
        still_allowed: StillAllowed | None = None,
    ) -> ErasureResult:
        """Erase one item; with_evidence also erases (and shreds) the events it came from.
        ``still_allowed``: as ``erase_subject``'s, after the views' wait."""
        handle = self._require(subject_ref)
        stream = handle.stream_id
        if with_evidence:
            resumed = self.resume(subject_ref, "item-with-evidence", [item_id], timeout_s=timeout_s)
            if resumed is not None:
                return resumed
            if self._unfinished(subject_ref, "item", [item_id]) is not None:
                # A plain erasure of this item answered incomplete, and this request asks
                # for its evidence too. The views list the item until they pass the plain
                # tombstone, so its evidence is read now, before catching up; finishing
                # the plain one instead would stop there and leave the evidence unnamed.
                # The plain draft stays for a plain request.
                listed = list(self._evidence_of(str(stream), item_id) or ())
                if listed and self._queries.captures(listed):
                    self._require_views_current(timeout_s)
                    present = list(self._queries.captures(listed))
                    if present:
                        return self.erase_captures(
                            subject_ref,
                            present,
                            scope="item-with-evidence",
                            target=[item_id],
                            basis=basis,
                            timeout_s=timeout_s,
                            still_allowed=still_allowed,
                        )
        resumed = self.resume(subject_ref, "item", [item_id], timeout_s=timeout_s)
        if resumed is not None:
            return resumed
        self._require_views_current(timeout_s)
        _still_allowed(still_allowed)
        evidence = self._evidence_of(str(stream), item_id)
        if evidence is None:
            raise ItemNotFoundError(item_id)
        if with_evidence and evidence:
            present = list(self._queries.captures(evidence))
            if present:
                result = self.erase_captures(
                    subject_ref,
                    present,
                    scope="item-with-evidence",
                    target=[item_id],
                    basis=basis,
                    timeout_s=timeout_s,
                    still_allowed=still_allowed,
                )
                if self._evidence_of(str(stream), item_id) is None:
                    return result
        request_id = str(uuid.uuid4())
        received_at = self._clock.now()
        draft = _Draft(
            request_id=request_id,
            received_at=received_at.isoformat(),
            basis=basis,
            scope="item",
            target=[item_id],
            pseudonym=handle.pseudonym,
            stream=str(stream),
            tombstone_id=0,  # not written yet: a retry after a crash writes it (again)
            actions=[
                {"type": "tombstone_appended", "stream": str(stream), "notification_id": 0},
                {"type": "projection_purged", "name": "profile", "tracking_position": 0, "rows": 1},
                {"type": "cache_invalidated", "caches": ["slice-index"]},
            ],
            counts={"items_erased": 1},
            items=[item_id],
        )
        # In the ledger before the event: every start and restore erases the item again if
        # a copy brings it back, and a retry after a crash finishes this request. Its
        # fingerprints keep the update engine from recording it again, under a new id,
        # from the captures it came from (a re-extraction after a restore of data older
        # than its extraction; an app proposing it again).
        # In flight until its outcome, as a subject's (bug PS).
        with self._in_flight(request_id):
            ledger = self._keystore.ledger
            if ledger is not None:
                ledger.record_items(
                    self._tenant,
                    str(stream),
                    [item_id],
                    request_id=request_id,
                    subject_ref=check_subject_ref(subject_ref),
                    draft=draft.to_json(),
                    fingerprints=self._fingerprints(stream, item_id, ledger),
                )

            def command() -> int:
                profile = self._app.load(stream)
                profile.erase_items([item_id], reason="user-request")
                return self._app.save(profile)[-1].notification.id

            draft = _moved_to(draft, self._app.with_retry(command))
            self._flush_caches(stream)
            return self._finish(subject_ref, draft, timeout_s, resumed=False)

    # ------------------------------------------------------- finishing, resuming

    def resume(
        self,
        subject_ref: str,
        scope: str,
        target: Sequence[str],
        *,
        timeout_s: float = 30.0,
        finished_too: bool = False,
    ) -> ErasureResult | None:
        """Finish this subject's erasure of ``scope`` and ``target`` that answered
        ``erasure_incomplete`` (any process), issuing the receipt of that same request;
        None when there is none. With ``finished_too``, also one that finished: its
        receipt is issued again (a retry of a request whose answer was lost)."""
        draft = self._unfinished(subject_ref, scope, target, finished_too=finished_too)
        if draft is None:
            return None
        with self._finishing(draft.request_id):
            return self._finish(subject_ref, draft, timeout_s, resumed=True)

    def unfinished(self, subject_ref: str, scope: str, target: Sequence[str]) -> bool:
        """Whether this subject's erasure of ``scope`` and ``target`` answered
        ``erasure_incomplete`` and is not finished yet (what ``resume`` would finish)."""
        return self._unfinished(subject_ref, scope, target) is not None

    def _unfinished(
        self, subject_ref: str, scope: str, target: Sequence[str], *, finished_too: bool = False
    ) -> _Draft | None:
        """The draft of this subject's unfinished erasure of ``scope`` and ``target``
        (with ``finished_too``, its latest erasure of them, finished or not)."""
        ledger = self._keystore.ledger
        if ledger is None:
            return None
        ref = check_subject_ref(subject_ref)
        record = ledger.unfinished(
            self._tenant, ref, scope=scope, target=target, receipted_too=finished_too
        )
        if record is None:
            return None
        draft = _Draft.from_json(record.draft)
        # Only an erasure of the incarnation the name stands for now. An operator may
        # re-create the name while an erasure waits; its ``incomplete`` record then comes
        # after ``recreated``, and must not answer for (and leave) the new subject.
        if scope == "subject":
            current = ledger.erased_stream(self._tenant, ref)
        else:
            # A subject erasure may have erased the subject since: the erasure is then
            # finished on the erased stream, citing that erasure's destruction (bug GZ).
            try:
                handle = self._subjects.find(subject_ref)
            except SubjectErasedError:
                handle = None
            current = (
                str(handle.stream_id)
                if handle is not None
                else ledger.erased_stream(self._tenant, ref)
            )
        return draft if current == draft.stream else None

    def _finish(
        self, subject_ref: str, draft: _Draft, timeout_s: float, *, resumed: bool
    ) -> ErasureResult:
        """Confirm the purge of a written erasure, then settle and sign its receipt.

        Not purged within ``timeout_s``: the ledger keeps the draft (the first time) and
        ``ErasureIncompleteError`` asks the caller to ask again.
        """
        rewritten = False
        if resumed:
            draft = self._reapply(draft)
            if draft.scope == "subject":
                draft = self._at_subject_tombstone(draft)
            elif not self._tombstone_in_log(draft):
                # A restore rolled the log back below the tombstone: write it again, so
                # the receipt cites a tombstone the log holds (the keys stay destroyed),
                # and keep the new draft in case this one does not finish either.
                draft = self._append_tombstone_again(draft)
                rewritten = True
        caught_up = self._catch_up(draft.tombstone_id, timeout_s)
        left = self._left_after(draft) if caught_up else "projections behind"
        if left and caught_up and draft.captures:
            # Items that cite an erased capture but were not in the views when the
            # erasure began (extracted meanwhile): erase them now, then look again.
            strays = self._citing(draft.stream, draft.captures)
            if strays:
                position = self._erase_strays(draft, strays)
                counts = dict(draft.counts)
                counts["items_erased"] = counts.get("items_erased", 0) + len(strays)
                draft = replace(draft, counts=counts)
                caught_up = self._catch_up(position, timeout_s)
                left = self._left_after(draft) if caught_up else "projections behind"
        if not left:
            # Not done while a WAL still holds what the erasure deleted (the key store's
            # holds the wrapped keys, beside the KEK): fold every store's WAL first.
            left = self._unfolded()
        ledger = self._keystore.ledger
        if left:
            if ledger is not None and (not resumed or rewritten):
                ledger.record_incomplete(
                    self._tenant,
                    check_subject_ref(subject_ref),
                    draft.stream,
                    request_id=draft.request_id,
                    draft=draft.to_json(),
                )
            written = (
                "the keys are destroyed"
                if draft.scope != "item"
                else "the item's erasure is recorded"
            )
            raise ErasureIncompleteError(
                f"erasure did not complete ({left}); "
                f"{written}. Ask again to finish it and receive its receipt"
            )
        purged: dict[str, Any] = (
            {"item_refs": draft.items} if draft.scope == "item" else {"counts": draft.counts}
        )
        self._settle(draft.pseudonym, draft.request_id, draft.tombstone_id, **purged)
        result = self._receipt(
            subject_ref,
            draft.request_id,
            datetime.fromisoformat(draft.received_at),
            draft.basis,
            draft.scope,
            draft.actions,
            dict(draft.counts),
        )
        if ledger is not None:
            # Every erasure's draft is in the ledger (written with its record): close it.
            ledger.record_receipted(self._tenant, draft.request_id)
        return result

    def _reapply(self, draft: _Draft) -> _Draft:
        """Destroy again what the erasure destroys, before finishing it from its draft.

        The process that began it may have died between its ledger record and the key
        destruction; the next start re-applies the ledger, but a process that was already
        running when it died has not, and the receipt must not cite keys that still
        exist. Destroying is idempotent. Returns the draft citing who destroyed the
        capture keys (``_recited``)."""
        stream = UUID(draft.stream)
        if draft.scope == "subject":
            self._keystore.destroy(draft.stream, now=self._clock.now(), request_id=draft.request_id)
        for capture_id in draft.captures:
            self._keystore.destroy_capture_key(
                draft.stream, capture_id, request_id=draft.request_id
            )
        draft = self._recited(draft)
        self._record_keys_destroyed(draft)
        if draft.scope != "item":
            self._app.drop_snapshots(stream)
        self._flush_caches(stream)
        return draft

    def _capture_citations(
        self, draft: _Draft, own: Sequence[str | None]
    ) -> tuple[list[str], tuple[_OthersKey, ...], tuple[tuple[str, str], ...]]:
        """An event erasure's capture-key commitments (``own``: per capture of the draft,
        the key it destroyed or previewed, None when it found none) less those a subject
        erasure's destroy deleted, and that erasure's subject keys to cite instead.

        The key store says which request's destroy deleted each capture key (recorded in
        that DELETE's transaction, bug GZ). A key with no such row (deleted by a start
        re-applying the ledger, or before the key store kept this) stays this request's
        when it previewed it. A capture key another event erasure's destroy deleted (two
        of the same capture at once) is cited as that request's: (request, commitment),
        the third value (bug HZ)."""
        gone = [cid for cid, c in zip(draft.captures, own, strict=True) if c is None]
        by = self._keystore.capture_keys_destroyed_by(draft.stream, draft.captures)
        foreign = {
            cid: request
            for cid, (request, _) in by.items()
            if request is not None and request != draft.request_id
        }
        if not gone and not foreign:
            return [c for c in own if c], (), ()
        others = self._destroyed_by_others(draft, self._keystore.destruction_preview(draft.stream))
        destroyers = {key.by_request for key in others}
        by_others = tuple(
            sorted(
                (request, by[cid][1])
                for cid, request in foreign.items()
                if request not in destroyers
            )
        )
        kept = [c for cid, c in zip(draft.captures, own, strict=True) if c and cid not in foreign]
        cited = len(kept) + len(by_others)
        return kept, (others if cited < len(draft.captures) else ()), by_others

    def _recited(self, draft: _Draft) -> _Draft:
        """A resumed event erasure's draft citing what the key store says now: its draft
        was written before its capture keys went, and a subject erasure of the subject
        may have destroyed them since (bug GZ)."""
        if not draft.captures:
            return draft
        own = [
            str(a["dek_commitment"])
            for a in draft.actions
            if a.get("type") == "dek_destroyed"
            and a.get("key_kind") == "capture"
            and "by_request" not in a
        ]
        had_by_others = sorted(
            (str(a["by_request"]), str(a["dek_commitment"]))
            for a in draft.actions
            if a.get("type") == "dek_destroyed"
            and a.get("key_kind") == "capture"
            and "by_request" in a
        )
        foreign = {
            commitment: request
            for request, commitment in self._keystore.capture_keys_destroyed_by(
                draft.stream, draft.captures
            ).values()
            if request is not None and request != draft.request_id
        }
        if not foreign and len(own) == len(draft.captures):
            return draft
        others = self._destroyed_by_others(draft, self._keystore.destruction_preview(draft.stream))
        destroyers = {key.by_request for key in others}
        # Another event erasure's destroy deleted it (bug HZ): that request's.
        by_others = sorted(
            {(foreign[c], c) for c in own if c in foreign and foreign[c] not in destroyers}
            | set(had_by_others)
        )
        kept = [c for c in own if c not in foreign]
        if len(kept) + len(by_others) >= len(draft.captures):
            others = ()
        had = [
            (a.get("by_request"), a.get("key_version"), a.get("dek_commitment"))
            for a in draft.actions
            if a.get("type") == "dek_destroyed" and a.get("key_kind") != "capture"
        ]
        if (
            kept == own
            and by_others == had_by_others
            and had == [(k.by_request, k.key_version, k.dek_commitment) for k in others]
        ):
            return draft
        totals = {
            k: v
            for k, v in draft.counts.items()
            if k
            not in (
                "captures",
                "capture_keys",
                "deks_by_other_requests",
                "capture_keys_by_other_requests",
            )
        }
        return _captures_drafted(
            draft, kept, totals, snapshots=None, others=others, by_others=tuple(by_others)
        )

    def _record_keys_destroyed(self, draft: _Draft) -> None:
        """The ``key.destroyed`` entries of a finished erasure, as the uninterrupted path
        writes them, for the keys its draft cites: a subject's data keys (``key_version``)
        and capture keys (``reason_code`` capture-key, decision 0071).

        A start may have destroyed the keys already (the ledger), and an earlier finish, the
        process that died or one finishing the same erasure at this moment may have
        written some: the log, under its write lock, leaves out those it holds, so one
        entry per key however many processes finish it at once."""
        captures: list[str] = []
        by_others: list[tuple[str, str]] = []
        subject_keys: list[tuple[int, str]] = []
        others: list[_OthersKey] = []
        for action in draft.actions:
            if action.get("type") != "dek_destroyed":
                continue
            if action.get("key_kind") == "capture" and "by_request" in action:
                by_others.append((str(action["by_request"]), str(action["dek_commitment"])))
            elif action.get("key_kind") == "capture":
                captures.append(str(action["dek_commitment"]))
            elif "by_request" in action:  # another request's: under its id (bug EW)
                others.append(
                    _OthersKey(
                        str(action["by_request"]),
                        int(action["key_version"]),
                        str(action["dek_commitment"]),
                    )
                )
            else:
                subject_keys.append((int(action["key_version"]), str(action["dek_commitment"])))
        entries = subject_key_entries(draft.pseudonym, draft.request_id, subject_keys)
        entries += _others_key_entries(draft.pseudonym, others)
        entries += capture_key_entries(draft.pseudonym, draft.request_id, captures)
        entries += _others_capture_entries(draft.pseudonym, by_others)
        self._audit.record_many(entries, once_by=KEY_ENTRY_IDENTITY)

    def _left_after(self, draft: _Draft) -> str:
        """What the views still hold that the erasure removes ("" when purged)."""
        if draft.scope == "subject":
            after = self._row_counts(draft.stream)
            return ", ".join(f"rows left in {name}: {n}" for name, n in sorted(after.items()) if n)
        if draft.captures:
            kept = [
                c
                for c, row in self._queries.captures(draft.captures).items()
                if row.stream_id == draft.stream
            ]
            citing = self._citing(draft.stream, draft.captures)
            parts = [f"{len(kept)} captured events"] if kept else []
            parts += [f"{len(citing)} items citing them"] if citing else []
            return ", ".join(parts)
        present = [i for i in draft.items if self._evidence_of(draft.stream, i) is not None]
        return f"{len(present)} items still listed" if present else ""

    def _tombstone_in_log(self, draft: _Draft) -> bool:
        """Whether the log still holds the draft's tombstone (a restore of a backup taken
        before it rolls it back, and the position is then another event, or none)."""
        found = self._app.notifications_after(draft.tombstone_id - 1, 1)
        if not found or found[0].id != draft.tombstone_id:
            return False
        kind = "CaptureErased" if draft.captures else "ItemsErased"
        return str(found[0].originator_id) == draft.stream and found[0].topic.endswith(f".{kind}")

    def _at_subject_tombstone(self, draft: _Draft) -> _Draft:
        """The subject draft, citing the log position of the stream's ``SubjectErased``.

        A tombstone is the stream's last event (it refuses every later write). An erasure
        asked again after one killed past its tombstone drafted the log head instead, and
        now cites the tombstone itself. A restore of a backup taken before the tombstone
        removed it: the keys are gone, so it cannot be written again, and a receipt must
        not cite whatever event now holds that position. A tombstone another request
        appended is cited with that request's id (``by_request``).
        """
        found = self._last_tombstone(UUID(draft.stream))
        if found is None:
            raise ErasureRolledBackError(
                "a restore of a backup taken before this erasure removed its tombstone "
                "from the log; the subject's keys stay destroyed and the restore purged "
                "its rows, but no receipt can cite the tombstone"
            )
        position, by = found
        moved = _moved_to(draft, position)
        if by == draft.request_id or moved.tombstone_by == by:
            return moved
        # Another request's tombstone: the receipt says whose (bug EW).
        actions = [
            dict(a, by_request=by) if a.get("type") == "tombstone_appended" else a
            for a in moved.actions
        ]
        return replace(moved, tombstone_by=by, actions=actions)

    def _append_tombstone_again(self, draft: _Draft) -> _Draft:
        """Append the erasure's events again for what the draft names; the receipt's
        positions move to the new tombstone."""
        stream = UUID(draft.stream)
        now = self._clock.now()

        tokens = self._unsealed_refs(draft)

        def command() -> int:
            profile = self._app.load(stream)
            if draft.captures:
                # The refs' tokens too (bug IO): the restore rolled them back with the
                # tombstone, and the view rows that named the refs are gone.
                for capture_id in draft.captures:
                    profile.erase_capture(capture_id, cited_by=[], now=now)
                profile.note_erased_refs(tokens)
            else:
                profile.erase_items(list(draft.items), reason="user-request")
            return self._app.save(profile)[-1].notification.id

        position = self._app.with_retry(command)
        self._flush_caches(stream)
        return _moved_to(draft, position)

    def erase_recorded_items(self, stream_id: UUID) -> int:
        """Erase the items the ledger names for this stream that the views still list,
        or that the log holds no erasure of; returns how many. Asked before a read of the
        subject is served (bug IP).

        An item erasure records itself in the ledger before it appends its
        ``ItemsErased`` (so that a restore or a retry finishes it); a request killed
        between the two left the item listed, and served by every process already
        running, until a start re-applied the ledger or someone asked again. No key
        guards an item, so the reader appends the event itself (``erasure-reapplied``,
        as a start does); an erasure still running appends its own too, which removes
        nothing more. Costs one dictionary look-up per read when the ledger names no item
        of the stream, and one pass over its views (and a read of its stream when they list
        none of the items) once per ledger state otherwise."""
        ledger = self._keystore.ledger
        if ledger is None:
            return 0
        state = ledger.state()
        wanted = state.items.get(str(stream_id))
        if not wanted or str(stream_id) in state.streams:
            return 0
        if (str(stream_id), wanted) in self._items_gone:
            return 0  # this process appended their erasure, or found them gone
        stream = str(stream_id)
        listed = {a.item_id for a in self._queries.attributes(stream)}
        listed |= {i.item_id for i in self._queries.intents(stream)}
        listed |= {m.item_id for m in self._queries.memories(stream, include_archived=True)[0]}
        doomed = sorted(wanted & listed)
        if not doomed:
            # Not listed is gone for good only once the log holds their erasure: every
            # replay then purges them again. Views behind the log do not list what they
            # have not reached yet: halfway through another process's rebuild (reset,
            # replaying), or left empty by one killed -9. Remembered as gone then, the
            # items came back with the replay and this process served them on every read
            # (bug WF); erasing nothing, the read caught the views up after this look and
            # served them once, as did an export or a slice (bug WY). The log decides:
            # what it holds no erasure of is erased now (ids the log never held cost one
            # event naming them, once).
            doomed = sorted(wanted - self._app.erased_item_ids(stream_id))
            if not doomed:
                self._items_gone.add((stream, wanted))
                return 0
        try:
            self.reapply_items(stream_id, doomed)
        except SubjectErasedError:
            return 0
        # Appended once by this process: the views drop them as they pass the event.
        self._items_gone.add((stream, wanted))
        return len(doomed)

    def reapply_items(self, stream_id: UUID, item_ids: Iterable[str]) -> None:
        """Erase again items the ledger names and the views still list, audited: the one
        way a read (``erase_recorded_items``) or a start (``recovery.reapply_ledger``)
        re-applies an item erasure.

        The views change here, so the log records it (bug KZ): one
        ``erasure.items_reapplied`` entry per ledger request whose items this erases
        (``request_id``, ``item_refs``; ids only), appended with ``once_by`` under the
        log's write lock, so processes re-applying the same items at once write one entry.
        It is written before the event, as the ledger record is: a process killed between
        the two leaves the items listed, and the next reader's entry is the same one (left
        out), never an erasure with no entry. The price: an entry whose event a subject
        erasure made moot (SubjectErasedError, raised to the caller) stays on the log."""
        stream = str(stream_id)
        doomed = sorted(set(item_ids))
        ledger = self._keystore.ledger
        if ledger is not None:
            self._audit.record_many(
                _reapplied_entries(ledger.records(), stream, doomed),
                once_by=("request_id", "item_refs"),
            )

        def command() -> None:
            profile = self._app.load(stream_id)
            profile.erase_items(doomed, reason=REAPPLIED_REASON)
            self._app.save(profile)

        self._app.with_retry(command)
        self._flush_caches(stream_id)

    def note_erased_refs(self, stream_ids: Sequence[str]) -> int:
        """Note again in each live stream the erased captures' ref tokens its ledger
        drafts hold and the stream lacks (a restore of data older than the erasure rolled
        its ``ErasedRefsNoted`` back, bug IO); returns how many tokens. Run by the start
        that finds erased captures still projected (``recovery.reapply_ledger``)."""
        ledger = self._keystore.ledger
        if ledger is None:
            return 0
        noted = 0
        for stream_id in sorted(set(stream_ids)):
            tokens = sorted(
                {
                    token
                    for record in ledger.drafts_of_stream(self._tenant, stream_id)
                    for token in self._unsealed_refs(_Draft.from_json(record.draft))
                }
            )
            if not tokens:
                continue
            stream = UUID(stream_id)

            def command(stream: UUID = stream, tokens: list[str] = tokens) -> int:
                profile = self._app.load(stream)
                missing = [t for t in tokens if not profile.ref_erased(t)]
                if missing:
                    profile.note_erased_refs(missing)
                    self._app.save(profile)
                return len(missing)

            try:
                noted += self._app.with_retry(command)
            except SubjectErasedError:
                continue  # erased since: the subject's key, and so the tokens, are gone
            self._flush_caches(stream)
        return noted

    def _seal_ref(self, stream_id: str, request_id: str, token: str) -> str:
        """``token`` sealed under the subject's current data key, bound to the stream and
        the request (AES-GCM, AAD): ``<key version>:<base64 nonce|ciphertext>``."""
        version, key = self._keystore.current_key(stream_id)
        nonce = os.urandom(12)
        sealed = AESGCM(key).encrypt(nonce, token.encode(), _ref_aad(stream_id, request_id))
        return f"{version}:{base64.b64encode(nonce + sealed).decode()}"

    def _unsealed_refs(self, draft: _Draft) -> list[str]:
        """The draft's ref tokens that the subject's keys still open (none once erased)."""
        tokens = []
        for sealed in draft.sealed_refs:
            version, _, body = sealed.partition(":")
            key = self._keystore.key(draft.stream, int(version))
            if key is None:
                continue
            raw = base64.b64decode(body)
            aad = _ref_aad(draft.stream, draft.request_id)
            tokens.append(AESGCM(key).decrypt(raw[:12], raw[12:], aad).decode())
        return tokens

    def _erase_strays(self, draft: _Draft, item_ids: list[str]) -> int:
        stream = UUID(draft.stream)

        def command() -> int:
            profile = self._app.load(stream)
            profile.erase_items(item_ids, reason="evidence-erased")
            return self._app.save(profile)[-1].notification.id

        position = self._app.with_retry(command)
        self._flush_caches(stream)
        return position

    def _require_views_current(self, timeout_s: float) -> None:
        """Fail closed before writing anything: stale views would name the wrong items."""
        head = self._app.max_notification_id()
        if not self._catch_up(head, timeout_s):
            raise ReadTimeoutError(
                f"the views did not catch up with the log within {timeout_s:g} s; "
                "nothing was erased, ask again"
            )

    def _append_subject_tombstone(
        self, stream: UUID, request_id: str, basis: str, received_at: datetime
    ) -> int:
        """Append the subject's tombstone; its log position, or 0 when the stream already
        ends with one (another request's, or this name's erasure killed after it).

        A stream shredded since this request found the subject live (another request of
        the same subject destroyed the keys meanwhile) ends with that request's tombstone:
        0 too, and this request finishes on it (bug EY). Shredded without one (a restore
        rolled it back): refused, as an erased subject is."""

        def tombstone() -> int:
            # Read no ciphertext: a damaged event must not make a subject unerasable
            # (bug BX).
            return self._app.append_subject_tombstone(
                stream, request_id=request_id, basis=basis, now=received_at
            )

        try:
            return self._app.with_retry(tombstone)
        except SubjectErasedError:
            if self._last_tombstone(stream) is None:
                raise
            return 0

    def _last_tombstone(self, stream: UUID) -> tuple[int, str] | None:
        """(log position, request id) of the stream's ``SubjectErased``, None when the
        stream does not end with one. Tombstones are stored in plaintext: readable after
        the keys are gone."""
        events = self._app.stream_events(stream)
        last = events[-1] if events else None
        if last is None or type(last).__name__ != "SubjectErased":
            return None
        (position,) = self._app.notification_ids(stream, [last.originator_version])
        return position, str(last.request_id)

    def _destroyed_by_others(self, draft: _Draft, preview: Destruction) -> tuple[_OthersKey, ...]:
        """The subject keys another request destroyed that ``preview`` (taken before this
        call) no longer finds, each with that request.

        The key store says exactly which request's ``destroy`` deleted a key: it records
        it in that DELETE's transaction (``destroyed_by``), so the answer does not depend
        on what the audit log holds yet, nor on whether that request's process is still
        alive (bug GW). A key destroyed by this same request (a retry of it, or a start
        re-applying its record under its id) is its own, not another's.

        Keys the store has no such row for (destroyed before the key store kept them, or
        by a process still running older code) fall back to the ledger: every subject
        erasure records its draft, naming the keys it will destroy, before it destroys
        them, so a key missing from a preview was destroyed after a record this reads.
        Only keys a request recorded as its own are cited (never one it cited from a
        third)."""
        own = {key.key_version for key in preview.deks}
        exact: dict[int, _OthersKey] = {}
        mine: set[int] = set()
        for version, (by, commitment) in self._keystore.destroyed_by(draft.stream).items():
            if version in own or by is None:
                continue
            if by == draft.request_id:
                mine.add(version)
            else:
                exact[version] = _OthersKey(by, version, commitment)
        ledger = self._keystore.ledger
        if ledger is None:
            return tuple(exact[v] for v in sorted(exact))
        candidates: dict[int, list[_OthersKey]] = {}
        for record in ledger.drafts_of_stream(self._tenant, draft.stream):
            try:
                other = _Draft.from_json(record.draft)
            except (ValueError, TypeError, KeyError):
                continue  # not a draft this code reads; it cites nothing here
            if other.request_id == draft.request_id or other.scope != "subject":
                continue
            for action in other.actions:
                if action.get("type") != "dek_destroyed" or "by_request" in action:
                    continue
                version = int(action["key_version"])
                if version not in own and version not in mine and version not in exact:
                    candidates.setdefault(version, []).append(
                        _OthersKey(other.request_id, version, str(action["dek_commitment"]))
                    )
        if any(len(named) > 1 for named in candidates.values()):
            # Several requests recorded the key before any destroyed it (three or more
            # at once): the one whose destroy deleted it wrote its ``key.destroyed``
            # entry right after. Cite that one; the first record only when none is on
            # the log yet (bug GL: the first record may be a request that deleted
            # nothing, and this request then wrote a ``key.destroyed`` under it).
            logged = {
                (e.entry.get("request_id"), e.entry.get("dek_commitment"))
                for e in self._log.entries(subject_ref=draft.pseudonym, action="key.destroyed")
            }
            candidates = {
                version: sorted(named, key=lambda k: (k.by_request, k.dek_commitment) not in logged)
                for version, named in candidates.items()
            }
        cited = {v: named[0] for v, named in candidates.items()} | exact
        return tuple(cited[v] for v in sorted(cited))

    def _in_flight(self, request_id: str) -> AbstractContextManager[None]:
        ledger = self._keystore.ledger
        return nullcontext() if ledger is None else ledger.in_flight(request_id)

    def _finishing(self, request_id: str) -> AbstractContextManager[bool]:
        """This process finishing a request begun elsewhere holds its mark, unless its
        own process is alive and holds it (bug PS: the residue audit tells a running
        erasure from an interrupted one by it)."""
        ledger = self._keystore.ledger
        return nullcontext(False) if ledger is None else ledger.finishing(request_id)

    def settle_abandoned(self) -> list[str]:
        """Give an outcome to each erasure request whose process died between its
        ``erasure.requested`` entry and its ledger record (bug GY): ``erasure.abandoned``,
        ``reason_code`` ``process-ended``. Run by every start.

        A request is taken for dead only when its in-flight mark (key folder) exists and
        no process holds it; the ledger and the log are read again while holding it, so a
        request that wrote its record or outcome just before is left alone. Requests on
        the log from before marks were kept have none and are left as they are. Returns
        the request ids so settled.

        Reads only the entries after the settled-up-to mark (key folder): the leaf before
        the oldest request still open, moved forward by each start. Without it every
        start read every ``erasure.requested`` entry ever written (decision
        0152-erasure-leftovers: ~0.9 ms per 10 past erasures on SQLite)."""
        ledger = self._keystore.ledger
        if ledger is None:
            return []
        after = self._settled_after(ledger)
        size = self._log.size()
        open_requests = self._requests_without_outcome(ledger, after, size)
        settled: list[str] = []
        for request_id, request in open_requests.items():
            with ledger.owner_gone(request_id) as gone:
                if not gone or request_id not in self._requests_without_outcome(
                    ledger, after, size
                ):
                    continue
                self._audit.record(
                    "erasure.abandoned",
                    subject_ref=request.pseudonym,
                    request_id=request_id,
                    reason_code="process-ended",
                    tenant=request.tenant,
                )
                settled.append(request_id)
        left = [r.leaf for i, r in open_requests.items() if i not in settled]
        self._move_settled_mark(ledger, after, min(left) - 1 if left else size - 1)
        return settled

    def settle_host(self, host: str, *, requested_by: str) -> HostSettled:
        """Settle the open requests whose in-flight marks name ``host``, a host that an
        operator declares gone for good (its marks are judged by no start: bug HY's
        choice): ``erasure.abandoned``, ``reason_code`` ``host-gone``, with who asked.

        Refused for this host's own name (its next start judges its marks by their locks)
        and when any of that host's marks is held (a lock seen from here: the host is
        alive); nothing is written then. Each request is read again while holding its
        mark, as a start does, so a request that wrote its record or outcome meanwhile
        is left alone. One run at a time: another waits for its turn."""
        if host == socket.gethostname():
            raise InvalidInputError(
                f"{host!r} is this host: a start here settles its dead requests by their "
                "locks (run any uprof command); settle-host is for another host, gone",
                field="host",
            )
        if not host or any(c.isspace() for c in host):
            raise InvalidInputError("a host name, as its in-flight marks name it", field="host")
        problem = text_problem(host)
        if problem:
            # A byte of the command line that is not UTF-8 reached the marks, whose
            # encoding of it raised: a traceback once a request was open (bug MX).
            raise InvalidInputError(f"host {problem}", field="host")
        ledger = self._keystore.ledger
        if ledger is None:
            return HostSettled(host, [], [])
        # Runs take turns (any process): a run holds each mark while it looks at it, and
        # another run would take that hold for the host's own, and refuse (bug JW).
        with ledger.settle_host_turn():
            return self._settle_host(ledger, host, requested_by)

    def _settle_host(self, ledger: ErasureLedger, host: str, requested_by: str) -> HostSettled:
        after = self._settled_after(ledger)
        open_requests = self._requests_without_outcome(ledger, after)
        held: list[str] = []
        for request_id in open_requests:
            with ledger.mark_of_host(request_id, host, keep=True) as state:
                if state == "held":
                    held.append(request_id)
        if held:
            return HostSettled(host, [], held)
        settled: list[str] = []
        for request_id, request in open_requests.items():
            with ledger.mark_of_host(request_id, host) as state:
                if state != "gone" or request_id not in self._requests_without_outcome(
                    ledger, after
                ):
                    continue
                self._audit.record(
                    "erasure.abandoned",
                    subject_ref=request.pseudonym,
                    request_id=request_id,
                    reason_code="host-gone",
                    requested_by=requested_by,
                    tenant=request.tenant,
                )
                settled.append(request_id)
        return HostSettled(host, settled, [])

    def _settled_after(self, ledger: ErasureLedger) -> int:
        """The leaf index up to which every ``erasure.requested`` entry has an outcome or
        a ledger record (-1: none known). The mark names that leaf's hash: a log that is
        not the one it was written for (restored from a backup, then grown again) does
        not have it there, and the sweep reads the whole log again."""
        raw = ledger.settled_mark()
        if not raw:
            return -1
        try:
            mark = json.loads(raw)
            after, leaf_hash = int(mark["after_leaf"]), bytes.fromhex(mark["leaf_hash"])
        except (ValueError, KeyError, TypeError):
            return -1  # damaged: the whole log, as before the mark
        if after < 0 or after >= self._log.size():
            return -1
        found = next(self._log.entries(after_leaf=after - 1, tree_size=after + 1), None)
        if found is None or found.leaf_index != after or found.leaf_hash != leaf_hash:
            return -1
        return after

    def _move_settled_mark(self, ledger: ErasureLedger, old: int, new: int) -> None:
        """Move the mark forward to ``new`` (never back: a start that read less writes
        nothing). Best effort: without it, the next start reads the whole log."""
        if new <= old or new < 0:
            return
        found = next(self._log.entries(after_leaf=new - 1, tree_size=new + 1), None)
        if found is None or found.leaf_index != new:
            return
        try:
            ledger.write_settled_mark(
                json.dumps({"after_leaf": new, "leaf_hash": found.leaf_hash.hex()})
            )
        except OSError as error:
            _log.warning("the erasure settled-up-to mark could not be written: %s", error)

    def _requests_without_outcome(
        self, ledger: ErasureLedger, after: int = -1, size: int | None = None
    ) -> dict[str, _OpenRequest]:
        """request id -> its ``_OpenRequest``, for each ``erasure.requested`` entry after
        leaf ``after`` (and before ``size``) with no outcome entry and no ledger record. An
        outcome follows its request on the log, so it is after it. Every tenant's: tenants
        on one set of stores share the log and the in-flight marks (decision 0089)."""
        requested = {
            str(e.entry["request_id"]): _OpenRequest(
                str(e.entry.get("subject_ref", "")),
                e.leaf_index,
                # The request's own entry names its tenant (written by the request, from
                # its authenticated tenant); None for an entry from before entries named
                # one: the trail's, as then.
                e.entry.get("tenant") or None,
            )
            for e in self._log.entries(action="erasure.requested", after_leaf=after, tree_size=size)
            if e.entry.get("request_id")
        }
        if not requested:
            return {}
        for action in _OUTCOMES:
            for e in self._log.entries(action=action, after_leaf=after):
                requested.pop(str(e.entry.get("request_id")), None)
        recorded = {r.request_id for r in ledger.records() if r.request_id}
        return {r: p for r, p in requested.items() if r not in recorded}

    @contextmanager
    def _refusal_recorded(self, pseudonym: str, request_id: str) -> Iterator[None]:
        """An erasure refused after its ``erasure.requested`` entry and before it recorded
        anything in the ledger: ``erasure.refused`` with the request's id and the refusal's
        class as ``reason_code``, so that no request on the log is left without an
        outcome (bug EY); any other error (storage) ``erasure.failed`` the same way (bug
        GX). The error itself is what the caller gets."""
        try:
            yield
        except UprofError as error:
            try:
                self._audit.record(
                    "erasure.refused",
                    subject_ref=pseudonym,
                    request_id=request_id,
                    reason_code=type(error).__name__,
                )
            except Exception as audit_error:  # the refusal is the answer; say what failed
                error.add_note(
                    f"its erasure.refused audit entry could not be written: "
                    f"{type(audit_error).__name__}"
                )
            raise
        except Exception as error:
            # Not a refusal: the storage failed (a lock timeout, a lost connection). The
            # request still ends on the log, ``erasure.failed`` with the error's class
            # (bug GX); a retry is a new request. Written best effort: the store that
            # failed may be the audit log's too, and the failure is the answer.
            try:
                self._audit.record(
                    "erasure.failed",
                    subject_ref=pseudonym,
                    request_id=request_id,
                    reason_code=type(error).__name__,
                )
            except Exception as audit_error:
                error.add_note(
                    f"its erasure.failed audit entry could not be written: "
                    f"{type(audit_error).__name__}"
                )
            raise

    # ----------------------------------------------------------------- helpers

    def _unfolded(self) -> str:
        """Fold every store's SQLite WAL (no deleted bytes linger); what could not be
        folded, as the reason the erasure is not done, or "" (bug CA)."""
        held = [
            Path(engine.url.database or "").name or str(engine.url)
            for engine in self._engines
            if not fold_log(engine)
        ]
        if not held:
            return ""
        return (
            "another process holds a read transaction on " + ", ".join(held) + ", whose "
            "write-ahead log still holds the deleted rows"
        )

    def _settle(self, pseudonym: str, request_id: str, tombstone_id: int, **purged: Any) -> None:
        """Audit what the purge removed (the WALs are folded by then: ``_unfolded``)."""
        # Once per request, however many processes finish it at once (each signs its
        # own receipt, and each receipt is on the log; the purge happened once).
        self._audit.record_many(
            [
                (
                    "projection.purged",
                    {
                        "subject_ref": pseudonym,
                        "request_id": request_id,
                        "projection": "profile",
                        "tracking_position": tombstone_id,
                        **purged,
                    },
                )
            ],
            once_by=("request_id",),
        )

    def _require(self, subject_ref: str) -> Any:
        handle = self._subjects.find(subject_ref)
        if handle is None:
            raise SubjectNotFoundError("no such subject (or already erased)")
        return handle

    def _row_counts(self, stream_id: str) -> dict[str, int]:
        with self._views.connect() as conn:
            return {
                table.name: int(
                    conn.execute(
                        sa.select(sa.func.count())
                        .select_from(table)
                        .where(table.c.stream_id == stream_id)
                    ).scalar_one()
                )
                for table in t.SUBJECT_TABLES
            }

    def _items_citing(self, stream_id: str, capture_id: str) -> list[str]:
        memories, _ = self._queries.memories(stream_id, include_archived=True)
        ids = [m.item_id for m in memories if capture_id in m.evidence]
        ids += [i.item_id for i in self._queries.intents(stream_id) if capture_id in i.evidence]
        return ids

    def _citing(self, stream_id: str, capture_ids: Sequence[str]) -> list[str]:
        """Items of the subject (attributes, intents, memories) whose evidence cites any
        of these captures."""
        wanted = set(capture_ids)
        memories, _ = self._queries.memories(stream_id, include_archived=True)
        found = {a.item_id for a in self._queries.attributes(stream_id) if wanted & set(a.evidence)}
        found |= {i.item_id for i in self._queries.intents(stream_id) if wanted & set(i.evidence)}
        found |= {m.item_id for m in memories if wanted & set(m.evidence)}
        return sorted(found)

    def _fingerprints(self, stream: UUID, item_id: str, ledger: ErasureLedger) -> list[str]:
        """The item's fingerprint for each capture it cites, from the views (current:
        the caller waited for them), which list all its evidence and what it says: its
        identity is the one the update engine gives the proposal that would record it
        again (``proposal_identity`` of the same words)."""
        found = self._listed(str(stream), item_id)
        if found is None:
            return []
        evidence, proposal = found
        identity = proposal_identity(proposal)
        if identity is None:
            return []
        return [ledger.fingerprint(str(stream), c, *identity) for c in sorted(set(evidence))]

    def _listed(self, stream_id: str, item_id: str) -> tuple[tuple[str, ...], Any] | None:
        """(evidence, the proposal that would record the item again) of a listed item."""
        for a in self._queries.attributes(stream_id):
            if a.item_id == item_id:
                return a.evidence, AttributeProposal(a.key, a.value)
        for i in self._queries.intents(stream_id):
            if i.item_id == item_id:
                return i.evidence, IntentProposal(i.description)
        memories, _ = self._queries.memories(stream_id, include_archived=True)
        for m in memories:
            if m.item_id != item_id:
                continue
            if m.kind == "experience":
                d = m.detail
                experience = ExperienceProposal(
                    situation=d.get("situation", ""),
                    action=d.get("action", ""),
                    outcome=d.get("outcome", ""),
                    insight=d.get("insight", ""),
                )
                return m.evidence, experience
            return m.evidence, MemoryProposal(m.text)
        return None

    def _evidence_of(self, stream_id: str, item_id: str) -> tuple[str, ...] | None:
        for a in self._queries.attributes(stream_id):
            if a.item_id == item_id:
                return a.evidence
        for i in self._queries.intents(stream_id):
            if i.item_id == item_id:
                return i.evidence
        memories, _ = self._queries.memories(stream_id, include_archived=True)
        for m in memories:
            if m.item_id == item_id:
                return m.evidence
        return None

    def _receipt(
        self,
        subject_ref: str,
        request_id: str,
        received_at: datetime,
        basis: str,
        scope: str,
        actions: list[dict[str, Any]],
        counts: dict[str, int],
    ) -> ErasureResult:
        nonce = new_commitment_nonce()
        # Over the id the subject is known by (as ``SubjectResolver.find`` reads it), not
        # as this request spelt it: " alice " is alice, and her receipt matches "alice" (JR).
        known_as = check_subject_ref(subject_ref)
        receipt = issue_erasure_receipt(
            self._log,
            request_id=request_id,
            received_at=received_at,
            basis=basis,
            scope=scope,
            tenant=self._tenant,
            subject_commitment=subject_commitment(known_as, nonce),
            actions=actions,
            residual=RESIDUAL,
        )
        return ErasureResult(receipt, nonce.hex(), counts)


@dataclass(frozen=True)
class _Draft:
    """What an erasure's receipt cites, fixed once its tombstone is written (and, for
    subjects and captures, its keys destroyed).

    Kept in the erasure ledger when the erasure answers ``erasure_incomplete``, so that
    a later request with the same scope and target (any process) issues the receipt of
    the same request. Ids, key commitments and counts only: nothing the subject said.
    """

    request_id: str
    received_at: str
    basis: str
    #: subject | capture | consent-withdrawal | item-with-evidence | item
    scope: str
    #: What the caller named: nothing (subject), capture ids, a consent id, an item id.
    target: list[str]
    pseudonym: str
    stream: str
    tombstone_id: int
    actions: list[dict[str, Any]]
    counts: dict[str, int]
    #: Captured events the views must no longer hold, nor any item cite.
    captures: list[str] = field(default_factory=list)
    #: Items the views must no longer list.
    items: list[str] = field(default_factory=list)
    #: The request whose tombstone a subject erasure cites when it is not this one's
    #: (another request of the same subject at once, or one killed after it); "" if own.
    tombstone_by: str = ""
    #: The import tokens of the erased captures' (app, source_ref), each sealed under the
    #: subject's data key (``_seal_ref``): a restore that rolls the stream's
    #: ``ErasedRefsNoted`` back cannot make an import bring the capture back (bug IO), and
    #: the tokens die with the subject's key.
    sealed_refs: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> _Draft:
        raw = json.loads(text)
        if "scope" not in raw:
            raw = _subject_draft_of_0051(raw)
        return cls(**raw)


def _subject_draft_of_0051(raw: dict[str, Any]) -> dict[str, Any]:
    """A subject draft as decision 0051's code wrote it (destroyed keys, purged rows and
    memories as fields, no scope, target or actions), with the actions that code's
    receipt cited: the same as ``erase_subject`` builds now."""
    return {
        "request_id": raw["request_id"],
        "received_at": raw["received_at"],
        "basis": raw["basis"],
        "scope": "subject",
        "target": [],
        "pseudonym": raw["pseudonym"],
        "stream": raw["stream"],
        "tombstone_id": raw["tombstone_id"],
        "actions": [
            {
                "type": "tombstone_appended",
                "stream": raw["stream"],
                "notification_id": raw["tombstone_id"],
            },
            *(
                {"type": "dek_destroyed", "key_version": version, "dek_commitment": commitment}
                for version, commitment in raw["deks"]
            ),
            {
                "type": "projection_purged",
                "name": "profile",
                "tracking_position": raw["tombstone_id"],
                "rows": raw["rows"],
            },
            {"type": "embeddings_purged", "rows": raw["memories"]},
            {
                "type": "cache_invalidated",
                "caches": ["subject-keys", "capture-keys", "slice-index", "snapshots"],
            },
        ],
        "counts": raw["counts"],
    }


def _moved_to(draft: _Draft, position: int) -> _Draft:
    """The draft citing its tombstone at ``position`` (and the purge tracked there)."""
    if position == draft.tombstone_id:
        return draft
    moved = {"tombstone_appended": "notification_id", "projection_purged": "tracking_position"}
    actions = [
        dict(a, **{moved[a["type"]]: position}) if a.get("type") in moved else a
        for a in draft.actions
    ]
    return replace(draft, tombstone_id=position, actions=actions)


def _destroyed_either(preview: Destruction, destroyed: Destruction) -> Destruction:
    """What a subject erasure destroyed: the keys its ledger record previewed, which this
    process or one finishing the same erasure destroyed, and any this process found."""
    versions = {key.key_version for key in preview.deks}
    return replace(
        preview,
        deks=preview.deks + tuple(k for k in destroyed.deks if k.key_version not in versions),
        capture_keys=max(preview.capture_keys, destroyed.capture_keys),
        aliases=max(preview.aliases, destroyed.aliases),
    )


@dataclass(frozen=True)
class _OthersKey:
    """A subject key another request's ledger record named, and destroyed (bug EW)."""

    by_request: str
    key_version: int
    dek_commitment: str


def _others_key_entries(
    pseudonym: str, keys: Sequence[_OthersKey]
) -> list[tuple[str, dict[str, Any]]]:
    """The entries of those keys' destruction, under the request that recorded each (to
    append with ``once_by=KEY_ENTRY_IDENTITY``: that request writes the same ones, so the
    log holds them once, before any receipt citing them, even if that request's process
    died after destroying them)."""
    entries: list[tuple[str, dict[str, Any]]] = []
    for by in sorted({key.by_request for key in keys}):
        mine = [(k.key_version, k.dek_commitment) for k in keys if k.by_request == by]
        entries += subject_key_entries(pseudonym, by, mine)
    return entries


def _others_capture_entries(
    pseudonym: str, keys: Sequence[tuple[str, str]]
) -> list[tuple[str, dict[str, Any]]]:
    """The entries of capture keys another event erasure's destroy deleted, each
    (request, commitment), under that request (bug HZ): the same ones it writes itself,
    so the log holds them once."""
    entries: list[tuple[str, dict[str, Any]]] = []
    for by in sorted({request for request, _ in keys}):
        entries += capture_key_entries(pseudonym, by, [c for r, c in keys if r == by])
    return entries


def _subject_drafted(
    draft: _Draft,
    destruction: Destruction,
    before: dict[str, int],
    *,
    snapshots: int | None,
    others: Sequence[_OthersKey] = (),
) -> _Draft:
    """A subject erasure's draft citing these keys and counts (``snapshots`` is None
    before they are dropped: the draft written ahead of the destruction omits it), and
    the keys ``others`` destroyed, each with its request's id (``by_request``)."""
    counts = {f"rows_{name}": n for name, n in before.items()}
    if snapshots is not None:
        counts["snapshots"] = snapshots
    counts.update(
        deks=len(destruction.deks),
        capture_keys=destruction.capture_keys,
        aliases=destruction.aliases,
    )
    if others:
        counts["deks_by_other_requests"] = len(others)
    tombstone: dict[str, Any] = {
        "type": "tombstone_appended",
        "stream": draft.stream,
        "notification_id": draft.tombstone_id,
    }
    if draft.tombstone_by:
        tombstone["by_request"] = draft.tombstone_by
    actions: list[dict[str, Any]] = [
        tombstone,
        *(
            {
                "type": "dek_destroyed",
                "key_version": key.key_version,
                "dek_commitment": key.dek_commitment,
            }
            for key in destruction.deks
        ),
        *(
            {
                "type": "dek_destroyed",
                "key_version": key.key_version,
                "dek_commitment": key.dek_commitment,
                "by_request": key.by_request,
            }
            for key in others
        ),
        {
            "type": "projection_purged",
            "name": "profile",
            "tracking_position": draft.tombstone_id,
            "rows": sum(before.values()),
        },
        {"type": "embeddings_purged", "rows": before.get("memories", 0)},
        {
            "type": "cache_invalidated",
            "caches": ["subject-keys", "capture-keys", "slice-index", "snapshots"],
        },
    ]
    return replace(draft, actions=actions, counts=counts)


def _captures_drafted(
    draft: _Draft,
    commitments: list[str],
    totals: dict[str, int],
    *,
    snapshots: int | None,
    others: Sequence[_OthersKey] = (),
    by_others: Sequence[tuple[str, str]] = (),
) -> _Draft:
    """An event erasure's draft citing these capture-key commitments and counts, the
    subject keys ``others`` destroyed and the capture keys other event erasures destroyed
    (``by_others``: request, commitment), each with its request's id (``by_request``)."""
    counts = dict(totals, captures=len(draft.captures), capture_keys=len(commitments))
    if by_others:
        counts["capture_keys_by_other_requests"] = len(by_others)
    if snapshots is not None:
        counts["snapshots"] = snapshots
    if others:
        counts["deks_by_other_requests"] = len(others)
    actions: list[dict[str, Any]] = [
        {
            "type": "tombstone_appended",
            "stream": draft.stream,
            "notification_id": draft.tombstone_id,
        },
        *(
            {"type": "dek_destroyed", "key_kind": "capture", "dek_commitment": c}
            for c in commitments
        ),
        *(
            {"type": "dek_destroyed", "key_kind": "capture", "dek_commitment": c, "by_request": r}
            for r, c in by_others
        ),
        *(
            {
                "type": "dek_destroyed",
                "key_version": key.key_version,
                "dek_commitment": key.dek_commitment,
                "by_request": key.by_request,
            }
            for key in others
        ),
        {
            "type": "projection_purged",
            "name": "profile",
            "tracking_position": draft.tombstone_id,
            "rows": totals["items_erased"] + len(draft.captures),
        },
        {"type": "cache_invalidated", "caches": ["capture-keys", "slice-index", "snapshots"]},
    ]
    return replace(draft, actions=actions, counts=counts)


def _ref_aad(stream_id: str, request_id: str) -> bytes:
    return f"erased-ref|{stream_id}|{request_id}".encode()


def _token(text: str) -> str:
    """Audit tokens allow no spaces: keep the basis recognisable but token-shaped."""
    return "".join(ch if ch.isalnum() or ch in "_.:/*#=-" else "-" for ch in text)[:200]


@dataclass(frozen=True)
class _OpenRequest:
    """An erasure request on the log with no outcome yet (``settle_abandoned``)."""

    pseudonym: str
    leaf: int
    #: The tenant its ``erasure.requested`` entry names: its outcome goes to that tenant's
    #: trail, whichever tenant's start or command settles it (bug LZ).
    tenant: str | None


#: The reason of an item erasure re-applied from the ledger (an event and audit reason code).
REAPPLIED_REASON = "erasure-reapplied"


def _reapplied_entries(
    records: Iterable[ErasureRecord], stream: str, doomed: Sequence[str]
) -> list[tuple[str, dict[str, object]]]:
    """The ``erasure.items_reapplied`` entries of re-erasing ``doomed`` in ``stream``: one
    per ``items`` ledger record naming some of them, with its request and those ids."""
    wanted = set(doomed)
    entries: list[tuple[str, dict[str, object]]] = []
    for record in records:
        ids = sorted(wanted & set(record.item_ids))
        if record.kind != "items" or record.stream_id != stream or not ids:
            continue
        fields: dict[str, object] = {"item_refs": ids, "reason_code": REAPPLIED_REASON}
        if record.tenant:
            # The subject's tenant, not the trail's: tenants on one set of stores share
            # the ledger and the views, so a start of tenant A re-applies tenant B's items
            # too, and named them A's: A's auditors read B's pseudonym and request, B's
            # trail lacked the re-application (bug LF; decision 0089).
            fields["tenant"] = record.tenant
        if record.request_id:
            fields["request_id"] = record.request_id
        if record.draft:
            fields["subject_ref"] = _Draft.from_json(record.draft).pseudonym
        entries.append(("erasure.items_reapplied", fields))
    return entries
