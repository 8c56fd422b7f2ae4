"""uprof: a governed, event-sourced profile service for multi-agent LLM systems."""

__version__ = "0.1.0"

from uprof.sdk import Client

__all__ = ["Client", "__version__"]
