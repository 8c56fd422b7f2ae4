"""SubjectKeyMapper: seal each event's state under the key its content belongs to.

Stored state layouts (FIELD-NOTES §3.2, extended for item-level shredding)::

    0x03 | key_id (4, big-endian) | tag (32) | JSON state  plaintext rows (ids, no content)
    0x01 | dek_version (4, big-endian) | nonce (12) | ct     under the subject's DEK
    0x02 | capture_id (16)             | nonce (12) | ct     under one capture's key
    0x00 | JSON state                                      plaintext rows before 2026-12-05:
                                                           re-written as 0x03 at start, then
                                                           damage (``uprof.crypto.plain_rows``)

A captured interaction is sealed under its own capture key, and every extracted
item under the key of the first capture it cites, so erasing one captured event
shreds the items that came only from it. Associated data is
``f"{originator_id}|{originator_version}|{topic}"``: a ciphertext moved to another
row fails to open. Without its key an event reads as ``ContentShredded``, so
projections, the extraction worker and aggregate replay keep running.

Plaintext rows (``PLAIN_TOPICS``) are written without a subject key (after erasure too),
so they are authenticated instead: an HMAC-SHA256 tag under a deployment key kept in the
key store (wrapped by the KEK, ``KeyStore.current_plain_row_key``) over the same
associated data, the key id and the JSON state. A plaintext row without a valid tag is
damage (decision 0136-authenticated-plaintext-rows; bug EK).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import os
from datetime import UTC, datetime
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
from eventsourcing.utils import get_topic, resolve_topic

from domain.errors import StoredDataDamagedError, SubjectErasedError
from domain.profile import SubjectProfile
from uprof.ports import SubjectKeyStore

PLAIN, SUBJECT_SEALED, CAPTURE_SEALED, PLAIN_TAGGED = b"\x00", b"\x01", b"\x02", b"\x03"
NONCE = 12
TAG = 16
#: A plaintext row's HMAC-SHA256 tag, and the label its MAC input starts with.
PLAIN_TAG = 32
_PLAIN_LABEL = b"uprof/plain-row/1\x00"
#: Events that carry ids and times only, stored unencrypted so that every reader
#: sees them even after the keys are gone (they are the purge signals).
TOMBSTONE_TOPICS = frozenset(
    get_topic(cls)
    for cls in (
        SubjectProfile.SubjectErased,
        SubjectProfile.CaptureErased,
        SubjectProfile.ItemsErased,
    )
)
#: Stored in plaintext too: ids and times only, written when the stream cannot be read.
#: ``DamagedEventQuarantined`` is appended beside a damaged event by the pipeline, which
#: cannot load the stream, and must read back whatever keys are left (decision
#: 0124-damaged-events-quarantined).
_VERDICT_TOPIC = get_topic(SubjectProfile.DamagedEventQuarantined)
PLAIN_TOPICS = TOMBSTONE_TOPICS | {_VERDICT_TOPIC}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class DamagedEventError(MapperDeserialisationError, StoredDataDamagedError):
    """A stored event that does not open: still the library's decoding error (every
    pipeline and replay treats it as before), and a uprof error, so every surface names
    it (500 ``stored_data_damaged``) instead of answering an anonymous internal error
    (bug BZ). The message names the event's version, never its stream or content."""


class DamagedPurgeSignalError(MapperDeserialisationError, StoredDataDamagedError):
    """A stored plaintext row (a purge signal: ``SubjectErased``, ``CaptureErased``,
    ``ItemsErased``; or a ``DamagedEventQuarantined`` verdict) that is not authenticated:
    not in its tagged plaintext format, or its tag does not verify (bugs EA, EK). Named
    as damage on every surface, but never ``DamagedEventError``: what the pipeline may
    set aside and pass over is an event whose loss withholds data, and passing over a
    purge signal serves again what it purged (an item erased without its evidence keeps
    its keys); a verdict that is not authentic cannot be honoured. It stops the
    pipeline, as a tombstone whose body does not decode does (review of 0124, bug EA).
    """


def _damaged(stored_event: StoredEvent, what: str) -> DamagedEventError:
    return DamagedEventError(
        f"stored event at version {stored_event.originator_version} of this subject's "
        f"stream {what} (damaged or altered storage)"
    )


