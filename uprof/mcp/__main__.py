"""``python -m uprof.mcp mcp --transport stdio``: the MCP server without the main CLI."""

from uprof.mcp.cli import standalone

standalone()(prog_name="python -m uprof.mcp")
