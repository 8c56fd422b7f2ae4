"""Key store: random stream ids, per-subject data keys, per-capture keys, a KEK ring.

Hierarchy (FIELD-NOTES §3.4)::

    KEK ring (random keys with epochs; a mode-0600 file, or a KMS later)
      └─ subject DEK (AES-256, one per stream and version, stored AES-KW wrapped by the KEK)
           └─ capture key (AES-256, one per captured event, AES-KW wrapped by the subject DEK)

The master secret derives only the lookup keys (subject index, aliases, erased
marks). Pseudonyms are random per subject incarnation and stored in the index row:
a subject re-created after erasure gets a new one that nothing links to the old.
Destroying a subject's DEK rows makes every event of that stream unreadable,
wherever copies of the events live; destroying one capture key shreds that one
event and every extracted item sealed under it. KEK rotation re-wraps the DEKs
under a new epoch and forgets the old KEK, so key-store backups older than the
rotation can no longer unwrap anything.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap, aes_key_wrap

from domain.errors import SubjectErasedError
from uprof.backends import reading_connection
from uprof.caching import BoundedCache, CacheStats
from uprof.crypto.ledger import ErasureLedger
from uprof.crypto.tables import (
    capture_keys,
    destroyed_capture_keys,
    destroyed_keys,
    plain_row_keys,
    shredded_streams,
    stream_heads,
    subject_aliases,
    subject_index,
    subject_keys,
)
from uprof.ports import KeyMaterialStore

#: Recent subject lookups kept for reads (bounded: memory stays flat). Reads reuse a
#: lookup for 2 s only, so this needs to cover what a server looks up in 2 s.
MAX_CACHED_HANDLES = 2_048
#: Subjects whose unwrapped DEKs, and whose derived view keys, are kept.
MAX_CACHED_DEKS = 4_096
MAX_CACHED_VIEW_KEYS = 4_096
#: Capture keys kept (one per captured event; a miss reloads the stream's keys at once,
#: up to a quarter of this bound). Each entry costs about 400 bytes; 16,384 of them
#: (6.5 MB) cover the captures a server is decrypting at a time (the pipeline's batch, the
#: subjects whose aggregates it loads), and the entries are cheap to reload: one indexed
#: query and an AES key unwrap per key (docs/performance.md, "Memory").
MAX_CACHED_CAPTURE_KEYS = 16_384


def derive_key(master: bytes, label: str) -> bytes:
    """Derive a 32-byte key for one purpose from the master secret."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label.encode()).derive(master)


def dek_commitment(stream_id: str, key_version: int, wrapped_dek: bytes) -> str:
    """Commit to a wrapped DEK without revealing it (FIELD-NOTES §5.6)."""
    h = hashlib.sha256()
    h.update(b"dek-commit")
    h.update(stream_id.encode())
    h.update(key_version.to_bytes(4, "big"))
    h.update(wrapped_dek)
    return h.hexdigest()


class KekRing:
    """Key-encryption keys by epoch, kept by a ``KeyMaterialStore`` (the key folder).

    Only the newest epoch wraps; older epochs stay until a rotation has re-wrapped
    every DEK, then they are deleted from the store.

    Another process may rotate while this one runs (``uprof keys rotate`` beside a
    server): the ring held here is then stale. So a key is wrapped only under the
    store's ring as read under the store's shared ``ring_lock`` (``wrapping``), a
    rotation starts from the store's ring under the exclusive lock (``rotating``), and
    an epoch missing here is read again from the store before it counts as forgotten.
    """

    def __init__(self, store: KeyMaterialStore) -> None:
        self._store = store
        self.keys = store.load_kek_ring()

    @property
    def current_epoch(self) -> int:
        return max(self.keys)

    def kek_id(self, epoch: int) -> str:
        return f"kek-{epoch}"

    def reload(self) -> None:
        """Take the ring as the store holds it now (another process may have rotated)."""
        self.keys = self._store.load_kek_ring()

    @contextmanager
    def wrapping(self) -> Iterator[tuple[str, bytes]]:
        """(kek id, KEK) of the store's newest epoch, held until the wrapped key is
        stored: a rotation waits, then re-wraps it with the others."""
        with self._store.ring_lock(exclusive=False):
            self.reload()
            epoch = self.current_epoch
            yield self.kek_id(epoch), self.keys[epoch]

    @contextmanager
    def rotating(self) -> Iterator[None]:
        """Held for a whole rotation, from the store's ring: no key is wrapped meanwhile."""
        with self._store.ring_lock(exclusive=True):
            self.reload()
            yield

    def key_for(self, kek_id: str) -> bytes:
        epoch = int(kek_id.removeprefix("kek-"))
        if epoch not in self.keys:
            self.reload()  # rotated by another process since this one read the ring
        try:
            return self.keys[epoch]
        except KeyError:
            raise SubjectErasedError(f"key-encryption key {kek_id} no longer exists") from None

    def add_epoch(self) -> int:
        epoch = self.current_epoch + 1
        keys = dict(self.keys)
        keys[epoch] = AESGCM.generate_key(bit_length=256)
        self._store.save_kek_ring(keys)
        self.keys = keys
        return epoch

    def forget_before(self, epoch: int) -> list[int]:
        forgotten = sorted(e for e in self.keys if e < epoch)
        self._store.save_kek_ring({e: k for e, k in self.keys.items() if e >= epoch})
        self.keys = self._store.load_kek_ring()
        return forgotten


@dataclass(frozen=True)
class SubjectHandle:
    """Where a subject's data lives: its stream and its pseudonymous reference."""

    stream_id: uuid.UUID
    pseudonym: str
    created: bool
    #: The first data key's commitment, on the handle that created the subject only
    #: (what its ``key.created`` audit entry records; FIELD-NOTES §5.6).
    dek_commitment: str | None = None


