"""Group commit of captures: one writer thread saves the captures of many requests at once.

A single capture used to pay three commits (capture keys, event log, audit log), and the
event log's commit is an fsync (eventsourcing opens SQLite with ``synchronous=FULL``).
Here request threads validate and resolve their subject as before, queue the request and
wait; the writer takes what has queued (lingering at most ``linger_s``), and for the
whole group makes one key-store transaction, one event-log transaction and one audit
append. Only after all three have committed are the waiters answered, so a 2xx still
means the capture survives ``kill -9`` (decision 0017).

Commit order is the crash-safety argument: keys first (an orphan key, whose event never
committed, is harmless), events second (an event whose key was lost would be data loss),
audit last (as the one-request path does).

Each request stays all or nothing: its consent is checked for every interaction before
any is applied, so a refused request is answered alone and adds nothing to the group. A
group that loses the version check (another process wrote one of its subjects) is
retried once whole, from fresh copies, then request by request through the one-request
path, which retries with back-off.

The writer keeps the aggregates it saved (bounded), brought up to date before each use
with the events written since (usually none, or a few extraction results): loading a
subject (snapshot plus tail, every event decrypted) was the largest cost of a capture.
A copy that is behind in spite of that loses the version check and is reloaded.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from domain.errors import (
    CaptureBackloggedError,
    CheckUnansweredError,
    ConsentRequiredError,
    PermissionDeniedError,
    SubjectErasedError,
    UprofError,
)
from domain.profile import SubjectProfile, capture_consent_refusal
from domain.under_lock import KEY_CHECK_IN_TURN, asked_within
from domain.values import Interaction
from uprof import retry, telemetry
from uprof.backends.damage import log_fault_or_damage
from uprof.caching import BoundedCache, CacheStats
from uprof.crypto.keystore import new_pseudonym
from uprof.ports import AuditTrail, Clock, EventStore, SubjectKeyStore
from uprof.recorders import asked_under_the_store_lock, key_check_within_s
from uprof.services.idempotency import refuse_unrecorded
from uprof.services.subjects import ERASED_SUBJECT, SubjectResolver

_log = logging.getLogger(__name__)

#: Requests waiting for the writer at most; a full queue makes a request wait for a
#: slot (``enqueue_timeout_s``) and then refuses it (503, Retry-After).
MAX_QUEUED = 1_024
#: Requests the writer commits together at most.
MAX_GROUP = 64
#: How long the writer waits for more requests once one has arrived. A request waits
#: at most this long extra when it is alone; under load the queue fills meanwhile.
LINGER_S = 0.002
#: How long a request waits for a queue slot before it is refused.
ENQUEUE_TIMEOUT_S = 5.0
#: Aggregates the writer keeps between groups (the read recorder keeps as many).
MAX_SAVED_SUBJECTS = 256


@dataclass
class PendingCapture:
    """One request's validated captures, queued for the writer, and its answer."""

    interactions: Sequence[Interaction]
    batch_token: str | None
    token_window_s: float
    #: The asking principal's audit label: the writer thread has no request context.
    principal: str | None
    #: A replay (``idempotency.replaying`` of the request's context): it must find its
    #: token in the stream, or write nothing.
    replay: bool = False
    #: The request's key check (``acting_credential``), asked again once the request
    #: has its subject's writer turn: a key revoked while it waited writes nothing.
    still_authenticated: Callable[[], None] | None = None
    #: The subject's stream and pseudonym; or, until the writer has looked it up,
    #: ``subject_ref`` (checked) with ``stream_id`` None: the writer looks up a whole
    #: group's references with one query instead of one per request thread.
    stream_id: UUID | None = None
    pseudonym: str = ""
    subject_ref: str | None = None
    #: (capture ids, their versions) once written; or the first write's token record.
    written: tuple[list[str], list[int]] | None = None
    replay_of: dict[str, Any] | None = None
    #: capture id -> its key's commitment, once the keys are made (``key.created``).
    key_commitments: dict[str, str] = field(default_factory=dict)
    #: Filled by the writer before the request is answered (one of the three).
    acks: list[tuple[str, int]] | None = None
    replayed: bool = False
    error: BaseException | None = None
    #: The request's capture span (tracing on), which the group's span links to: a
    #: group works for many requests, so it is a child of none of them.
    trace_link: Any = None
    #: True once answered: the fields above are final.
    answered: bool = False
    #: Who waits for the answer: a thread blocked on ``waiting_thread``, or a coroutine
    #: awaiting ``waiting_future`` on its event loop (no thread held).
    waiting_thread: threading.Event | None = field(default=None, repr=False)
    waiting_future: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def stream(self) -> UUID:
        """The subject's stream, once looked up (the writer does that first of all)."""
        assert self.stream_id is not None, "the writer looks up every subject first"
        return self.stream_id


