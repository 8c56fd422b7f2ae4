"""Seal read-model fields under the subject's view key (AES-SIV, deterministic).

Deterministic on purpose: the same content in the same row seals to the same
bytes, so a rebuilt read model equals the live one byte for byte (I11). The
associated data binds each ciphertext to its table, column and row; equality of
two ciphertexts reveals only that a field did not change.
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from domain.errors import SubjectErasedError
from uprof.crypto.keystore import KeyStore


class ViewSealer:
    """Seal and open personal fields of the read models, per subject."""

    def __init__(self, keystore: KeyStore) -> None:
        self._keystore = keystore

    def seal(self, stream_id: str, context: str, data: bytes) -> bytes:
        key = self._keystore.view_key(stream_id)
        if key is None:
            raise SubjectErasedError("this subject's keys have been destroyed")
        return AESSIV(key).encrypt(data, [context.encode()])

    def open(self, stream_id: str, context: str, data: bytes) -> bytes | None:
        """Return the plaintext, or None when the key is gone (erased subject)."""
        key = self._keystore.view_key(stream_id)
        if key is None:
            return None
        try:
            return AESSIV(key).decrypt(data, [context.encode()])
        except InvalidTag:
            return None

    def lookup(self, stream_id: str, context: str, value: str) -> str:
        """Keyed hash of an identifier under the subject's view key (32 hex characters).

        Deterministic, so a rebuild writes the same value (I11); an empty value maps
        to "" (no identifier given). Raises SubjectErasedError when the key is gone.
        """
        if not value:
            return ""
        key = self._keystore.view_key(stream_id)
        if key is None:
            raise SubjectErasedError("this subject's keys have been destroyed")
        msg = b"uprof/lookup/1\x1f" + context.encode() + b"\x1f" + value.encode()
        return hmac.new(key, msg, hashlib.sha256).hexdigest()[:32]
