"""Key store: random stream ids, per-subject data keys wrapped by a KEK.

Hierarchy (FIELD-NOTES §3.4): a master secret (a mode-0600 file in the data
folder, or a setting) derives the KEK and the index key with HKDF. Each subject
stream gets a random AES-256 data key (DEK), stored only wrapped with AES-KW
(RFC 3394). Destroying a stream's DEK rows makes every event of that stream
unreadable, wherever copies of the events live.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.keywrap import aes_key_unwrap, aes_key_wrap

from domain.errors import SubjectErasedError
from uprof.crypto.tables import shredded_streams, subject_aliases, subject_index, subject_keys


def derive_key(master: bytes, label: str) -> bytes:
    """Derive a 32-byte key for one purpose from the master secret."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label.encode()).derive(
        master
    )


def dek_commitment(stream_id: str, key_version: int, wrapped_dek: bytes) -> str:
    """Commit to a wrapped DEK without revealing it (FIELD-NOTES §5.6)."""
    h = hashlib.sha256()
    h.update(b"dek-commit")
    h.update(stream_id.encode())
    h.update(key_version.to_bytes(4, "big"))
    h.update(wrapped_dek)
    return h.hexdigest()


@dataclass(frozen=True)
class SubjectHandle:
    """Where a subject's data lives: its stream and its pseudonymous reference."""

    stream_id: uuid.UUID
    pseudonym: str
    created: bool


@dataclass(frozen=True)
class DestroyedKey:
    key_version: int
    dek_commitment: str


@dataclass(frozen=True)
class CreatedKey:
    stream_id: str
    key_version: int
    dek_commitment: str


