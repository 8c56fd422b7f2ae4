"""The one error extraction adapters raise on purpose."""

from __future__ import annotations

from domain.errors import UprofError


class ExtractionError(UprofError):
    """An extractor could not produce proposals (the model server failed or answered nonsense).

    Nothing was proposed; the capture itself is stored and can be extracted again.
    ``retryable`` tells the caller whether trying again unchanged may succeed
    (timeouts, 5xx, garbled answers) or not (4xx: bad URL, model or key).
    """

    hint = "the capture is kept; retry extraction later or configure a fallback extractor"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable
