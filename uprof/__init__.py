"""uprof: a governed, event-sourced profile service for multi-agent LLM systems."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Client", "__version__"]

if TYPE_CHECKING:
    from uprof.sdk import Client


def __getattr__(name: str) -> Any:
    # Loaded on first use: `import uprof` (every CLI start) stays cheap, while
    # `from uprof import Client` works as documented.
    if name == "Client":
        from uprof.sdk import Client

        return Client
    raise AttributeError(f"module 'uprof' has no attribute {name!r}")