def _capture_commitment(capture_id: str, wrapped_key: bytes) -> str:
    """A commitment to one capture's wrapped key, cited by a receipt once it is destroyed."""
    return hashlib.sha256(b"capture-key-commit" + capture_id.encode() + wrapped_key).hexdigest()


@dataclass(frozen=True)
class StreamHead:
    """A stream's newest version known committed, and the digest of that row
    (``uprof.eventstore.head_digest``)."""

    stream_id: str
    version: int
    digest: str
    #: For a raise: the anchor its writer found whole (its row still there, digest
    #: equal) below the rows it raises to; version 0 when there was none. The anchor is
    #: raised only from exactly that one (bug GM). Not stored.
    over_version: int = field(default=0, compare=False)
    over_digest: str = field(default="", compare=False)


@dataclass(frozen=True)
class DestroyedKey:
    key_version: int
    dek_commitment: str


@dataclass(frozen=True)
class Destruction:
    """What destroying a stream's keys removed (for the receipt)."""

    deks: tuple[DestroyedKey, ...]
    capture_keys: int
    aliases: int


def _record_capture_keys_destroyed(
    conn: sa.Connection,
    stream_id: str,
    commitments: Mapping[str, str],
    request_id: str | None,
    now: datetime,
) -> None:
    """Record capture keys a DELETE of this transaction removed as ``request_id``'s; a
    row an older destroy of the same key left (a key folder put back from a copy) keeps
    the first word."""
    c = destroyed_capture_keys.c
    ids = sorted(commitments)
    known: set[str] = set()
    for i in range(0, len(ids), 500):  # a whole subject's capture keys: bounded IN lists
        chunk = ids[i : i + 500]
        known |= set(conn.execute(sa.select(c.capture_id).where(c.capture_id.in_(chunk))).scalars())
    fresh = [
        {
            "capture_id": capture_id,
            "stream_id": stream_id,
            "key_commitment": commitment,
            "request_id": request_id,
            "destroyed_at": now,
        }
        for capture_id, commitment in sorted(commitments.items())
        if capture_id not in known
    ]
    if fresh:
        conn.execute(destroyed_capture_keys.insert(), fresh)


def new_pseudonym() -> str:
    """A random pseudonym: linked to a subject only by its index row (deleted at erasure)."""
    return "subj_" + secrets.token_hex(16)


_PSEUDONYM = re.compile(r"subj_[0-9a-f]{32}")


def is_pseudonym(text: str) -> bool:
    """Whether ``text`` has the exact shape ``new_pseudonym`` draws."""
    return _PSEUDONYM.fullmatch(text) is not None


# Statements the capture writer runs for every group, built once: building a statement
# and its cache key costs SQLAlchemy more than the query costs SQLite.
_HANDLES_OF = sa.select(
    subject_index.c.ref_hash, subject_index.c.stream_id, subject_index.c.pseudonym
).where(subject_index.c.ref_hash.in_(sa.bindparam("ref_hashes", expanding=True)))
_SHREDDED_AMONG = sa.select(shredded_streams.c.stream_id).where(
    shredded_streams.c.stream_id.in_(sa.bindparam("stream_ids", expanding=True))
)
_INSERT_CAPTURE_KEYS = capture_keys.insert()
# Raise a stream's anchor, never lower it (several processes append to one stream and
# write their anchors in any order): the same text on SQLite and PostgreSQL. PostgreSQL
# locks the conflicting row and re-evaluates the WHERE on its newest version, SQLite
# holds its write lock: of two racers the higher version wins whichever commits last.
# A stream already shredded gets none (an appender that committed before the erasure's
# tombstone may anchor after ``destroy`` deleted the anchor). And only over the anchor
# its writer checked against the event store (``StreamHead.over_version``): a writer
# that does not load (a cached copy, a verdict at ``head + 1``) may have appended into
# a slot someone emptied, and raising over an anchor nobody checked would launder the
# cut (bug GM); another writer's raise in between leaves this one lagging, which is safe.
_RAISE_STREAM_HEAD = sa.text(
    "INSERT INTO stream_heads (log_id, stream_id, version, digest) "
    "SELECT CAST(:log_id AS VARCHAR(32)), CAST(:stream_id AS VARCHAR(36)), "
    "CAST(:version AS INTEGER), CAST(:digest AS VARCHAR(64)) WHERE NOT EXISTS "
    "(SELECT 1 FROM shredded_streams WHERE stream_id = CAST(:stream_id AS VARCHAR(36))) "
    "ON CONFLICT (log_id, stream_id) DO UPDATE SET version = excluded.version, "
    "digest = excluded.digest WHERE stream_heads.version < excluded.version "
    "AND stream_heads.version = CAST(:over_version AS INTEGER) "
    "AND stream_heads.digest = CAST(:over_digest AS VARCHAR(64))"
)


