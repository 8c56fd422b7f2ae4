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

import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from domain.errors import (
    CaptureBackloggedError,
    ConsentRequiredError,
    SubjectErasedError,
    UprofError,
)
from domain.profile import SubjectProfile
from domain.values import Interaction
from uprof import retry, telemetry
from uprof.caching import BoundedCache, CacheStats
from uprof.crypto.keystore import KeyStore
from uprof.eventstore import ProfilesApplication
from uprof.ports import AuditTrail, Clock

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

    stream_id: UUID
    pseudonym: str
    interactions: Sequence[Interaction]
    batch_token: str | None
    token_window_s: float
    #: The asking principal's audit label: the writer thread has no request context.
    principal: str | None
    done: threading.Event = field(default_factory=threading.Event)
    #: (capture ids, their versions) once written; or the first write's token record.
    written: tuple[list[str], list[int]] | None = None
    replay_of: dict[str, Any] | None = None
    #: Filled by the writer before ``done`` is set (one of the three).
    acks: list[tuple[str, int]] | None = None
    replayed: bool = False
    error: BaseException | None = None
    #: The request's capture span (tracing on), which the group's span links to: a
    #: group works for many requests, so it is a child of none of them.
    trace_link: Any = None


#: Runs one request through the one-request path (the fallback after a lost group).
Fallback = Callable[[PendingCapture], None]


class CaptureWriter:
    """The group-commit writer thread; ``submit`` blocks until the request is answered."""

    def __init__(
        self,
        app: ProfilesApplication,
        keystore: KeyStore,
        clock: Clock,
        audit: AuditTrail,
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
        deadline = time.monotonic() + self._enqueue_timeout_s
        while True:
            # Checked and queued under the lock the thread's exit takes: nothing is
            # queued after the thread decided to end, so no waiter is left unanswered.
            with self._state:
                if not self.running:
                    break
                try:
                    self._queue.put_nowait(pending)
                    queued = True
                except queue.Full:
                    queued = False
            if queued:
                pending.done.wait()
                return
            if time.monotonic() >= deadline:
                raise CaptureBackloggedError(
                    f"the capture queue has been full for {self._enqueue_timeout_s:.0f} s; "
                    "nothing was stored"
                )
            time.sleep(0.001)
        self._fallback(pending)

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
                _log.exception("capture group failed")
                for pending in group:
                    if not pending.done.is_set():
                        pending.error = error
                        pending.done.set()

    def commit(self, group: list[PendingCapture]) -> None:
        """Write one group and answer its requests (the writer thread's step; tests call
        it to build a group deterministically)."""
        with telemetry.span(
            "uprof.capture.group",
            links=[p.trace_link for p in group],
            requests=len(group),
            subjects=len({p.stream_id for p in group}),
        ) as traced:
            outcome = self._commit(group)
            traced.set(
                outcome=outcome,
                captures=sum(len(p.acks or ()) for p in group if not p.replayed),
                refused=sum(1 for p in group if p.error is not None),
            )

    def _commit(self, group: list[PendingCapture]) -> str:
        """Commit the group, or (lost twice, or failed) each request alone; says which."""

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
            pending.done.set()
        return "one-by-one"

    def _reset(self, group: list[PendingCapture]) -> None:
        for pending in group:
            self._saved.pop(pending.stream_id)
            pending.written = pending.replay_of = None
            pending.error = None

    def _write_group(
        self, group: list[PendingCapture]
    ) -> tuple[list[PendingCapture], list[PendingCapture], dict[tuple[UUID, int], int]]:
        """Apply every request to its subject's copy; commit the keys, then the events.
        Returns the requests written, those refused, and the log position of each event."""
        by_stream: dict[UUID, list[PendingCapture]] = defaultdict(list)
        for pending in group:
            by_stream[pending.stream_id].append(pending)
        # Nothing is cached after an erasure forgot a subject since this ticket.
        ticket = self._saved.ticket()
        with self._app.writer_turns(by_stream):
            copies: dict[UUID, SubjectProfile] = {}
            profiles: dict[UUID, SubjectProfile] = {}  # the copies with captures to save
            refused: list[PendingCapture] = []
            now = self._clock.now()
            for stream_id, requests in by_stream.items():
                try:
                    profile = self._fresh_copy(stream_id, ticket)
                except UprofError as error:  # erased or unknown since it was resolved
                    for pending in requests:
                        pending.error = error
                    continue
                copies[stream_id] = profile
                for pending in requests:
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
                    self._keystore.create_capture_keys_many(keys, now=self._clock.now())
                with telemetry.span("uprof.capture.commit.events", subjects=len(profiles)) as t:
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
                    (c, positions[(pending.stream_id, v)])
                    for c, v in zip(ids, versions, strict=True)
                ]
            elif pending.replay_of is not None:
                first = pending.replay_of
                nids = self._app.notification_ids(pending.stream_id, first["versions"])
                pending.acks = list(zip(first["capture_ids"], nids, strict=True))
                pending.replayed = True
        self.groups += 1
        self.grouped_requests += len(group)
        for pending in group:
            pending.done.set()

    def _fresh_copy(self, stream_id: UUID, ticket: int) -> SubjectProfile:
        """The writer's saved copy brought up to the stream's head, or a fresh load.

        Taken out of the cache while in use: a group that fails leaves nothing cached
        that holds unsaved captures. Erased subjects are refused like a load refuses them.
        """
        profile = self._saved.take(stream_id)
        if profile is None:
            return self._app.load(stream_id)
        caught_up = self._app.catch_up(profile)
        # Not used if the subject was forgotten (erased) while we read its tail.
        if self._saved.ticket() != ticket:
            return self._app.load(stream_id)
        return caught_up

    def _apply(self, profile: SubjectProfile, pending: PendingCapture, now: Any) -> None:
        """Apply one request to the subject's copy, all or nothing."""
        if pending.batch_token:
            first = profile.recorded_request(
                pending.batch_token, now=now, window_s=pending.token_window_s
            )
            if first is not None:
                pending.replay_of = first
                return
        try:
            for interaction in pending.interactions:
                # What profile.capture refuses, checked before anything is applied.
                profile.require_capture_consent(interaction, now)
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
                            positions[(pending.stream_id, v)] for v in pending.written[1]
                        ),
                    },
                )
            )
        for pending in refused:
            first = pending.interactions[0]
            entries.append(
                (
                    "capture.refused",
                    {
                        "subject_ref": pending.pseudonym,
                        "principal": pending.principal,
                        "app_id": first.app_id,
                        "agent_id": first.agent_id,
                        "purpose": first.purpose,
                        "reason_code": "consent-not-in-force",
                    },
                )
            )
        if entries:
            self._audit.record_many(entries)
