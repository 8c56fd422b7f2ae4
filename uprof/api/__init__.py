"""The REST API of uprof: ``create_app(kernel, api_keys)`` and the API-key store.

Everything a route does goes through ``AppScope`` (``uprof.api.scoped``), the same
object the MCP server and the SDK's embedded mode use.
"""

from uprof.api.app import create_app
from uprof.api.keys import ApiKeyStore, IssuedKey, Principal

__all__ = ["ApiKeyStore", "IssuedKey", "Principal", "create_app"]
