"""One bounded, thread-safe LRU map for every in-process cache of uprof.

Every cache in a long-running server must have a bound (memory stays flat whatever
the number of subjects, captures or callers) and must stay correct when it evicts:
an evicted entry is simply loaded again from its store. Eviction by the bound is one
concern; invalidation (erasure, revocation) is the other, and it must win every race:

    ticket = cache.ticket()          # before reading the store
    value = load_from_store(key)
    cache.put(key, value, ticket=ticket)

``put`` with a ticket refuses to store when any invalidation (``pop``, ``pop_where``,
``clear``) happened since the ticket was taken, so a value read before an erasure can
never be cached after it (the caller still gets its value, read before the erasure).
A refused put only costs one more load later.

An ``OrderedDict`` keeps the recency order (optionally weighed by ``weigh``, e.g. the
rows a subject's view holds). ``cachetools.LRUCache`` was the alternative; it has no way
to look at a value without promoting it, which ``pop_where`` needs, and the whole map is
these few lines.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class CacheStats:
    """Counters of one cache since construction; ``size`` is its current weight."""

    name: str
    hits: int
    misses: int
    size: int
    maxsize: int


class BoundedCache(Generic[K, V]):
    """A thread-safe LRU map holding at most ``maxsize`` (entries, or weight with ``weigh``).

    With ``weigh``, ``max_entries`` may bound the number of entries as well. ``get`` marks
    an entry as the most recently used; ``put`` of a value heavier than the whole bound
    stores nothing (and returns False) rather than emptying the cache.
    """

    def __init__(
        self,
        maxsize: int,
        *,
        name: str = "",
        weigh: Callable[[V], int] | None = None,
        max_entries: int | None = None,
    ) -> None:
        if maxsize < 1 or (max_entries is not None and max_entries < 1):
            raise ValueError("a cache needs a bound of at least 1")
        self.name = name
        self._maxsize = maxsize
        self._max_entries = max_entries if max_entries is not None else maxsize
        #: key -> (value, weight), least recently used first.
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._weigh = weigh
        self._lock = threading.Lock()
        self._generation = 0
        self.hits = 0
        self.misses = 0

    # ------------------------------------------------------------------ reads

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            self._entries.move_to_end(key)
            return entry[0]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def maxsize(self) -> int:
        return self._maxsize

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @property
    def size(self) -> int:
        """Current weight (the number of entries when unweighed)."""
        with self._lock:
            return self._weight

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.name, self.hits, self.misses, self._weight, self._maxsize)

    def items(self) -> list[tuple[K, V]]:
        """A copy of the entries, least recently used first (for tests and tools)."""
        with self._lock:
            return [(k, v) for k, (v, _) in self._entries.items()]

    # ----------------------------------------------------------------- writes

    def ticket(self) -> int:
        """The invalidation count now: take it before reading what ``put`` will store."""
        with self._lock:
            return self._generation

    def put(self, key: K, value: V, *, ticket: int | None = None) -> bool:
        """Store one entry (evicting the least recently used); False when refused."""
        return self.put_many(((key, value),), ticket=ticket)

    def put_many(self, entries: Iterable[tuple[K, V]], *, ticket: int | None = None) -> bool:
        """Store entries in order (the last is the most recently used); False when refused
        because of an invalidation since ``ticket``."""
        with self._lock:
            if ticket is not None and ticket != self._generation:
                return False
            stored = True
            for key, value in entries:
                weight = 1 if self._weigh is None else max(1, int(self._weigh(value)))
                self._discard(key)
                if weight > self._maxsize:
                    stored = False
                    continue
                self._entries[key] = (value, weight)
                self._weight += weight
                while self._weight > self._maxsize or len(self._entries) > self._max_entries:
                    _, (_, oldest) = self._entries.popitem(last=False)
                    self._weight -= oldest
            return stored

    def _discard(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._weight -= entry[1]
        return entry[0]

    def take(self, key: K) -> V | None:
        """Remove and return one entry for the caller's own use (not an invalidation:
        fills in flight still store; use ``pop`` when the entry became wrong)."""
        with self._lock:
            return self._discard(key)

    def pop(self, key: K) -> V | None:
        """Invalidate one entry (and any fill in flight)."""
        with self._lock:
            self._generation += 1
            return self._discard(key)

    def pop_where(self, predicate: Callable[[K, V], bool]) -> int:
        """Invalidate every entry matching predicate (and any fill in flight); returns how many."""
        with self._lock:
            self._generation += 1
            doomed = [k for k, (v, _) in self._entries.items() if predicate(k, v)]
            for key in doomed:
                self._discard(key)
            return len(doomed)

    def clear(self) -> None:
        """Invalidate everything (and any fill in flight)."""
        with self._lock:
            self._generation += 1
            self._entries.clear()
            self._weight = 0
