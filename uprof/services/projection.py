"""Drive the read-model projections: catch up, report lag, wait, rebuild."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Notification

from domain.errors import UprofError
from uprof import retry, telemetry
from uprof.crypto.mapper import DamagedEventError
from uprof.partitions import Partitioning, owned_or_all
from uprof.ports import EventStore, MemoryEmbedding, ViewStore

Progress = Callable[[int, int], None]
_log = logging.getLogger(__name__)


@dataclass
class _Batch:
    """Notifications read after ``start`` (a partition's position), decoded, with the
    embeddings of their memories being computed in the embedding thread."""

    start: int
    notifications: Sequence[Notification]
    events: list[tuple[int, Any]]
    vectors: Future[dict[str, bytes]]

    @property
    def end(self) -> int:
        return int(self.notifications[-1].id)


class ProjectionRunner:
    """Catch-up loop over the profiles log (SQLite has no notification channel).

    It writes through the ``ViewStore`` port (SQL in production, the in-memory fake in
    the unit tier) and embeds through ``embed_memories``, which is not storage.

    Safe with any number of runners in any number of processes: a batch locks its
    position row, re-reads it and applies only what lies beyond it (``apply_batch``).
    With ``partitioning`` of M, partition k's events go to k's own position row; this
    runner runs the ``partitions`` it is given (all by default) and answers the
    positions of every partition.

    The model runs ahead in one embedding thread (``embed_ahead``, the default): while
    this thread writes batch N's rows, the model embeds batch N+1, read from where N
    ends. Only the model runs there (on texts already decoded here; no database work),
    and batch N+1 is used only if the position is still N's end when its turn comes;
    otherwise it is dropped and re-read, so the commit boundary, and exactly-once, are
    those of one batch as before. The profile (docs/performance.md) spends three
    quarters of a worker's time in the model, and with one torch thread the rest of the
    batch (extraction, view SQL) no longer waits for it.
    """

    def __init__(
        self,
        app: EventStore,
        views: ViewStore,
        embed_memories: MemoryEmbedding,
        batch_size: int = 256,
        *,
        partitioning: Partitioning | None = None,
        partitions: Sequence[int] | None = None,
        embed_ahead: bool = True,
        set_aside: Callable[[Sequence[int]], set[int]] | None = None,
        on_damaged: Callable[[Notification], Any] | None = None,
    ) -> None:
        self._app = app
        #: Which of these captures the log holds a verdict setting aside as damaged
        #: (``QuarantineIndex.set_aside_among``); None: every damaged event stops projection.
        self._set_aside = set_aside
        #: Sets aside a damaged event met without a verdict (``DamagedEvents.set_aside``):
        #: None when it did (pass over it), else the event as it reads now; None: stop.
        self._on_damaged = on_damaged
        self._views = views
        self._embed_memories = embed_memories
        self._batch_size = batch_size
        self._partitioning = partitioning or Partitioning()
        self._owned = owned_or_all(self._partitioning, partitions)
        self._embed_ahead = embed_ahead
        #: One thread: batches are embedded in log order, one model call at a time.
        self._embedding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uprof-embed")
        #: Partition -> the batch read ahead of its position (at most one each).
        self._ahead: dict[int, _Batch] = {}
        #: Batches read ahead but not used: the position was not where they start.
        self.read_ahead_dropped = 0
        #: Memories projected without a vector: the model failed on them every time.
        self.left_unembedded = 0
        # Created up front: batches lock their position row, so it must exist.
        self._views.ensure_positions(self._position_names(), self._app.name)

    def position_name(self, k: int) -> str:
        return self._partitioning.name(self._views.name, k)

    def _position_names(self) -> list[str]:
        """Every partition's position name (owned or not)."""
        return self._partitioning.names(self._views.name)

    def partition_position(self, k: int) -> int:
        return self._views.position(self.position_name(k), self._app.name)

    @property
    def position(self) -> int:
        """The lowest position of every partition: the whole log up to it is projected."""
        if self._partitioning.count == 1:
            return self.partition_position(0)
        return self._views.lowest_position(self._position_names(), self._app.name)

    @property
    def highest_position(self) -> int:
        """The highest position of every partition (what the views claim to hold)."""
        return max(self.partition_position(k) for k in self._partitioning.all)

    def position_for(self, stream_id: UUID) -> int:
        """How far the subject's events are projected (its partition's position)."""
        return self.partition_position(self._partitioning.of(stream_id))

    def lag(self) -> int:
        """Notifications recorded but not yet projected (by the slowest partition)."""
        return max(0, self._app.max_notification_id() - self.position)

    def pending_by_partition(self) -> tuple[tuple[int, int], ...]:
        """Every partition's (owned or not) position and notifications not yet projected
        by it, in partition order."""
        head = self._app.max_notification_id()
        positions = [self.partition_position(k) for k in self._partitioning.all]
        return tuple((position, max(0, head - position)) for position in positions)

    def run_once(self) -> int:
        """Project one batch per owned partition; returns how many notifications it consumed."""
        return sum(self._run_partition(k) for k in self._owned)

    def _run_partition(self, k: int) -> int:
        start = self.partition_position(k)
        batch = self._ahead.pop(k, None)
        if batch is not None and batch.start != start:
            # Another runner moved the position, or the batch before this one did not
            # commit: applying it would skip or redo what lies between. Read anew.
            self.read_ahead_dropped += 1
            batch = None
        if batch is None:
            batch = self._read(k, start)
            if batch is None:
                return 0
        if self._embed_ahead and len(batch.notifications) == self._batch_size:
            # A full batch: the log may go on, so let the model start on what follows.
            following = self._read(k, batch.end)
            if following is not None:
                self._ahead[k] = following
        with telemetry.span(
            "uprof.projection.batch",
            partition=k,
            notifications=len(batch.notifications),
            events=len(batch.events),
        ):
            with telemetry.span("uprof.projection.embed"):
                vectors = batch.vectors.result()  # started when the batch was read
            with telemetry.span("uprof.projection.apply"):
                self._views.apply_batch(
                    self._app.name,
                    batch.events,
                    batch.end,
                    vectors,
                    projection_name=self.position_name(k),
                    read_after=batch.start,
                )
        return len(batch.notifications)

    def _read(self, k: int, start: int) -> _Batch | None:
        """Read and decode partition k's notifications after ``start`` (the whole batch
        moves the position, other partitions' included) and start embedding them."""
        notifications = self._app.notifications_after(start, self._batch_size)
        if not notifications:
            return None
        of = self._partitioning.of
        mine = [
            n for n in notifications if self._partitioning.count == 1 or of(n.originator_id) == k
        ]
        aside = self._aside(mine)
        events = [
            (n.id, event)
            for n in mine
            if int(n.id) not in aside
            if (event := self._decode(n)) is not None
        ]
        # Embedded outside the write transaction (the views database is not locked while
        # the model runs), in the embedding thread so that this one can go on.
        vectors = self._embedding.submit(self._embed_or_leave_out, [e for _, e in events])
        return _Batch(start, notifications, events, vectors)

    def _aside(self, notifications: Sequence[Notification]) -> set[int]:
        """The damaged events among these that the log sets aside: passed over, not
        projected, whether or not they open now (a row repaired by hand), so that live
        runs and rebuilds pass over the same events and rebuilt views equal live ones
        (decision 0124-damaged-events-quarantined). One head read when nothing is new."""
        if self._set_aside is None or not notifications:
            return set()
        return self._set_aside([int(n.id) for n in notifications])

    def _decode(self, notification: Notification) -> Any:
        """The notification's event; None when it is damaged and now set aside. An event
        damaged after it was extracted (or of another kind than a capture) has no verdict
        when a projection, a rebuild above all, meets it: it stopped every later event
        of the partition from being projected (bug DC). ``on_damaged`` records the
        verdict on the log first (once across processes, as the extraction's), so every
        later run and rebuild passes over it alike."""
        try:
            return self._app.decode(notification)
        except DamagedEventError:
            if self._on_damaged is None:
                raise
            return self._on_damaged(notification)

    def _embed_or_leave_out(self, events: Sequence[Any]) -> dict[str, bytes]:
        """The batch's vectors; when the model fails on the batch, each memory on its own
        (``retry.EMBEDDING_CALL``'s attempts), and a memory it fails on every time gets no
        vector: it is projected and served by its words only, and the rest of the log is
        projected after it (a model error that repeats for one text stopped projection
        for the whole partition). A rebuild meets the same error and leaves out the same
        vector. Refusals of ours (``UprofError``: another model recorded) stay refusals."""
        try:
            return self._embed_memories(events)
        except UprofError:
            raise
        except Exception as error:
            _log.warning(
                "embedding a batch failed (%s); embedding its memories one by one",
                type(error).__name__,
            )
        vectors: dict[str, bytes] = {}
        for event in events:
            try:
                vectors.update(retry.EMBEDDING_CALL.call(partial(self._embed_memories, [event])))
            except UprofError:
                raise
            except Exception as error:
                self.left_unembedded += 1
                _log.warning(
                    "memory %s projected without its vector: the model failed with %s "
                    "after %d attempts",
                    getattr(event, "item_id", "?"),
                    type(error).__name__,
                    retry.EMBEDDING_CALL.attempts,
                )
        return vectors

    def forget_read_ahead(self) -> None:
        """Drop batches read ahead (decoded content held in memory; erasure calls this)."""
        self._ahead.clear()

    def close(self) -> None:
        """Stop the embedding thread (a model call in progress is finished first)."""
        self._ahead.clear()
        self._embedding.shutdown(wait=True, cancel_futures=True)

    def run_until_idle(self, progress: Progress | None = None) -> int:
        total = 0
        target = self._app.max_notification_id()
        while consumed := self.run_once():
            total += consumed
            if progress is not None:
                progress(self.position, max(target, self.position))
        return total

    def run_until(self, target: int) -> int:
        """Project the owned partitions until each has passed ``target`` (or has nothing
        left to read); what other processes append meanwhile is left to the workers, so
        this ends under any write load (``run_until_idle`` ends only when the log stops
        growing)."""
        total = 0
        while any(self.partition_position(k) < target for k in self._owned):
            consumed = self.run_once()
            if not consumed:
                break
            total += consumed
        return total

    def wait_for(self, notification_id: int, timeout_s: float) -> bool:
        """Wait until the projection has passed ``notification_id``; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.position < notification_id:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def reset(self) -> None:
        """Drop every view row and reset the position, so a rebuild starts from event 1."""
        self._ahead.clear()
        self._views.reset(self._position_names())

    def rebuild(self, progress: Progress | None = None) -> int:
        """Reset every partition and replay the log into all of them (owned or not:
        the views were dropped for every subject), up to the log's end when it started.

        What is appended meanwhile is left to the runners, which carry on from the
        positions the replay leaves (guarded, so each event is still projected once):
        replaying until the log stopped growing never ended beside a live server
        (decision 0108-rebuild-beside-live-traffic)."""
        target = self._app.max_notification_id()
        self.reset()
        total = 0
        while behind := [k for k in self._partitioning.all if self.partition_position(k) < target]:
            consumed = sum(self._run_partition(k) for k in behind)
            if not consumed:
                break
            total += consumed
            if progress is not None:
                progress(self.position, max(target, self.position))
        return total
