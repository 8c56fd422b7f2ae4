"""What the MCP HTTP tests send: the headers the streamable transport wants and the
``initialize`` request, kept in one place so that a protocol change is one edit.

Also imported by ``mcp_burst_client.py``, which runs as a script in its own process.
"""

from __future__ import annotations

#: The streamable HTTP transport answers in JSON or as an event stream; a client must
#: accept both.
ACCEPT = {"Accept": "application/json, text/event-stream"}
#: ``ACCEPT`` for a body sent as text (``content=``): httpx names the type only for ``json=``.
POST_JSON = {**ACCEPT, "Content-Type": "application/json"}
#: The first request of a session (protocol version of the SDK's stateful transport).
HELLO = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "uprof-tests", "version": "1"},
    },
}