class KeyStore:
    """Resolve subjects to streams and hand out their keys (cached, evicted on erasure)."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        master_secret: bytes,
        kek_ring: KekRing,
        ledger: ErasureLedger | None = None,
    ) -> None:
        if len(master_secret) < 32:
            raise ValueError("the master secret must be at least 32 bytes")
        self._engine = engine
        self._ring = kek_ring
        self._index_key = derive_key(master_secret, "uprof/subject-index/1")
        #: The erasure ledger (kept with the key material); None: erasures are not
        #: remembered by name (only tests that build a bare key store).
        self.ledger = ledger
        # Every cache is bounded (uprof.caching); evict() empties a stream from all of
        # them, and fills carry a ticket so that a load racing an erasure is not cached.
        #: stream -> {key version: DEK}
        self._deks: BoundedCache[str, dict[int, bytes]] = BoundedCache(
            MAX_CACHED_DEKS, name="subject-deks"
        )
        #: (stream, capture id) -> capture key
        self._capture_keys: BoundedCache[tuple[str, str], bytes] = BoundedCache(
            MAX_CACHED_CAPTURE_KEYS, name="capture-keys"
        )
        #: stream -> view-field key
        self._view_keys: BoundedCache[str, bytes] = BoundedCache(
            MAX_CACHED_VIEW_KEYS, name="view-keys"
        )
        #: ref hash -> (when looked up, handle): recent lookups, for reads only.
        self._handles: BoundedCache[str, tuple[float, SubjectHandle]] = BoundedCache(
            MAX_CACHED_HANDLES, name="subject-handles"
        )
        #: key id -> the deployment's plain-row key (a handful, never destroyed: a KEK
        #: rotation re-wraps them, the keys stay the same), and the newest id.
        self._plain_row_keys: dict[int, bytes] = {}
        self._plain_row_current: int | None = None

    # ---------------------------------------------------------------- subjects

    def _ref_hash(self, tenant: str, subject_ref: str) -> str:
        msg = f"{tenant}\x1f{subject_ref}".encode()
        return hmac.new(self._index_key, msg, hashlib.sha256).hexdigest()

    def pseudonym(self, tenant: str, subject_ref: str) -> str:
        """Return the pseudonym audit entries use for a subject.

        A known subject's is the one drawn when it was created; for a reference that
        names no subject (a refused capture) a fresh one is drawn each time, so refused
        attempts link to nothing, not to each other nor to a later or earlier subject.
        """
        found = self.resolve(tenant, subject_ref)
        return found.pseudonym if found is not None else new_pseudonym()

    def resolve(
        self, tenant: str, subject_ref: str, *, max_age_s: float = 0.0
    ) -> SubjectHandle | None:
        """Find a known subject's stream, or None.

        With ``max_age_s`` a lookup made that recently may be reused (reads ask this;
        writes never do). An erasure in this process evicts it at once; one in another
        process shows up to a reader as the stream's tombstone, and the reader evicts.
        """
        ref_hash = self._ref_hash(tenant, subject_ref)
        if max_age_s > 0:
            hit = self._handles.get(ref_hash)
            if hit is not None and time.monotonic() - hit[0] <= max_age_s:
                return hit[1]
        ticket = self._handles.ticket()
        with self._engine.connect() as conn:
            row = conn.execute(
                sa.select(subject_index.c.stream_id, subject_index.c.pseudonym).where(
                    subject_index.c.ref_hash == ref_hash
                )
            ).first()
        if row is None:
            return None
        handle = SubjectHandle(uuid.UUID(row.stream_id), row.pseudonym, created=False)
        self._handles.put(ref_hash, (time.monotonic(), handle), ticket=ticket)
        return handle

    def resolve_many(self, tenant: str, subject_refs: Iterable[str]) -> dict[str, SubjectHandle]:
        """``resolve`` (never reusing a lookup) for several references in one query;
        the references that name no subject are left out."""
        by_hash = {self._ref_hash(tenant, ref): ref for ref in subject_refs}
        if not by_hash:
            return {}
        ticket = self._handles.ticket()
        with self._engine.connect() as conn:
            rows = conn.execute(_HANDLES_OF, {"ref_hashes": list(by_hash)}).all()
        read_at = time.monotonic()
        found: dict[str, SubjectHandle] = {}
        for row in rows:
            found[by_hash[row.ref_hash]] = SubjectHandle(
                uuid.UUID(row.stream_id), row.pseudonym, created=False
            )
        self._handles.put_many(
            ((row.ref_hash, (read_at, found[by_hash[row.ref_hash]])) for row in rows),
            ticket=ticket,
        )
        return found

    def resolve_or_create(self, tenant: str, subject_ref: str, *, now: datetime) -> SubjectHandle:
        """Find the subject's stream, creating stream id and first DEK on first use."""
        found = self.resolve(tenant, subject_ref)
        if found is not None:
            return found
        # A random id, never one derived from the identifier (FIELD-NOTES §2.1).
        stream_id = uuid.uuid4()
        pseudonym = new_pseudonym()
        dek = AESGCM.generate_key(bit_length=256)
        ticket = self._deks.ticket()
        try:
            with self._ring.wrapping() as (kek_id, kek), self._engine.begin() as conn:
                wrapped = aes_key_wrap(kek, dek)
                commitment = dek_commitment(str(stream_id), 1, wrapped)
                conn.execute(
                    subject_index.insert().values(
                        ref_hash=self._ref_hash(tenant, subject_ref),
                        tenant=tenant,
                        stream_id=str(stream_id),
                        pseudonym=pseudonym,
                        created_at=now,
                    )
                )
                conn.execute(
                    subject_keys.insert().values(
                        stream_id=str(stream_id),
                        key_version=1,
                        wrapped_dek=wrapped,
                        kek_id=kek_id,
                        dek_commitment=commitment,
                        created_at=now,
                    )
                )
        except sa.exc.IntegrityError:
            # Another writer created the subject first: use theirs.
            raced = self.resolve(tenant, subject_ref)
            if raced is None:
                raise
            return raced
        self._deks.put(str(stream_id), {1: dek}, ticket=ticket)
        return SubjectHandle(stream_id, pseudonym, created=True, dek_commitment=commitment)

    def stream_ids(self, tenant: str | None = None) -> list[uuid.UUID]:
        query = sa.select(subject_index.c.stream_id)
        if tenant is not None:
            query = query.where(subject_index.c.tenant == tenant)
        with self._engine.connect() as conn:
            return [uuid.UUID(r.stream_id) for r in conn.execute(query)]

    def subjects_after(
        self, tenant: str, *, after: tuple[datetime, str] | None, limit: int
    ) -> list[tuple[str, datetime, uuid.UUID]]:
        """Up to ``limit`` (pseudonym, created_at, stream id) of the index's subjects, after
        that keyset position. Never the reference itself: the index holds only its keyed
        hash."""
        c = subject_index.c
        query = sa.select(c.pseudonym, c.created_at, c.stream_id).where(c.tenant == tenant)
        if after is not None:
            when, pseudonym = after
            query = query.where(
                sa.or_(c.created_at > when, sa.and_(c.created_at == when, c.pseudonym > pseudonym))
            )
        query = query.order_by(c.created_at, c.pseudonym).limit(limit)
        with self._engine.connect() as conn:
            return [
                (r.pseudonym, r.created_at, uuid.UUID(r.stream_id)) for r in conn.execute(query)
            ]

    # ----------------------------------------------------------------- aliases

    def _alias_hash(self, tenant: str, kind: str, alias: str) -> str:
        msg = f"alias\x1f{tenant}\x1f{kind}\x1f{alias}".encode()
        return hmac.new(self._index_key, msg, hashlib.sha256).hexdigest()

    def bind_alias(
        self, tenant: str, kind: str, alias: str, stream_id: uuid.UUID, *, now: datetime
    ) -> bool:
        """Bind a session id or a known identifier to a subject's stream (rebinding
        replaces); False, and nothing stored, when the stream has no index row (the
        subject was erased, here or in another process, since the caller found it)."""
        from uprof.backends import backend_for

        index = subject_index.c
        # The binding is taken from the subject's index row, read and (PostgreSQL) share-
        # locked by the same statement: a binding stored after another process's erasure
        # had deleted the subject's aliases pointed at the shredded stream, a keyed hash of
        # the session id or e-mail left linked to it after the receipt (bug DK, decision
        # 0127-review-of-0121). ``destroy`` deletes the index row before the aliases, so
        # either it waits for this binding and deletes it, or this finds no row. SQLite:
        # the statement writes, so it runs under the file's write lock (the lock clause
        # is not rendered there).
        source = (
            sa.select(
                sa.literal(self._alias_hash(tenant, kind, alias)).label("alias_hash"),
                sa.literal(kind).label("kind"),
                sa.literal(tenant).label("tenant"),
                index.stream_id.label("stream_id"),
                sa.literal(now, subject_aliases.c.created_at.type).label("created_at"),
            )
            .where(index.stream_id == str(stream_id), index.tenant == tenant)
            .with_for_update(read=True)
        )
        # One statement, never "DELETE, then INSERT": on PostgreSQL a DELETE that finds no
        # row locks nothing, so two processes binding the same new alias at once both
        # inserted and the second failed on the primary key; a rebind raced the same way
        # (bug CM, decision 0121-read-then-write-sweep). The upsert lets the key decide:
        # the later binding replaces the earlier, on both backends.
        statement = (
            backend_for(self._engine)
            .upsert_from(subject_aliases, source, [subject_aliases.c.alias_hash])
            .returning(subject_aliases.c.alias_hash)
        )  # psycopg's rowcount here is -1
        with self._engine.begin() as conn:
            return conn.execute(statement).first() is not None

    def pseudonym_of_stream(self, stream_id: str, tenant: str | None = None) -> str | None:
        """The audit pseudonym of a live subject's stream (of ``tenant``, if named); None
        once it is erased, or when it is another tenant's."""
        query = sa.select(subject_index.c.pseudonym).where(
            subject_index.c.stream_id == str(stream_id)
        )
        if tenant is not None:
            query = query.where(subject_index.c.tenant == tenant)
        with self._engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else str(row.pseudonym)

    def subjects_of_streams(self, stream_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
        """(tenant, audit pseudonym) of each live subject among these streams, in one
        query; an erased (or unknown) stream is left out."""
        ids = sorted({str(s) for s in stream_ids})
        if not ids:
            return {}
        c = subject_index.c
        query = sa.select(c.stream_id, c.tenant, c.pseudonym).where(c.stream_id.in_(ids))
        with self._engine.connect() as conn:
            return {
                str(r.stream_id): (str(r.tenant), str(r.pseudonym)) for r in conn.execute(query)
            }

    def resolve_alias(self, tenant: str, kind: str, alias: str) -> SubjectHandle | None:
        """Find the subject a session id or identifier is bound to, or None."""
        alias_hash = self._alias_hash(tenant, kind, alias)
        query = (
            sa.select(subject_index.c.stream_id, subject_index.c.pseudonym)
            .join(subject_aliases, subject_aliases.c.stream_id == subject_index.c.stream_id)
            .where(subject_aliases.c.alias_hash == alias_hash)
        )
        with self._engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return SubjectHandle(uuid.UUID(row.stream_id), row.pseudonym, created=False)

    # -------------------------------------------------------------- data keys

    def _erased_by_ledger(self, stream_id: str, capture_id: str | None = None) -> bool:
        """Whether the erasure ledger says these keys are gone (or about to go).

        Asked before any key is handed out, cached or not: when another process erases,
        this process's caches are not told, and a key it still holds would open what the
        other process's receipt says was shredded. The ledger is the one record every
        process appends to, and it is written before any key is destroyed (decision 0052).
        """
        if self.ledger is None:
            return False
        state = self.ledger.state()
        if stream_id in state.streams:
            return True
        return capture_id is not None and capture_id in state.captures.get(stream_id, ())

    def _load_deks(self, stream_id: str) -> dict[int, bytes]:
        if self._erased_by_ledger(stream_id):
            self.evict(stream_id)
            return {}
        cached = self._deks.get(stream_id)
        if cached is not None:
            return cached
        ticket = self._deks.ticket()
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(
                    subject_keys.c.key_version, subject_keys.c.wrapped_dek, subject_keys.c.kek_id
                ).where(subject_keys.c.stream_id == stream_id)
            ).all()
        keys = {
            r.key_version: aes_key_unwrap(self._ring.key_for(r.kek_id), r.wrapped_dek) for r in rows
        }
        if keys:
            self._deks.put(stream_id, keys, ticket=ticket)
        return keys

    def current_key(self, stream_id: str) -> tuple[int, bytes]:
        """Return (version, DEK) to encrypt new events of a stream.

        Raises SubjectErasedError when the stream's keys were destroyed, so that
        nothing new is ever written to a shredded stream.
        """
        keys = self._load_deks(stream_id)
        if not keys:
            raise SubjectErasedError("this subject's keys have been destroyed")
        version = max(keys)
        return version, keys[version]

    def key(self, stream_id: str, version: int) -> bytes | None:
        """Return the DEK of one version, or None when destroyed or unknown."""
        return self._load_deks(stream_id).get(version)

    def view_key(self, stream_id: str) -> bytes | None:
        """The 64-byte AES-SIV key sealing a subject's read-model fields, or None if gone.

        Derived from the subject's first DEK, so destroying the DEK also makes every
        copy of the read-model fields unreadable.
        """
        if self._erased_by_ledger(stream_id):
            self.evict(stream_id)
            return None
        cached = self._view_keys.get(stream_id)
        if cached is not None:
            return cached
        ticket = self._view_keys.ticket()
        deks = self._load_deks(stream_id)
        if not deks:
            return None
        key = HKDF(
            algorithm=hashes.SHA256(), length=64, salt=None, info=b"uprof/view-fields/1"
        ).derive(deks[min(deks)])
        self._view_keys.put(stream_id, key, ticket=ticket)
        return key

    # ----------------------------------------------------------- capture keys

    def create_capture_keys(
        self, stream_id: str, capture_ids: list[str], *, now: datetime
    ) -> dict[str, str]:
        """Create one key per captured event, before the events are saved."""
        return self.create_capture_keys_many({stream_id: capture_ids}, now=now)

    def create_capture_keys_many(
        self, capture_ids: Mapping[str, Sequence[str]], *, now: datetime
    ) -> dict[str, str]:
        """Create the keys of several streams' captures in one transaction (group commit).

        Returns each capture id's key commitment (what its ``key.created`` audit entry,
        its ``key.destroyed`` entry and an event erasure's receipt cite)."""
        fresh: dict[tuple[str, str], bytes] = {}
        commitments: dict[str, str] = {}
        rows = []
        for stream_id, ids in capture_ids.items():
            _, dek = self.current_key(stream_id)
            for cid in ids:
                key = fresh[(stream_id, cid)] = AESGCM.generate_key(bit_length=256)
                wrapped = aes_key_wrap(dek, key)
                commitments[cid] = _capture_commitment(cid, wrapped)
                rows.append(
                    {
                        "capture_id": cid,
                        "stream_id": stream_id,
                        "wrapped_key": wrapped,
                        "created_at": now,
                    }
                )
        if not rows:
            return commitments
        ticket = self._capture_keys.ticket()
        with self._engine.begin() as conn:
            conn.execute(_INSERT_CAPTURE_KEYS, rows)
        self._capture_keys.put_many(fresh.items(), ticket=ticket)
        return commitments

    def capture_key(self, stream_id: str, capture_id: str) -> bytes | None:
        """Return a capture's key, or None when it (or its subject's DEK) is gone."""
        if self._erased_by_ledger(stream_id, capture_id):
            self._capture_keys.pop((stream_id, capture_id))
            return None
        cached = self._capture_keys.get((stream_id, capture_id))
        if cached is not None:
            return cached
        # A miss loads every key of the stream at once (projections read streams in runs),
        # unless the stream alone would crowd the cache: then just the one key.
        ticket = self._capture_keys.ticket()
        deks = self._load_deks(stream_id)
        if not deks:
            return None
        dek = deks[max(deks)]
        bulk = max(1, self._capture_keys.maxsize // 4)
        query = sa.select(capture_keys.c.capture_id, capture_keys.c.wrapped_key).where(
            capture_keys.c.stream_id == stream_id
        )
        with self._engine.connect() as conn:
            rows = conn.execute(query.limit(bulk + 1)).all()
            if len(rows) > bulk:
                rows = conn.execute(query.where(capture_keys.c.capture_id == capture_id)).all()
        keys = {}
        for r in rows:
            try:
                keys[r.capture_id] = aes_key_unwrap(dek, r.wrapped_key)
            except InvalidUnwrap:
                continue
        # The asked-for key goes in last (most recent), so it stays even if the stream
        # alone holds more keys than the bound.
        wanted = keys.get(capture_id)
        entries = [((stream_id, cid), k) for cid, k in keys.items() if cid != capture_id]
        if wanted is not None:
            entries.append(((stream_id, capture_id), wanted))
        self._capture_keys.put_many(entries, ticket=ticket)
        return wanted

    def capture_key_commitment(self, stream_id: str, capture_id: str) -> str | None:
        """What ``destroy_capture_key`` would return now; nothing is deleted."""
        where = (capture_keys.c.capture_id == capture_id, capture_keys.c.stream_id == stream_id)
        with self._engine.connect() as conn:
            row = conn.execute(sa.select(capture_keys.c.wrapped_key).where(*where)).first()
        return None if row is None else _capture_commitment(capture_id, row.wrapped_key)

    def destroy_capture_key(
        self, stream_id: str, capture_id: str, *, request_id: str | None = None
    ) -> str | None:
        """Destroy one capture's key (item-level shredding).

        Returns a commitment to the key this call deleted (for the receipt), or None
        when there was none left to delete; the deletion is recorded as ``request_id``'s
        in the same transaction (``capture_keys_destroyed_by``, bug GZ).
        """
        where = (capture_keys.c.capture_id == capture_id, capture_keys.c.stream_id == stream_id)
        with self._engine.begin() as conn:
            # What this DELETE removed, not what a read before it saw (as ``destroy``,
            # bug GK): a subject erasure at once may delete it while this one waits.
            row = conn.execute(
                capture_keys.delete().where(*where).returning(capture_keys.c.wrapped_key)
            ).first()
            commitment = None if row is None else _capture_commitment(capture_id, row.wrapped_key)
            if commitment is not None:
                _record_capture_keys_destroyed(
                    conn, stream_id, {capture_id: commitment}, request_id, datetime.now(UTC)
                )
        self._capture_keys.pop((stream_id, capture_id))
        return commitment

    def capture_keys_destroyed_by(
        self, stream_id: str, capture_ids: Iterable[str]
    ) -> dict[str, tuple[str | None, str]]:
        """Per capture of the stream whose key was destroyed: (the request whose destroy
        deleted it, None when none did; its commitment). Keys deleted by a start
        re-applying the ledger, or before the key store kept this, are left out."""
        wanted = sorted(set(capture_ids))
        if not wanted:
            return {}
        c = destroyed_capture_keys.c
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(c.capture_id, c.request_id, c.key_commitment).where(
                    c.stream_id == stream_id, c.capture_id.in_(wanted)
                )
            ).all()
        return {str(r.capture_id): (r.request_id, str(r.key_commitment)) for r in rows}

    # --------------------------------------------------------- plain-row keys

    def plain_row_key(self, key_id: int) -> bytes | None:
        """The deployment key that authenticates plaintext event rows under ``key_id``
        (``uprof.crypto.mapper``), or None when the key store has no such key."""
        cached = self._plain_row_keys.get(key_id)
        if cached is not None:
            return cached
        with reading_connection(self._engine) as conn:
            row = conn.execute(
                sa.select(plain_row_keys.c.wrapped_key, plain_row_keys.c.kek_id).where(
                    plain_row_keys.c.key_id == key_id
                )
            ).first()
        if row is None:
            return None
        key = aes_key_unwrap(self._ring.key_for(row.kek_id), row.wrapped_key)
        self._plain_row_keys[key_id] = key
        return key

    def has_plain_row_key(self) -> bool:
        """Whether the key store holds a plain-row key (created by the first run of the
        upgrade that tags legacy rows, ``uprof.crypto.plain_rows``); nothing is created."""
        return self._plain_row_current is not None or self._newest_plain_row_key_id() is not None

    def current_plain_row_key(self) -> tuple[int, bytes]:
        """(key id, key) that tags new plaintext rows: the newest in the key store,
        created on first use (one per deployment, whichever process creates it first)."""
        if self._plain_row_current is not None:
            return self._plain_row_current, self._plain_row_keys[self._plain_row_current]
        newest = self._newest_plain_row_key_id()
        if newest is None:
            self.add_plain_row_key(first=True)
            newest = self._newest_plain_row_key_id()
        assert newest is not None  # created above, by this process or another
        key = self.plain_row_key(newest)
        if key is None:  # pragma: no cover - read just after it was found
            raise RuntimeError(f"plain-row key {newest} vanished from the key store")
        self._plain_row_current = newest
        return newest, key

    def add_plain_row_key(self, *, first: bool = False) -> int:
        """Create the next plain-row key (rotation; ``first``: only if there is none).

        Cross-process safe on every backend: the key id is the primary key, so of two
        processes inserting the same id one commits and the other's insert fails (on
        PostgreSQL it waits for the first to commit); the loser uses the winner's key.
        Wrapped under the store's current KEK under the ring's shared lock, so a KEK
        rotation re-wraps it with the others."""
        key = AESGCM.generate_key(bit_length=256)
        newest = self._newest_plain_row_key_id()
        if first and newest is not None:
            return newest
        key_id = (newest or 0) + 1
        try:
            with self._ring.wrapping() as (kek_id, kek), self._engine.begin() as conn:
                conn.execute(
                    plain_row_keys.insert().values(
                        key_id=key_id,
                        wrapped_key=aes_key_wrap(kek, key),
                        kek_id=kek_id,
                        created_at=datetime.now(UTC),
                    )
                )
        except sa.exc.IntegrityError:
            if not first:
                raise
            return key_id  # another process created it first: theirs is the key
        self._plain_row_keys[key_id] = key
        self._plain_row_current = None if not first else key_id
        return key_id

    def _newest_plain_row_key_id(self) -> int | None:
        with self._engine.connect() as conn:
            found = conn.execute(sa.select(sa.func.max(plain_row_keys.c.key_id))).scalar_one()
        return None if found is None else int(found)

    # ------------------------------------------------------------ destruction

    def destruction_preview(self, stream_id: str) -> Destruction:
        """What ``destroy`` would destroy now (commitments and counts); nothing is deleted."""
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(subject_keys.c.key_version, subject_keys.c.dek_commitment)
                .where(subject_keys.c.stream_id == stream_id)
                .order_by(subject_keys.c.key_version)
            ).all()
            n_capture = conn.execute(
                sa.select(sa.func.count())
                .select_from(capture_keys)
                .where(capture_keys.c.stream_id == stream_id)
            ).scalar_one()
            n_alias = conn.execute(
                sa.select(sa.func.count())
                .select_from(subject_aliases)
                .where(subject_aliases.c.stream_id == stream_id)
            ).scalar_one()
        return Destruction(
            deks=tuple(DestroyedKey(r.key_version, r.dek_commitment) for r in rows),
            capture_keys=int(n_capture),
            aliases=int(n_alias),
        )

    def destroy(
        self, stream_id: str, *, now: datetime, request_id: str | None = None
    ) -> Destruction:
        """Destroy every key of a stream and its index rows; the stream becomes unreadable.

        Each key this call deleted is recorded as destroyed by ``request_id`` in the same
        transaction (``destroyed_by``): which request destroyed a key is a fact only this
        DELETE knows, and it is kept even when the process dies right after (bug GW)."""
        with self._engine.begin() as conn:
            # The keys this DELETE removed, not the keys a read saw before it: a destroy
            # of another erasure of the subject at once may delete them while this one
            # waits for its lock, and each receipt claims only its own (bug GK).
            deleted = conn.execute(
                subject_keys.delete()
                .where(subject_keys.c.stream_id == stream_id)
                .returning(subject_keys.c.key_version, subject_keys.c.dek_commitment)
            ).all()
            rows = sorted(deleted, key=lambda r: r.key_version)
            if rows:
                # Rows left by an older destroy of the same key (a key folder put back
                # from a copy, whose keys a start destroys again) keep the first word.
                known = set(
                    conn.execute(
                        sa.select(destroyed_keys.c.key_version).where(
                            destroyed_keys.c.stream_id == stream_id
                        )
                    ).scalars()
                )
                fresh = [
                    {
                        "stream_id": stream_id,
                        "key_version": r.key_version,
                        "dek_commitment": r.dek_commitment,
                        "request_id": request_id,
                        "destroyed_at": now,
                    }
                    for r in rows
                    if r.key_version not in known
                ]
                if fresh:
                    conn.execute(destroyed_keys.insert(), fresh)
            captured = conn.execute(
                capture_keys.delete()
                .where(capture_keys.c.stream_id == stream_id)
                .returning(capture_keys.c.capture_id, capture_keys.c.wrapped_key)
            ).all()
            n_capture = len(captured)
            if captured:
                _record_capture_keys_destroyed(
                    conn,
                    stream_id,
                    {
                        r.capture_id: _capture_commitment(r.capture_id, r.wrapped_key)
                        for r in captured
                    },
                    request_id,
                    now,
                )
            # The anchor goes with the keys: the shredded mark refuses every load from now
            # on, so it would guard nothing and only be left behind.
            conn.execute(stream_heads.delete().where(stream_heads.c.stream_id == stream_id))
            # The index row before the aliases: on PostgreSQL its DELETE waits for a
            # binding that holds the row (``bind_alias``), and the alias DELETE after it
            # then sees that binding and deletes it too (bug DK).
            conn.execute(subject_index.delete().where(subject_index.c.stream_id == stream_id))
            n_alias = conn.execute(
                subject_aliases.delete().where(subject_aliases.c.stream_id == stream_id)
            ).rowcount
            exists = conn.execute(
                sa.select(shredded_streams.c.stream_id).where(
                    shredded_streams.c.stream_id == stream_id
                )
            ).first()
            if exists is None:
                conn.execute(shredded_streams.insert().values(stream_id=stream_id, shredded_at=now))
        self.evict(stream_id)
        return Destruction(
            deks=tuple(DestroyedKey(r.key_version, r.dek_commitment) for r in rows),
            capture_keys=n_capture,
            aliases=n_alias,
        )

    def destroyed_by(self, stream_id: str) -> dict[int, tuple[str | None, str]]:
        """Per destroyed key version of the stream: (the request whose ``destroy`` deleted
        it, or None when no request did; its commitment). Keys destroyed before the key
        store kept this (revision ``0006_keys_destroyed_keys``) are left out."""
        c = destroyed_keys.c
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(c.key_version, c.request_id, c.dek_commitment).where(
                    c.stream_id == stream_id
                )
            ).all()
        return {int(r.key_version): (r.request_id, str(r.dek_commitment)) for r in rows}

    def evict(self, stream_id: str) -> None:
        """Forget a stream's cached keys and lookups (every cache of this store)."""
        self._deks.pop(stream_id)
        self._view_keys.pop(stream_id)
        self._capture_keys.pop_where(lambda key, _: key[0] == stream_id)
        self._handles.pop_where(lambda _, hit: str(hit[1].stream_id) == stream_id)

    def cache_stats(self) -> list[CacheStats]:
        """Size, bound, hits and misses of each key cache."""
        return [c.stats() for c in (self._deks, self._view_keys, self._capture_keys, self._handles)]

    def is_shredded(self, stream_id: str) -> bool:
        with self._engine.connect() as conn:
            row = conn.execute(
                sa.select(shredded_streams.c.stream_id).where(
                    shredded_streams.c.stream_id == stream_id
                )
            ).first()
        return row is not None

    def shredded_among(self, stream_ids: Iterable[str]) -> set[str]:
        """Which of these streams are shredded (``is_shredded`` for many, one query)."""
        wanted = list(stream_ids)
        if not wanted:
            return set()
        with self._engine.connect() as conn:
            return set(conn.execute(_SHREDDED_AMONG, {"stream_ids": wanted}).scalars())

    # ----------------------------------------------------------- stream heads

    def stream_head(self, log_id: str, stream_id: str) -> StreamHead | None:
        """The stream's anchor in that log: its newest version known committed (None: not
        known)."""
        c = stream_heads.c
        with reading_connection(self._engine) as conn:
            row = conn.execute(
                sa.select(c.version, c.digest).where(c.log_id == log_id, c.stream_id == stream_id)
            ).first()
        return None if row is None else StreamHead(stream_id, int(row.version), str(row.digest))

    def stream_heads_of(self, log_id: str, stream_ids: Iterable[str]) -> dict[str, StreamHead]:
        """``stream_head`` for several streams (one query); unknown ones left out."""
        wanted = sorted(set(stream_ids))
        if not wanted:
            return {}
        c = stream_heads.c
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(c.stream_id, c.version, c.digest).where(
                    c.log_id == log_id, c.stream_id.in_(wanted)
                )
            ).all()
        return {r.stream_id: StreamHead(r.stream_id, int(r.version), str(r.digest)) for r in rows}

    def stream_heads_in(self, log_id: str) -> dict[str, StreamHead]:
        """Every anchor of that log (one query): what a reader of the whole log checks
        it against (``ProfilesApplication.damaged_streams``)."""
        c = stream_heads.c
        with reading_connection(self._engine) as conn:
            rows = conn.execute(
                sa.select(c.stream_id, c.version, c.digest).where(c.log_id == log_id)
            ).all()
        return {r.stream_id: StreamHead(r.stream_id, int(r.version), str(r.digest)) for r in rows}

    def raise_stream_heads(self, log_id: str, heads: Iterable[StreamHead]) -> None:
        """Move each stream's anchor in that log up to ``heads`` (one transaction): a
        missing one is written; one is raised only from the anchor its writer checked
        (``StreamHead.over_version``), so one already at or above a head, or moved
        since, stays; a shredded stream gets none."""
        rows = [
            {
                "log_id": log_id,
                "stream_id": h.stream_id,
                "version": h.version,
                "digest": h.digest,
                "over_version": h.over_version,
                "over_digest": h.over_digest,
            }
            for h in sorted(heads, key=lambda h: h.stream_id)  # one lock order: no deadlock
        ]
        if not rows:
            return
        # No flush to disk for this commit: an anchor lost in a power cut or a database
        # crash lags (the next load adopts the head), it never leads, and the event it
        # follows was flushed before it began. So it does not pay the key store's fsync.
        from uprof.backends import backend_for

        with backend_for(self._engine).unflushed_transaction(self._engine) as conn:
            conn.execute(_RAISE_STREAM_HEAD, rows)

    def move_stream_heads(self, log_id: str, moves: Iterable[tuple[StreamHead, str]]) -> int:
        """For each (anchor, new digest): if the stream's anchor in that log is still
        exactly that anchor (version and digest), give it the new digest; an anchor that
        names another version or digest is left alone (compare-and-set, one transaction).
        For a committed head row about to be re-written in place (the plain-row upgrade,
        ``uprof.crypto.plain_rows``). Flushed like the key store's other writes, unlike a
        raise: a moved anchor must not be lost once its row is re-written. Returns how many
        anchors moved."""
        c = stream_heads.c
        rows = sorted(moves, key=lambda m: m[0].stream_id)  # one lock order: no deadlock
        moved = 0
        if not rows:
            return 0
        with self._engine.begin() as conn:
            for head, digest in rows:
                moved += conn.execute(
                    stream_heads.update()
                    .where(
                        c.log_id == log_id,
                        c.stream_id == head.stream_id,
                        c.version == head.version,
                        c.digest == head.digest,
                    )
                    .values(digest=digest)
                ).rowcount
        return moved

    def replace_stream_heads(self, log_id: str, heads: Iterable[StreamHead]) -> int:
        """Make ``heads`` the only anchors, those of that log (``uprof restore``: the
        operator put an older log in place, whose heads are the truth from now on);
        shredded streams get none. Returns how many anchors were written.

        Every other log's anchors go too: they name heads of the log the operator just
        replaced, and a restored folder moved to the path of the one it replaced takes
        that path's log identity (bug GN); it would be refused for every stream written
        since the backup. A copy elsewhere is another log, never the protected one."""
        with self._engine.begin() as conn:
            conn.execute(stream_heads.delete())
            shredded = set(conn.execute(sa.select(shredded_streams.c.stream_id)).scalars())
            rows = [
                {
                    "log_id": log_id,
                    "stream_id": h.stream_id,
                    "version": h.version,
                    "digest": h.digest,
                }
                for h in heads
                if h.stream_id not in shredded
            ]
            if rows:
                conn.execute(stream_heads.insert(), rows)
        return len(rows)

    def shredded_stream_ids(self) -> list[str]:
        with self._engine.connect() as conn:
            return list(conn.execute(sa.select(shredded_streams.c.stream_id)).scalars())

    # ------------------------------------------------------------ KEK rotation

    def rotate_kek(self) -> dict[str, int]:
        """Re-wrap every DEK under a new KEK epoch, then forget the older epochs.

        From the ring in the store, under its exclusive lock: a ring read at this
        process's start may be older than another process's rotation, and a key wrapped
        meanwhile by another process must be among those re-wrapped."""
        with self._ring.rotating():
            return self._rotate_kek()

    def _rotate_kek(self) -> dict[str, int]:
        new_epoch = self._ring.add_epoch()
        new_kek = self._ring.keys[new_epoch]
        new_id = self._ring.kek_id(new_epoch)
        rewrapped = 0
        with self._engine.begin() as conn:
            rows = conn.execute(
                sa.select(
                    subject_keys.c.stream_id,
                    subject_keys.c.key_version,
                    subject_keys.c.wrapped_dek,
                    subject_keys.c.kek_id,
                ).where(subject_keys.c.kek_id != new_id)
            ).all()
            for r in rows:
                dek = aes_key_unwrap(self._ring.key_for(r.kek_id), r.wrapped_dek)
                conn.execute(
                    subject_keys.update()
                    .where(
                        subject_keys.c.stream_id == r.stream_id,
                        subject_keys.c.key_version == r.key_version,
                    )
                    .values(wrapped_dek=aes_key_wrap(new_kek, dek), kek_id=new_id)
                )
                rewrapped += 1
            # The plain-row keys are wrapped by the KEK too (``add_plain_row_key``).
            for r in conn.execute(
                sa.select(
                    plain_row_keys.c.key_id, plain_row_keys.c.wrapped_key, plain_row_keys.c.kek_id
                ).where(plain_row_keys.c.kek_id != new_id)
            ).all():
                key = aes_key_unwrap(self._ring.key_for(r.kek_id), r.wrapped_key)
                conn.execute(
                    plain_row_keys.update()
                    .where(plain_row_keys.c.key_id == r.key_id)
                    .values(wrapped_key=aes_key_wrap(new_kek, key), kek_id=new_id)
                )
        forgotten = self._ring.forget_before(new_epoch)
        return {"epoch": new_epoch, "deks_rewrapped": rewrapped, "epochs_forgotten": len(forgotten)}
