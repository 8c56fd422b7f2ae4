"""InMemoryAuditStore: the AuditStore port in a list, hashed by the same RFC 9162 code."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from audit.canonical import canonical_bytes
from audit.entry import normalise_timestamp, validate_entry
from audit.log import AuditRecord, OnceBy, StoredEntry, once_keys
from audit.merkle import MerkleTree, leaf_hash
from domain.errors import InvalidInputError


class InMemoryAuditStore:
    """Entries and their Merkle tree in memory; the same validation and canonical bytes
    as ``audit.log.AuditLog``, so an entry the real log refuses is refused here too."""

    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._clock = clock
        self._entries: list[StoredEntry] = []
        self._actions: list[tuple[str, str | None, str | None]] = []
        self._tree = MerkleTree()

    def append(self, entry: Mapping[str, Any]) -> AuditRecord:
        return self.append_many([entry])[0]

    def holding(
        self,
        action: str,
        subject_refs: Iterable[str],
        field: str,
        values: Iterable[str | int],
    ) -> list[dict[str, Any]]:
        refs, wanted = set(subject_refs), set(values)
        return [
            dict(e.entry)
            for e in self._entries
            if e.entry["action"] == action
            and e.entry.get("subject_ref") in refs
            and e.entry.get(field) in wanted
        ]

    def append_many(
        self,
        entries: Iterable[Mapping[str, Any]],
        *,
        once_by: OnceBy = (),
        admitted: Callable[[], None] | None = None,
    ) -> list[AuditRecord]:
        if admitted is not None:
            admitted()
        if once_by:
            held = {key for e in self._entries for key in once_keys(e.entry, once_by)}
            kept = []
            for entry in entries:
                keys = once_keys(entry, once_by)
                if not all(key in held for key in keys):
                    held.update(keys)
                    kept.append(entry)
            entries = kept
        prepared = []
        for entry in entries:  # validate all first: all or nothing
            validate_entry(entry)
            stored = dict(entry)
            stored["recorded_at"] = normalise_timestamp(
                stored.get("recorded_at") or self._clock(), "recorded_at"
            )
            prepared.append(stored)
        records = []
        for stored in prepared:
            canonical = canonical_bytes(stored)
            leaf = leaf_hash(canonical)
            index = self._tree.append(leaf)
            self._entries.append(
                StoredEntry(index, stored["recorded_at"], canonical.decode("utf-8"), leaf)
            )
            self._actions.append(
                (stored["action"], stored.get("subject_ref"), stored.get("app_id"))
            )
            records.append(AuditRecord(index, leaf))
        return records

    def size(self) -> int:
        return self._tree.size

    def _checked(self, tree_size: int | None) -> int:
        if tree_size is None:
            return self._tree.size
        if not 0 <= tree_size <= self._tree.size:
            raise InvalidInputError(f"tree_size {tree_size} is outside 0..{self._tree.size}")
        return tree_size

    def root(self, tree_size: int | None = None) -> bytes:
        return self._tree.root(self._checked(tree_size))

    def inclusion_proof(self, leaf_index: int, tree_size: int | None = None) -> list[bytes]:
        size = self._checked(tree_size)
        if not 0 <= leaf_index < size:
            raise InvalidInputError(f"leaf_index {leaf_index} is outside the tree of size {size}")
        return self._tree.inclusion_proof(leaf_index, size)

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
        low = normalise_timestamp(since, "since") if since is not None else None
        high = normalise_timestamp(until, "until") if until is not None else None
        for stored, (act, subject, app) in zip(self._entries, self._actions, strict=True):
            if stored.leaf_index <= after_leaf:
                continue
            if tree_size is not None and stored.leaf_index >= tree_size:
                return
            if subject_ref is not None and subject != subject_ref:
                continue
            if app_id is not None and app != app_id:
                continue
            if action is not None and act != action:
                continue
            if low is not None and stored.recorded_at < low:
                continue
            if high is not None and stored.recorded_at >= high:
                continue
            yield stored
