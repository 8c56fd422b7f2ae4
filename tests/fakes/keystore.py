"""InMemoryKeyStore: the SubjectKeyStore port in dictionaries (no wrapping, no SQL)."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from domain.errors import SubjectErasedError
from uprof.crypto.keystore import (
    DestroyedKey,
    Destruction,
    StreamHead,
    SubjectHandle,
    dek_commitment,
    new_pseudonym,
)
from uprof.crypto.ledger import ErasureLedger


class InMemoryKeyStore:
    """Subjects, data keys and capture keys in memory; destroying a key deletes it.

    The keys are real AES keys (the event store's mapper seals with them); what the SQL
    store adds (HMAC-hashed index rows, AES-KW wrapping under a KEK ring, caches) is
    at-rest protection, which a process-local fake does not need.
    """

    def __init__(self, ledger: ErasureLedger | None = None) -> None:
        self.ledger = ledger
        self._lock = threading.Lock()
        self._index: dict[tuple[str, str], tuple[uuid.UUID, str]] = {}
        self._tenants: dict[uuid.UUID, str] = {}
        self._aliases: dict[tuple[str, str, str], uuid.UUID] = {}
        self._deks: dict[str, dict[int, bytes]] = {}
        self._capture_keys: dict[tuple[str, str], bytes] = {}
        self._shredded: set[str] = set()
        self._destroyed: dict[tuple[str, int], tuple[str | None, str]] = {}
        self._captures_destroyed: dict[tuple[str, str], tuple[str | None, str]] = {}
        self._plain_row_keys = {1: AESGCM.generate_key(bit_length=256)}
        self._heads: dict[tuple[str, str], StreamHead] = {}

    def _handle(self, stream_id: uuid.UUID, *, created: bool = False) -> SubjectHandle | None:
        for (_, _), (sid, pseudonym) in self._index.items():
            if sid == stream_id:
                return SubjectHandle(sid, pseudonym, created=created)
        return None

    def pseudonym(self, tenant: str, subject_ref: str) -> str:
        found = self.resolve(tenant, subject_ref)
        return found.pseudonym if found is not None else new_pseudonym()

    def resolve(
        self, tenant: str, subject_ref: str, *, max_age_s: float = 0.0
    ) -> SubjectHandle | None:
        row = self._index.get((tenant, subject_ref))
        return None if row is None else SubjectHandle(row[0], row[1], created=False)

    def resolve_many(self, tenant: str, subject_refs: Iterable[str]) -> dict[str, SubjectHandle]:
        found = {ref: self.resolve(tenant, ref) for ref in subject_refs}
        return {ref: h for ref, h in found.items() if h is not None}

    def resolve_or_create(self, tenant: str, subject_ref: str, *, now: datetime) -> SubjectHandle:
        with self._lock:
            found = self.resolve(tenant, subject_ref)
            if found is not None:
                return found
            stream_id = uuid.uuid4()
            pseudonym = new_pseudonym()
            self._index[(tenant, subject_ref)] = (stream_id, pseudonym)
            self._tenants[stream_id] = tenant
            dek = AESGCM.generate_key(bit_length=256)
            self._deks[str(stream_id)] = {1: dek}
            commitment = dek_commitment(str(stream_id), 1, dek)
            return SubjectHandle(stream_id, pseudonym, created=True, dek_commitment=commitment)

    def stream_ids(self, tenant: str | None = None) -> list[uuid.UUID]:
        return [sid for (t, _), (sid, _) in self._index.items() if tenant is None or t == tenant]

    def bind_alias(
        self, tenant: str, kind: str, alias: str, stream_id: uuid.UUID, *, now: datetime
    ) -> bool:
        with self._lock:
            if self._tenants.get(stream_id) != tenant or self._handle(stream_id) is None:
                return False  # no live subject's stream: nothing bound (as the real store)
            self._aliases[(tenant, kind, alias)] = stream_id
            return True

    def resolve_alias(self, tenant: str, kind: str, alias: str) -> SubjectHandle | None:
        stream_id = self._aliases.get((tenant, kind, alias))
        return None if stream_id is None else self._handle(stream_id)

    def current_key(self, stream_id: str) -> tuple[int, bytes]:
        keys = self._deks.get(stream_id)
        if not keys:
            raise SubjectErasedError("this subject's keys have been destroyed")
        version = max(keys)
        return version, keys[version]

    def key(self, stream_id: str, version: int) -> bytes | None:
        return self._deks.get(stream_id, {}).get(version)

    def view_key(self, stream_id: str) -> bytes | None:
        deks = self._deks.get(stream_id)
        if not deks:
            return None
        return HKDF(
            algorithm=hashes.SHA256(), length=64, salt=None, info=b"uprof/view-fields/1"
        ).derive(deks[min(deks)])

    def create_capture_keys(
        self, stream_id: str, capture_ids: list[str], *, now: datetime
    ) -> dict[str, str]:
        return self.create_capture_keys_many({stream_id: capture_ids}, now=now)

    def create_capture_keys_many(
        self, capture_ids: Mapping[str, Sequence[str]], *, now: datetime
    ) -> dict[str, str]:
        for stream_id in capture_ids:
            self.current_key(stream_id)  # refuses a shredded stream before creating any
        commitments: dict[str, str] = {}
        for stream_id, ids in capture_ids.items():
            for cid in ids:
                self._capture_keys[(stream_id, cid)] = AESGCM.generate_key(bit_length=256)
                commitment = self.capture_key_commitment(stream_id, cid)
                assert commitment is not None
                commitments[cid] = commitment
        return commitments

    def capture_key(self, stream_id: str, capture_id: str) -> bytes | None:
        if not self._deks.get(stream_id):
            return None
        return self._capture_keys.get((stream_id, capture_id))

    def capture_key_commitment(self, stream_id: str, capture_id: str) -> str | None:
        key = self._capture_keys.get((stream_id, capture_id))
        if key is None:
            return None
        return hashlib.sha256(b"capture-key-commit" + capture_id.encode() + key).hexdigest()

    def destroy_capture_key(
        self, stream_id: str, capture_id: str, *, request_id: str | None = None
    ) -> str | None:
        with self._lock:
            key = self._capture_keys.pop((stream_id, capture_id), None)
            if key is None:
                return None
            commitment = hashlib.sha256(
                b"capture-key-commit" + capture_id.encode() + key
            ).hexdigest()
            self._captures_destroyed.setdefault((stream_id, capture_id), (request_id, commitment))
        return commitment

    def capture_keys_destroyed_by(
        self, stream_id: str, capture_ids: Iterable[str]
    ) -> dict[str, tuple[str | None, str]]:
        with self._lock:
            return {
                c: self._captures_destroyed[(stream_id, c)]
                for c in capture_ids
                if (stream_id, c) in self._captures_destroyed
            }

    def destruction_preview(self, stream_id: str) -> Destruction:
        with self._lock:
            deks = dict(self._deks.get(stream_id, {}))
            captures = [k for k in self._capture_keys if k[0] == stream_id]
            aliases = [k for k, sid in self._aliases.items() if str(sid) == stream_id]
        return Destruction(
            deks=tuple(
                DestroyedKey(v, dek_commitment(stream_id, v, dek))
                for v, dek in sorted(deks.items())
            ),
            capture_keys=len(captures),
            aliases=len(aliases),
        )

    def destroy(
        self, stream_id: str, *, now: datetime, request_id: str | None = None
    ) -> Destruction:
        with self._lock:
            deks = self._deks.pop(stream_id, {})
            for v, dek in deks.items():
                self._destroyed.setdefault(
                    (stream_id, v), (request_id, dek_commitment(stream_id, v, dek))
                )
            captures = [k for k in self._capture_keys if k[0] == stream_id]
            for k in captures:
                commitment = hashlib.sha256(
                    b"capture-key-commit" + k[1].encode() + self._capture_keys.pop(k)
                ).hexdigest()
                self._captures_destroyed.setdefault(k, (request_id, commitment))
            aliases = [k for k, sid in self._aliases.items() if str(sid) == stream_id]
            for a in aliases:
                del self._aliases[a]
            for ref, (sid, _) in list(self._index.items()):
                if str(sid) == stream_id:
                    del self._index[ref]
            self._shredded.add(stream_id)
            self._heads = {k: h for k, h in self._heads.items() if k[1] != stream_id}
        return Destruction(
            deks=tuple(
                DestroyedKey(v, dek_commitment(stream_id, v, dek))
                for v, dek in sorted(deks.items())
            ),
            capture_keys=len(captures),
            aliases=len(aliases),
        )

    def destroyed_by(self, stream_id: str) -> dict[int, tuple[str | None, str]]:
        with self._lock:
            return {v: by for (sid, v), by in self._destroyed.items() if sid == stream_id}

    def evict(self, stream_id: str) -> None:
        """Nothing is cached."""

    def is_shredded(self, stream_id: str) -> bool:
        return stream_id in self._shredded

    def shredded_among(self, stream_ids: Iterable[str]) -> set[str]:
        return set(stream_ids) & self._shredded

    def plain_row_key(self, key_id: int) -> bytes | None:
        return self._plain_row_keys.get(key_id)

    def current_plain_row_key(self) -> tuple[int, bytes]:
        key_id = max(self._plain_row_keys)
        return key_id, self._plain_row_keys[key_id]

    def stream_head(self, log_id: str, stream_id: str) -> StreamHead | None:
        return self._heads.get((log_id, stream_id))

    def stream_heads_of(self, log_id: str, stream_ids: Iterable[str]) -> dict[str, StreamHead]:
        return {s: h for s in stream_ids if (h := self._heads.get((log_id, s))) is not None}

    def raise_stream_heads(self, log_id: str, heads: Iterable[StreamHead]) -> None:
        with self._lock:
            for head in heads:
                held = self._heads.get((log_id, head.stream_id))
                if head.stream_id not in self._shredded and (
                    held is None
                    or (
                        held.version < head.version
                        and (held.version, held.digest) == (head.over_version, head.over_digest)
                    )
                ):
                    self._heads[(log_id, head.stream_id)] = StreamHead(
                        head.stream_id, head.version, head.digest
                    )

    def move_stream_heads(self, log_id: str, moves: Iterable[tuple[StreamHead, str]]) -> int:
        moved = 0
        with self._lock:
            for head, digest in moves:
                if self._heads.get((log_id, head.stream_id)) == head:
                    self._heads[(log_id, head.stream_id)] = StreamHead(
                        head.stream_id, head.version, digest
                    )
                    moved += 1
        return moved

    def replace_stream_heads(self, log_id: str, heads: Iterable[StreamHead]) -> int:
        with self._lock:
            fresh = {(log_id, h.stream_id): h for h in heads if h.stream_id not in self._shredded}
            self._heads = fresh  # every other log's anchors go (bug GN)
            return len(fresh)
