"""The uprof MCP server (stdio and streamable HTTP) over the same service layer as REST."""

from uprof.mcp.server import ApiKeyTokenVerifier, build_server

__all__ = ["ApiKeyTokenVerifier", "build_server"]
