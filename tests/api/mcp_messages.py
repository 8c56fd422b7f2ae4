"""What the MCP HTTP tests send: the headers the streamable transport wants and the
``initialize`` request, kept in one place so that a protocol change is one edit.

Also imported by ``mcp_burst_client.py``, which runs as a script in its own process.
"""

from __future__ import annotations

import json
from typing import Any

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

#: The protocol revision of the SDK's sessionless path: no ``initialize``, every request
#: carries who the client is in ``_meta`` (``META``).
MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "uprof-tests", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
#: Headers of a sessionless ``tools/call`` of ``capture``.
SESSIONLESS_CAPTURE = {
    **POST_JSON,
    "MCP-Protocol-Version": MODERN,
    "Mcp-Method": "tools/call",
    "Mcp-Name": "capture",
}


def rpc(method: str, n: int | None = None, params: dict[str, Any] | None = None) -> str:
    """A JSON-RPC message as text: a request with id ``n``, a notification without."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if n is not None:
        message["id"] = n
    if params is not None:
        message["params"] = params
    return json.dumps(message)
