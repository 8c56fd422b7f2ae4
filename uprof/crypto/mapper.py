"""SubjectKeyMapper: seal each event's state under its own stream's data key.

Stored state layout (FIELD-NOTES §3.2)::

    0x01 | dek_version (4 bytes, big-endian) | nonce (12) | AES-GCM ciphertext+tag

with associated data ``f"{originator_id}|{originator_version}|{topic}"``, so a
ciphertext moved to another row fails to open. When the key is gone the mapper
returns a ``Shredded`` placeholder instead of raising, so projections and the
extraction worker keep running past erased subjects.
"""

from __future__ import annotations

import os
from typing import Any
from uuid import UUID

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from eventsourcing.persistence import (
    Mapper,
    MapperDeserialisationError,
    StoredEvent,
    Transcoder,
)

from domain.shredded import Shredded
from uprof.crypto.keystore import KeyStore

FORMAT_V1 = b"\x01"


def _aad(originator_id: Any, originator_version: int, topic: str) -> bytes:
    return f"{originator_id}|{originator_version}|{topic}".encode()


class SubjectKeyMapper(Mapper[UUID]):
    """Mapper that encrypts per stream; built by the profiles application."""

    def __init__(self, transcoder: Transcoder, keystore: KeyStore) -> None:
        super().__init__(transcoder=transcoder)
        self.keystore = keystore

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        stored = super().to_stored_event(domain_event)
        version, key = self.keystore.current_key(str(stored.originator_id))
        nonce = os.urandom(12)
        sealed = AESGCM(key).encrypt(
            nonce, stored.state, _aad(stored.originator_id, stored.originator_version, stored.topic)
        )
        return StoredEvent(
            originator_id=stored.originator_id,
            originator_version=stored.originator_version,
            topic=stored.topic,
            state=FORMAT_V1 + version.to_bytes(4, "big") + nonce + sealed,
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        state = stored_event.state
        if state[:1] != FORMAT_V1 or len(state) < 1 + 4 + 12 + 16:
            msg = (
                f"stored event {stored_event.originator_id}@{stored_event.originator_version} "
                "is not in the sealed format"
            )
            raise MapperDeserialisationError(msg)
        version = int.from_bytes(state[1:5], "big")
        key = self.keystore.key(str(stored_event.originator_id), version)
        if key is None:
            return Shredded(
                originator_id=UUID(str(stored_event.originator_id)),
                originator_version=stored_event.originator_version,
                topic=stored_event.topic,
            )
        try:
            plain = AESGCM(key).decrypt(
                state[5:17],
                state[17:],
                _aad(stored_event.originator_id, stored_event.originator_version, stored_event.topic),
            )
        except InvalidTag as e:
            # Never include state in the message: ids and versions only (FIELD-NOTES §3.3).
            msg = (
                f"stored event {stored_event.originator_id}@{stored_event.originator_version} "
                "failed authentication (moved or altered ciphertext)"
            )
            raise MapperDeserialisationError(msg) from e
        opened = StoredEvent(
            originator_id=stored_event.originator_id,
            originator_version=stored_event.originator_version,
            topic=stored_event.topic,
            state=plain,
        )
        return super().to_domain_event(opened)