class KeyStore:
    """Resolve subjects to streams and hand out their data keys.

    Unwrapped DEKs are cached in memory per stream; ``destroy`` evicts them.
    """

    def __init__(self, engine: sa.Engine, *, master_secret: bytes, kek_epoch: int = 1) -> None:
        if len(master_secret) < 32:
            raise ValueError("the master secret must be at least 32 bytes")
        self._engine = engine
        self._kek = derive_key(master_secret, f"uprof/kek/{kek_epoch}")
        self.kek_id = hashlib.sha256(b"kek-id" + self._kek).hexdigest()[:16]
        self._index_key = derive_key(master_secret, "uprof/subject-index/1")
        self._pseudonym_key = derive_key(master_secret, "uprof/pseudonym/1")
        self._cache: dict[str, tuple[int, bytes]] = {}
        self._lock = threading.Lock()
        #: Keys created since the caller last drained them (for KeyCreated audit entries).
        self.created_keys: list[CreatedKey] = []

    # ---------------------------------------------------------------- subjects

    def _ref_hash(self, tenant: str, subject_ref: str) -> str:
        msg = f"{tenant}\x1f{subject_ref}".encode()
        return hmac.new(self._index_key, msg, hashlib.sha256).hexdigest()

    def pseudonym(self, tenant: str, subject_ref: str) -> str:
        """Return the stable pseudonymous reference used in audit entries."""
        msg = f"{tenant}\x1f{subject_ref}".encode()
        return "subj_" + hmac.new(self._pseudonym_key, msg, hashlib.sha256).hexdigest()[:32]

    def resolve(self, tenant: str, subject_ref: str) -> SubjectHandle | None:
        """Find a known subject's stream, or None."""
        with self._engine.connect() as conn:
            row = conn.execute(
                sa.select(subject_index.c.stream_id, subject_index.c.pseudonym).where(
                    subject_index.c.ref_hash == self._ref_hash(tenant, subject_ref)
                )
            ).first()
        if row is None:
            return None
        return SubjectHandle(uuid.UUID(row.stream_id), row.pseudonym, created=False)

    def resolve_or_create(self, tenant: str, subject_ref: str, *, now: datetime) -> SubjectHandle:
        """Find the subject's stream, creating stream id and first DEK on first use."""
        found = self.resolve(tenant, subject_ref)
        if found is not None:
            return found
        stream_id = uuid.uuid4()
        pseudonym = self.pseudonym(tenant, subject_ref)
        dek = AESGCM.generate_key(bit_length=256)
        wrapped = aes_key_wrap(self._kek, dek)
        commitment = dek_commitment(str(stream_id), 1, wrapped)
        try:
            with self._engine.begin() as conn:
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
                        kek_id=self.kek_id,
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
        with self._lock:
            self._cache[str(stream_id)] = (1, dek)
            self.created_keys.append(CreatedKey(str(stream_id), 1, commitment))
        return SubjectHandle(stream_id, pseudonym, created=True)

    def _alias_hash(self, tenant: str, kind: str, alias: str) -> str:
        msg = f"alias\x1f{tenant}\x1f{kind}\x1f{alias}".encode()
        return hmac.new(self._index_key, msg, hashlib.sha256).hexdigest()

    def bind_alias(
        self, tenant: str, kind: str, alias: str, stream_id: uuid.UUID, *, now: datetime
    ) -> None:
        """Bind a session id or a known identifier to a subject's stream (rebinding replaces)."""
        alias_hash = self._alias_hash(tenant, kind, alias)
        with self._engine.begin() as conn:
            conn.execute(subject_aliases.delete().where(subject_aliases.c.alias_hash == alias_hash))
            conn.execute(
                subject_aliases.insert().values(
                    alias_hash=alias_hash, kind=kind, tenant=tenant,
                    stream_id=str(stream_id), created_at=now,
                )
            )

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

    def stream_ids(self, tenant: str | None = None) -> list[uuid.UUID]:
        query = sa.select(subject_index.c.stream_id)
        if tenant is not None:
            query = query.where(subject_index.c.tenant == tenant)
        with self._engine.connect() as conn:
            return [uuid.UUID(r.stream_id) for r in conn.execute(query)]

    # -------------------------------------------------------------------- keys

    def current_key(self, stream_id: str) -> tuple[int, bytes]:
        """Return (version, DEK) to encrypt new events of a stream.

        Raises SubjectErasedError when the stream's keys were destroyed, so that
        nothing new is ever written to a shredded stream.
        """
        cached = self._cache.get(stream_id)
        if cached is not None:
            return cached
        keys = self._load_keys(stream_id)
        if not keys:
            raise SubjectErasedError("this subject's keys have been destroyed")
        version = max(keys)
        with self._lock:
            self._cache[stream_id] = (version, keys[version])
        return version, keys[version]

    def key(self, stream_id: str, version: int) -> bytes | None:
        """Return the DEK of one version, or None when destroyed or unknown."""
        cached = self._cache.get(stream_id)
        if cached is not None and cached[0] == version:
            return cached[1]
        return self._load_keys(stream_id).get(version)

    def _load_keys(self, stream_id: str) -> dict[int, bytes]:
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(subject_keys.c.key_version, subject_keys.c.wrapped_dek).where(
                    subject_keys.c.stream_id == stream_id
                )
            ).all()
        return {r.key_version: aes_key_unwrap(self._kek, r.wrapped_dek) for r in rows}

    def destroy(self, stream_id: str, *, now: datetime) -> list[DestroyedKey]:
        """Destroy every DEK of a stream and its index row; the stream becomes unreadable."""
        with self._engine.begin() as conn:
            rows = conn.execute(
                sa.select(subject_keys.c.key_version, subject_keys.c.dek_commitment).where(
                    subject_keys.c.stream_id == stream_id
                )
            ).all()
            conn.execute(subject_keys.delete().where(subject_keys.c.stream_id == stream_id))
            conn.execute(subject_index.delete().where(subject_index.c.stream_id == stream_id))
            conn.execute(
                subject_aliases.delete().where(subject_aliases.c.stream_id == stream_id)
            )
            exists = conn.execute(
                sa.select(shredded_streams.c.stream_id).where(
                    shredded_streams.c.stream_id == stream_id
                )
            ).first()
            if exists is None:
                conn.execute(shredded_streams.insert().values(stream_id=stream_id, shredded_at=now))
        with self._lock:
            self._cache.pop(stream_id, None)
        return [DestroyedKey(r.key_version, r.dek_commitment) for r in rows]

    def is_shredded(self, stream_id: str) -> bool:
        with self._engine.connect() as conn:
            row = conn.execute(
                sa.select(shredded_streams.c.stream_id).where(
                    shredded_streams.c.stream_id == stream_id
                )
            ).first()
        return row is not None

    def drain_created_keys(self) -> list[CreatedKey]:
        with self._lock:
            created, self.created_keys = self.created_keys, []
        return created

    def flush_cache(self) -> None:
        with self._lock:
            self._cache.clear()
