"""The REST API of uprof: ``create_app(kernel, api_keys)`` and the API-key store.

Everything a route does goes through ``AppScope`` (``uprof.api.scoped``), the same
object the MCP server and the SDK's embedded mode use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ApiKeyStore", "IssuedKey", "Principal", "create_app"]

if TYPE_CHECKING:
    from uprof.api.app import create_app
    from uprof.apikeys.store import ApiKeyStore, IssuedKey, Principal


def __getattr__(name: str) -> Any:
    # Loaded on first use: a command that needs only the key store must not load
    # FastAPI, which costs every CLI command most of a second.
    if name == "create_app":
        from uprof.api.app import create_app

        return create_app
    if name in ("ApiKeyStore", "IssuedKey", "Principal"):
        from uprof.apikeys import store

        return getattr(store, name)
    raise AttributeError(f"module 'uprof.api' has no attribute {name!r}")
