"""Extraction adapters: turn a captured interaction into a ProposalBatch.

- :class:`RuleBasedExtractor`: offline, English, regex rules; the default.
- :class:`OpenAICompatibleExtractor`: any OpenAI-compatible chat server
  (Ollama, vLLM), with an optional fallback extractor.
- :class:`ExtractionError`: raised when an extractor cannot produce proposals.

Both extractors satisfy :class:`uprof.ports.Extractor` and attach the capture
id as the evidence of every proposal themselves.
"""

from uprof.adapters.extraction.errors import ExtractionError
from uprof.adapters.extraction.llm import SYSTEM_PROMPT, OpenAICompatibleExtractor
from uprof.adapters.extraction.rules import AUTHOR, RuleBasedExtractor

__all__ = [
    "AUTHOR",
    "SYSTEM_PROMPT",
    "ExtractionError",
    "OpenAICompatibleExtractor",
    "RuleBasedExtractor",
]