def answer(pendings: Iterable[PendingCapture]) -> None:
    """Mark requests answered (their fields are final) and wake their waiters: each
    thread, and each event loop once for all its coroutines (one wake-up per group,
    not per request)."""
    futures: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = defaultdict(list)
    for pending in pendings:
        if pending.answered:
            continue
        pending.answered = True
        if pending.waiting_thread is not None:
            pending.waiting_thread.set()
        if pending.waiting_future is not None:
            futures[pending.waiting_future.get_loop()].append(pending.waiting_future)
    for loop, waiting in futures.items():
        try:
            loop.call_soon_threadsafe(_settle, waiting)
        except RuntimeError:  # the loop has closed: nobody waits for these answers
            pass


def _settle(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():  # a waiter that was cancelled has gone
            future.set_result(None)


def keys_refused(pendings: Sequence[PendingCapture]) -> list[Exception | None]:
    """Ask each request's key again, once the requests have their subjects' writer turns:
    the key was checked when the request came in, and a request waits for the writer
    (other groups, its subject's writer turn) before its captures are written; a key
    revoked meanwhile (by any process, seen within ``KEY_CACHE_TTL_S`` as every request
    sees it) writes nothing and is answered the key's refusal (review of 0211, bug TW).
    The consent is read at the same point (``_apply``).

    Returns each request's refusal (the edge's own error: REST's 401, MCP's tool error)
    or None, in order, and marks no request: the writer asks it through
    ``domain.under_lock.asked_within`` (bug WI), so its answer may come after the
    writer answered the group 503 and went on."""
    refusals: list[Exception | None] = []
    for pending in pendings:
        refused: Exception | None = None
        if pending.still_authenticated is not None:
            try:
                pending.still_authenticated()
            except Exception as error:
                refused = error
        refusals.append(refused)
    return refusals


def keys_still_standing(writing: Iterable[PendingCapture]) -> None:
    """Ask each request of a group's save again, under the store's lock (inside the
    save, before its commit): another process holding the lock kept the save waiting,
    and a key revoked meanwhile must write nothing (bug US). One refused fails the save
    (PermissionDeniedError, nothing written); the group is then written request by
    request (``_commit``'s fallback), where each key is asked alone and a refused one is
    answered its own refusal.

    Asked on a thread of its own with a bound (``domain.under_lock``): it marks no
    request (``pending.error``), since an answer past the bound lands while the fallback
    writes the same requests, and would refuse one it wrote (bug VX)."""
    for pending in writing:
        if pending.still_authenticated is None:
            continue
        try:
            pending.still_authenticated()
        except Exception as refused:  # the edge's own error; the fallback answers it
            raise PermissionDeniedError(
                "a key of the group was revoked while its save waited for the store's lock"
            ) from refused


def no_consent_on_record(interaction: Interaction) -> ConsentRequiredError:
    """The refusal of a capture for a reference that names no subject: word for word the
    refusal for a subject the app holds no consent of, so that it cannot tell the two apart."""
    return capture_consent_refusal(interaction)


#: ``reason_code`` of a capture key's ``key.created`` and ``key.destroyed`` entries (a
#: subject key's carry ``key_version`` instead).
CAPTURE_KEY = "capture-key"

#: Commitments one ``key.created`` entry lists (the audit allowlist's list bound).
KEYS_PER_ENTRY = 1_000


def capture_keys_created(
    pseudonym: str, commitments: Mapping[str, str]
) -> list[tuple[str, dict[str, Any]]]:
    """The ``key.created`` entries of a request's capture keys: the subject's pseudonym
    and the keys' commitments (what ``key.destroyed`` and an event erasure's receipt
    cite), never the capture ids, the keys or anything the captures said.

    One entry lists a request's keys, up to ``KEYS_PER_ENTRY`` each (decision 0072): an
    entry per key doubled the log's writes per captured event and cost ~40 % of batched
    capture throughput."""
    made = list(commitments.values())
    return [
        (
            "key.created",
            {
                "subject_ref": pseudonym,
                "reason_code": CAPTURE_KEY,
                "dek_commitments": made[lo : lo + KEYS_PER_ENTRY],
            },
        )
        for lo in range(0, len(made), KEYS_PER_ENTRY)
    ]


def refusal_entry(pending: PendingCapture, reason_code: str) -> tuple[str, dict[str, Any]]:
    """The ``capture.refused`` audit entry of a request (no content, pseudonym only)."""
    first = pending.interactions[0]
    return (
        "capture.refused",
        {
            "subject_ref": pending.pseudonym,
            "principal": pending.principal,
            "app_id": first.app_id,
            "agent_id": first.agent_id,
            "purpose": first.purpose,
            "reason_code": reason_code,
        },
    )


#: Runs one request through the one-request path (the fallback after a lost group).
Fallback = Callable[[PendingCapture], None]

#: What ``CaptureWriter._offer`` did with a request.
_QUEUED, _FULL, _STOPPED = object(), object(), object()


class CaptureWriter:
    """The group-commit writer thread; ``submit`` blocks until the request is answered."""

    def __init__(
        self,
        app: EventStore,
        keystore: SubjectKeyStore,
        clock: Clock,
        audit: AuditTrail,
        subjects: SubjectResolver,
        fallback: Fallback,
        *,
        max_queued: int = MAX_QUEUED,
        max_group: int = MAX_GROUP,
        linger_s: float = LINGER_S,
        enqueue_timeout_s: float = ENQUEUE_TIMEOUT_S,
    ) -> None:
        self._app = app
        self._keystore = keystore
        self._clock = clock
        self._audit = audit
        self._subjects = subjects
        self._fallback = fallback
        self._max_group = max_group
        self._linger_s = linger_s
        self._enqueue_timeout_s = enqueue_timeout_s
        self._queue: queue.Queue[PendingCapture] = queue.Queue(maxsize=max_queued)
        self._saved: BoundedCache[UUID, SubjectProfile] = BoundedCache(
            MAX_SAVED_SUBJECTS, name="capture-writer-saved-subjects"
        )
        self._thread: threading.Thread | None = None
        self._state = threading.Lock()
        self._stopping = False
        #: Counters for tests and benchmarks: groups committed and requests in them.
        self.groups = 0
        self.grouped_requests = 0

    # ---------------------------------------------------------------- callers

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopping

    def start(self) -> None:
        with self._state:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(
                target=self._run, name="uprof-capture-writer", daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Answer every queued request (drain), then stop the thread."""
        with self._state:
            thread = self._thread
            self._stopping = True
        if thread is not None:
            thread.join(timeout_s)
        with self._state:
            self._thread = None

    def submit(self, pending: PendingCapture) -> None:
        """Queue a request and wait until the writer has answered it (its fields set).

        Not running (never started, or stopping): the request runs on the caller's
        thread through the one-request path. The wait for the answer has no deadline
        of its own: the writer answers every request it took, and a deadline here could
        only turn a capture that will commit into an error the client retries (a
        duplicate without an Idempotency-Key).
        """
        answered = pending.waiting_thread = threading.Event()
        deadline = time.monotonic() + self._enqueue_timeout_s
        while (offered := self._offer(pending, deadline)) is _FULL:
            time.sleep(0.001)
        if offered is _QUEUED:
            answered.wait()
        else:
            self._fallback(pending)

    async def submit_async(self, pending: PendingCapture) -> None:
        """``submit`` for a coroutine on an event loop: the loop goes on serving while
        the request waits, and no thread is held for it. The writer wakes the loop
        when it answers; a writer that is not running answers on a worker thread."""
        answered = pending.waiting_future = asyncio.get_running_loop().create_future()
        deadline = time.monotonic() + self._enqueue_timeout_s
        pause_s = 0.001
        while (offered := self._offer(pending, deadline)) is _FULL:
            await asyncio.sleep(pause_s)
            # Coroutines are not bounded by a thread pool: with many of them waiting for
            # a slot, a fixed 1 ms poll each would keep the loop busy with retries alone.
            pause_s = min(pause_s * 2, 0.05)
        if offered is _QUEUED:
            await answered
        else:
            pending.waiting_future = None
            await asyncio.to_thread(self._fallback, pending)

    def _offer(self, pending: PendingCapture, deadline: float) -> object:
        """Queue the request: ``_QUEUED``; ``_FULL`` to try again; ``_STOPPED`` when the
        writer is not running. Raises CaptureBackloggedError once ``deadline`` passed."""
        # Checked and queued under the lock the thread's exit takes: nothing is
        # queued after the thread decided to end, so no waiter is left unanswered.
        with self._state:
            if not self.running:
                return _STOPPED
            try:
                self._queue.put_nowait(pending)
                return _QUEUED
            except queue.Full:
                pass
        if time.monotonic() >= deadline:
            raise CaptureBackloggedError(
                f"the capture queue has been full for {self._enqueue_timeout_s:.0f} s; "
                "nothing was stored"
            )
        return _FULL

    def forget(self, stream_id: UUID) -> None:
        """Drop the subject's saved copy (erasure calls this: it may hold decrypted data)."""
        self._saved.pop(stream_id)

    def cache_stats(self) -> CacheStats:
        return self._saved.stats()

    # ----------------------------------------------------------------- writer

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.05)
            except queue.Empty:
                with self._state:
                    if self._stopping and self._queue.empty():
                        return  # stop() drains: only an empty queue ends the thread
                continue
            group = [first]
            deadline = time.monotonic() + self._linger_s
            while len(group) < self._max_group:
                try:
                    group.append(self._queue.get(timeout=max(deadline - time.monotonic(), 0)))
                except queue.Empty:
                    break
            try:
                self.commit(group)
            except BaseException as error:  # never leave a waiter hanging
                log_fault_or_damage(_log, error, "capture group failed")
                for pending in group:
                    if not pending.answered:
                        pending.error = error
                answer(group)

    def commit(self, group: list[PendingCapture]) -> None:
        """Write one group and answer its requests (the writer thread's step; tests call
        it to build a group deterministically)."""
        with telemetry.span(
            "uprof.capture.group",
            links=[p.trace_link for p in group],
            requests=len(group),
        ) as traced:
            outcome = self._commit(group)
            traced.set(
                outcome=outcome,
                subjects=len({p.stream_id for p in group if p.stream_id is not None}),
                captures=sum(len(p.acks or ()) for p in group if not p.replayed),
                refused=sum(1 for p in group if p.error is not None),
            )

    def _commit(self, group: list[PendingCapture]) -> str:
        """Commit the group, or (lost twice, or failed) each request alone; says which."""
        group = self._resolve_subjects(group)
        if not group:
            return "refused"

        def attempt() -> tuple[
            list[PendingCapture], list[PendingCapture], dict[tuple[UUID, int], int]
        ]:
            try:
                return self._write_group(group)
            except UprofError:
                # Nothing was saved. Another process wrote one of these subjects
                # (VersionConflictError: CAPTURE_GROUP tries the group again), or one
                # request's subject failed the group (e.g. erased meanwhile, so its key
                # could not be made). Either way drop the copies: they are behind, or
                # hold captures that were never saved.
                self._reset(group)
                raise

        try:
            written = retry.CAPTURE_GROUP.call(attempt)
        except CheckUnansweredError as unanswered:
            # The group's key check did not answer under the lock: the key store hangs.
            # Request by request, each asking its key alone under the lock again, the
            # n-th request of the group waited n bounds (bug VZ). The outage is every
            # request's answer (503, nothing written; a retry is safe).
            for pending in group:
                pending.error = unanswered
            answer(group)
            return "unanswered"
        except UprofError:
            pass
        else:
            # Events are saved: from here nothing may run a request a second time.
            self._finish(group, *written)
            return "committed"
        # Lost twice, or failed: request by request through the one-request path (its
        # own retries with back-off), so a failure is only its own request's answer.
        for pending in group:
            try:
                self._fallback(pending)
            except BaseException as error:
                pending.error = error
            answer([pending])
        return "one-by-one"

    def _resolve_subjects(self, group: list[PendingCapture]) -> list[PendingCapture]:
        """Look up the streams of the group's subject references with one query.

        A reference that names no subject, or an erased one, is refused as the
        one-request path refuses it (audited, then answered) and adds nothing to the
        group. Returns the requests left to write.
        """
        unresolved = [p for p in group if p.stream_id is None]
        if not unresolved:
            return group
        found, erased = self._subjects.find_many(p.subject_ref or "" for p in unresolved)
        refusals: list[tuple[str, dict[str, Any]]] = []
        for pending in unresolved:
            handle = found.get(pending.subject_ref or "")
            if handle is not None:
                pending.stream_id, pending.pseudonym = handle.stream_id, handle.pseudonym
                continue
            # A one-off pseudonym, linked to nothing (see CaptureService.capture_once).
            pending.pseudonym = new_pseudonym()
            if pending.subject_ref in erased:
                pending.error = SubjectErasedError(ERASED_SUBJECT)
                refusals.append(refusal_entry(pending, "subject-erased"))
            else:
                pending.error = no_consent_on_record(pending.interactions[0])
                refusals.append(refusal_entry(pending, "no-consent-on-record"))
        if refusals:
            self._audit.record_many(refusals)
            answer(p for p in unresolved if p.error is not None)
        return [p for p in group if p.stream_id is not None]

    def _reset(self, group: list[PendingCapture]) -> None:
        for pending in group:
            self._saved.pop(pending.stream)
            pending.written = pending.replay_of = None
            pending.error = None

    def _write_group(
        self, group: list[PendingCapture]
    ) -> tuple[list[PendingCapture], list[PendingCapture], dict[tuple[UUID, int], int]]:
        """Apply every request to its subject's copy; commit the keys, then the events.
        Returns the requests written, those refused, and the log position of each event."""
        by_stream: dict[UUID, list[PendingCapture]] = defaultdict(list)
        for pending in group:
            by_stream[pending.stream].append(pending)
        # Nothing is cached after an erasure forgot a subject since this ticket.
        ticket = self._saved.ticket()
        with self._app.writer_turns(by_stream):
            copies: dict[UUID, SubjectProfile] = {}
            profiles: dict[UUID, SubjectProfile] = {}  # the copies with captures to save
            refused: list[PendingCapture] = []
            now = self._clock.now()
            fresh = self._fresh_copies(list(by_stream), ticket)
            # Every request's key in one bounded ask: the key store may read a row, and
            # this is the process's one capture writer, every app's captures waiting for
            # it; a key store that did not answer held them all (bug WI). Past the bound
            # the group is answered 503 at once (CheckUnansweredError, as under the lock).
            refusals = dict(
                zip(
                    map(id, group),
                    asked_within(
                        lambda: keys_refused(group), key_check_within_s(), name=KEY_CHECK_IN_TURN
                    ),
                    strict=True,
                )
            )
            for stream_id, requests in by_stream.items():
                profile = fresh[stream_id]
                if isinstance(profile, UprofError):  # erased or unknown since resolved
                    for pending in requests:
                        pending.error = profile
                    continue
                copies[stream_id] = profile
                for pending in requests:
                    if (key_refused := refusals[id(pending)]) is not None:
                        pending.error = key_refused
                        continue
                    self._apply(profile, pending, now)
                    if isinstance(pending.error, ConsentRequiredError):
                        refused.append(pending)
                if any(p.written for p in requests):
                    profiles[stream_id] = profile
            writing = [p for p in group if p.written]
            recordings = []
            if writing:
                # Keys, then events: an orphan key is harmless, an event without one is not.
                keys = {
                    str(s): [c for p in by_stream[s] if p.written for c in p.written[0]]
                    for s in profiles
                }
                with telemetry.span(
                    "uprof.capture.commit.keys", captures=sum(map(len, keys.values()))
                ):
                    made = self._keystore.create_capture_keys_many(keys, now=self._clock.now())
                for pending in writing:
                    assert pending.written is not None
                    pending.key_commitments = {c: made[c] for c in pending.written[0]}
                with (
                    telemetry.span("uprof.capture.commit.events", subjects=len(profiles)) as t,
                    asked_under_the_store_lock(lambda: keys_still_standing(writing)),
                ):
                    recordings = self._app.save(*profiles.values())
                    t.set(events=len(recordings))
            # Refused and replayed requests changed nothing: every copy is as saved.
            self._saved.put_many(copies.items(), ticket=ticket)
        positions: dict[tuple[UUID, int], int] = {}
        for r in recordings:
            # The profiles log stores UUID ids (the notification type also allows str).
            stream = r.notification.originator_id
            key = stream if isinstance(stream, UUID) else UUID(stream)
            positions[(key, r.notification.originator_version)] = r.notification.id
        return writing, refused, positions

    def _finish(
        self,
        group: list[PendingCapture],
        writing: list[PendingCapture],
        refused: list[PendingCapture],
        positions: dict[tuple[UUID, int], int],
    ) -> None:
        """Audit the group, then answer every request (after everything has committed)."""
        with telemetry.span("uprof.capture.commit.audit", events=len(writing) + len(refused)):
            self._audit_group(writing, refused, positions)
        for pending in group:
            if pending.written is not None:
                ids, versions = pending.written
                pending.acks = [
                    (c, positions[(pending.stream, v)]) for c, v in zip(ids, versions, strict=True)
                ]
            elif pending.replay_of is not None:
                first = pending.replay_of
                nids = self._app.notification_ids(pending.stream, first["versions"])
                pending.acks = list(zip(first["capture_ids"], nids, strict=True))
                pending.replayed = True
        self.groups += 1
        self.grouped_requests += len(group)
        answer(group)

    def _fresh_copies(
        self, stream_ids: list[UUID], ticket: int
    ) -> dict[UUID, SubjectProfile | UprofError]:
        """Each subject's copy: the writer's saved one brought up to the stream's head
        (all of them with two queries), or a fresh load. Erased or unknown subjects map
        to their error, as a load refuses them.

        Copies are taken out of the cache while in use: a group that fails leaves
        nothing cached that holds unsaved captures.
        """
        kept = [p for s in stream_ids if (p := self._saved.take(s)) is not None]
        fresh: dict[UUID, SubjectProfile | UprofError] = {}
        if kept:
            caught_up = self._app.catch_up_many(kept)
            # Not used if a subject was forgotten (erased) while we read the tails.
            if self._saved.ticket() == ticket:
                fresh.update(caught_up)
        for stream_id in stream_ids:
            if stream_id not in fresh:
                try:
                    fresh[stream_id] = self._app.load(stream_id)
                except UprofError as error:
                    fresh[stream_id] = error
        return fresh

    def _apply(self, profile: SubjectProfile, pending: PendingCapture, now: Any) -> None:
        """Apply one request to the subject's copy, all or nothing."""
        try:
            for interaction in pending.interactions:
                # What profile.capture refuses, checked before anything is applied, and
                # before a retry is answered: a retry needs a consent in force now too.
                profile.require_capture_consent(interaction, now)
            if pending.batch_token:
                first = profile.recorded_request(
                    pending.batch_token, now=now, window_s=pending.token_window_s
                )
                if first is not None:
                    pending.replay_of = first
                    return
                refuse_unrecorded(pending.replay)
            ids, versions = [], []
            for interaction in pending.interactions:
                ids.append(profile.capture(interaction, now=now))
                versions.append(profile.version)
        except (ConsentRequiredError, SubjectErasedError) as error:
            pending.error = error
            return
        if pending.batch_token:
            profile.record_requests(
                {pending.batch_token: {"capture_ids": ids, "versions": versions}},
                now=now,
                window_s=pending.token_window_s,
            )
        pending.written = (ids, versions)

    def _audit_group(
        self,
        writing: list[PendingCapture],
        refused: list[PendingCapture],
        positions: dict[tuple[UUID, int], int],
    ) -> None:
        entries: list[tuple[str, dict[str, Any]]] = []
        for pending in writing:
            assert pending.written is not None
            first = pending.interactions[0]
            entries.append(
                (
                    "capture.accepted",
                    {
                        "subject_ref": pending.pseudonym,
                        "principal": pending.principal,
                        "app_id": first.app_id,
                        "agent_id": first.agent_id,
                        "purpose": first.purpose,
                        "counts": {"events": len(pending.written[0])},
                        "notification_id": max(
                            positions[(pending.stream, v)] for v in pending.written[1]
                        ),
                    },
                )
            )
        for pending in writing:
            entries.extend(capture_keys_created(pending.pseudonym, pending.key_commitments))
        entries.extend(refusal_entry(pending, "consent-not-in-force") for pending in refused)
        if entries:
            self._audit.record_many(entries)