def _aad(originator_id: Any, originator_version: int, topic: str) -> bytes:
    return f"{originator_id}|{originator_version}|{topic}".encode()


def plain_row_tag(
    key: bytes, key_id: int, originator_id: Any, originator_version: int, topic: str, body: bytes
) -> bytes:
    """The tag of a plaintext row: HMAC-SHA256 over the row's place (stream, version,
    topic, as the sealed rows' associated data), the key id and the JSON state, each
    length-prefixed, so a tag made for one row verifies no other."""
    aad = _aad(originator_id, originator_version, topic)
    msg = b"".join(
        (_PLAIN_LABEL, len(aad).to_bytes(4, "big"), aad, key_id.to_bytes(4, "big"), body)
    )
    return hmac.new(key, msg, hashlib.sha256).digest()


def tagged_plain_state(
    key: bytes, key_id: int, originator_id: Any, originator_version: int, topic: str, body: bytes
) -> bytes:
    """A plaintext row's stored state: ``0x03 | key id | tag | JSON state``."""
    tag = plain_row_tag(key, key_id, originator_id, originator_version, topic, body)
    return PLAIN_TAGGED + key_id.to_bytes(4, "big") + tag + body


def _capture_of(domain_event: Any) -> tuple[str | None, bool]:
    """The capture whose key seals this event (None: the subject's DEK), and if it must."""
    if isinstance(domain_event, SubjectProfile.InteractionCaptured):
        return domain_event.capture_id, True
    evidence = getattr(domain_event, "evidence", None)
    if evidence:
        return str(evidence[0]), False
    return None, False


@functools.cache
def _capture_sealable(topic: str) -> bool:
    """Whether events of ``topic`` are ever sealed under a capture key (``_capture_of``):
    a capture, or an event that names evidence. Anything else (a consent, its withdrawal,
    an archive, a supersession) is sealed under the subject's DEK, so a row of it marked
    capture-sealed was altered (bug EB)."""
    if topic == get_topic(SubjectProfile.InteractionCaptured):
        return True
    try:
        cls = resolve_topic(topic)
        return any(f.name == "evidence" for f in dataclasses.fields(cls))
    except Exception:  # not an event class of ours: the row cannot be ours either
        return False


