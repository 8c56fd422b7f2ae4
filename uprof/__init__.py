"""uprof: a governed, event-sourced profile service for multi-agent LLM systems."""

__version__ = "0.1.0"

from uprof.sdk import Client  # noqa: E402 - the SDK's entry point, re-exported for users

__all__ = ["Client", "__version__"]
