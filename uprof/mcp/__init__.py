"""The uprof MCP server (stdio and streamable HTTP) over the same service layer as REST."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ApiKeyTokenVerifier", "build_server"]

if TYPE_CHECKING:
    from uprof.mcp.server import ApiKeyTokenVerifier, build_server


def __getattr__(name: str) -> Any:
    # The server (the MCP SDK, FastAPI) loads on first use, so that registering the
    # `uprof mcp` command does not load it for every other command.
    if name in __all__:
        from uprof.mcp import server

        return getattr(server, name)
    raise AttributeError(f"module 'uprof.mcp' has no attribute {name!r}")