class SubjectKeyMapper(Mapper[UUID]):
    """Mapper that encrypts per subject and per capture; built by the profiles app."""

    def __init__(self, transcoder: Transcoder, keystore: SubjectKeyStore) -> None:
        super().__init__(transcoder=transcoder)
        self.keystore = keystore

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        stored = super().to_stored_event(domain_event)
        stream = str(stored.originator_id)
        if stored.topic in PLAIN_TOPICS:
            key_id, plain_key = self.keystore.current_plain_row_key()
            return self._replace(
                stored,
                tagged_plain_state(
                    plain_key,
                    key_id,
                    stored.originator_id,
                    stored.originator_version,
                    stored.topic,
                    stored.state,
                ),
            )
        aad = _aad(stored.originator_id, stored.originator_version, stored.topic)
        nonce = os.urandom(NONCE)
        capture_id, required = _capture_of(domain_event)
        key = self.keystore.capture_key(stream, capture_id) if capture_id else None
        if required and key is None:
            msg = f"no key for capture {capture_id}: create capture keys before saving"
            raise MapperDeserialisationError(msg)
        if capture_id and key is not None:
            sealed = AESGCM(key).encrypt(nonce, stored.state, aad)
            return self._replace(
                stored, CAPTURE_SEALED + bytes.fromhex(capture_id) + nonce + sealed
            )
        # Raises SubjectErasedError for a shredded stream: nothing new is ever written to it.
        version, dek = self.keystore.current_key(stream)
        sealed = AESGCM(dek).encrypt(nonce, stored.state, aad)
        return self._replace(stored, SUBJECT_SEALED + version.to_bytes(4, "big") + nonce + sealed)

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        state = stored_event.state
        kind = state[:1]
        if stored_event.topic in PLAIN_TOPICS:
            body = self._authentic_plain_body(stored_event)
            if body is not None:
                return super().to_domain_event(self._replace(stored_event, body))
            # Not authentic: untagged (a row of before the upgrade, or forged by a writer
            # of the event store, who lacks the key: bug EK), mistagged (moved from
            # another stream, version or topic, or altered), or a sealed kind (its marker
            # altered, bug EA). Never read on: a forged row in a narrowing event's place
            # applied nothing and the consent was back in force (EK); a tombstone read as
            # shredded was passed over unrecorded (EA). In a stream whose keys are
            # destroyed it purges nothing that is not gone already: read as shredded, so
            # erasing the subject still frees its partition (0119).
            if self.keystore.is_shredded(str(stored_event.originator_id)):
                return SubjectProfile.ContentShredded(
                    originator_id=UUID(str(stored_event.originator_id)),
                    originator_version=stored_event.originator_version,
                    timestamp=_EPOCH,
                    topic=stored_event.topic,
                )
            if stored_event.topic == _VERDICT_TOPIC:
                # A verdict applies nothing to the views or the profile: passing over one
                # that is not authentic loses nothing, so it is damage the pipeline sets
                # aside like any other (0124), and the quarantine index does not honour
                # it. Stopping here stopped every start of the deployment (bug FN).
                raise _damaged(
                    stored_event,
                    "is a plaintext verdict that is not authenticated (damaged, moved or "
                    "forged storage)",
                )
            raise DamagedPurgeSignalError(
                f"stored event at version {stored_event.originator_version} of this "
                "subject's stream is a plaintext row (a purge signal) that is "
                "not authenticated: not in its tagged plaintext format, or its tag does not "
                "verify (damaged, moved or forged storage)"
            )
        stream = str(stored_event.originator_id)
        if kind == SUBJECT_SEALED and len(state) >= 1 + 4 + NONCE + TAG:
            key = self.keystore.key(stream, int.from_bytes(state[1:5], "big"))
            body = state[5:]
        elif (
            kind == CAPTURE_SEALED
            and len(state) >= 1 + 16 + NONCE + TAG
            and _capture_sealable(stored_event.topic)
        ):
            key = self.keystore.capture_key(stream, state[1:17].hex())
            body = state[17:]
        else:
            raise _damaged(stored_event, "is not in a known sealed format")
        if key is None and kind == SUBJECT_SEALED and self._has_keys(stream):
            # "Shredded" only when the key was destroyed: a stream's DEKs are destroyed
            # all at once (``destroy``), so a version its stream lacks while it has keys
            # is an altered row. Read as shredded it applied nothing, and a withdrawal
            # altered so was dropped from the loaded profile: consent back in force (EB).
            raise _damaged(stored_event, "names a key version its stream does not have")
        if key is None:
            return SubjectProfile.ContentShredded(
                originator_id=UUID(stream),
                originator_version=stored_event.originator_version,
                timestamp=_EPOCH,
                topic=stored_event.topic,
            )
        aad = _aad(stored_event.originator_id, stored_event.originator_version, stored_event.topic)
        try:
            plain = AESGCM(key).decrypt(body[:NONCE], body[NONCE:], aad)
        except InvalidTag as e:
            # Never include state in the message: a version only (FIELD-NOTES §3.3).
            raise _damaged(stored_event, "failed authentication (moved or altered)") from e
        return super().to_domain_event(self._replace(stored_event, plain))

    def _authentic_plain_body(self, stored_event: StoredEvent) -> bytes | None:
        """The JSON state of a plaintext row whose tag verifies for its place, or None."""
        state = stored_event.state
        if state[:1] != PLAIN_TAGGED or len(state) < 1 + 4 + PLAIN_TAG:
            return None
        key_id = int.from_bytes(state[1:5], "big")
        key = self.keystore.plain_row_key(key_id)
        if key is None:
            return None
        body = state[5 + PLAIN_TAG :]
        expected = plain_row_tag(
            key,
            key_id,
            stored_event.originator_id,
            stored_event.originator_version,
            stored_event.topic,
            body,
        )
        if not hmac.compare_digest(expected, state[5 : 5 + PLAIN_TAG]):
            return None
        return body

    def _has_keys(self, stream: str) -> bool:
        """Whether ``stream`` still has a DEK (asked after a version was not found: a
        stream erased meanwhile, by any process, has none and reads as shredded)."""
        try:
            self.keystore.current_key(stream)
        except SubjectErasedError:
            return False
        return True

    @staticmethod
    def _replace(stored: StoredEvent, state: bytes) -> StoredEvent:
        return StoredEvent(
            originator_id=stored.originator_id,
            originator_version=stored.originator_version,
            topic=stored.topic,
            state=state,
        )
