"""Web pages served by the API app: the privacy center (users) and the compliance console.

``create_router()`` returns one router; ``uprof.server.create_server`` mounts it beside
the REST API. The pages reach the kernel through ``app.state.runtime`` and keys through
``app.state.api_keys``, like the REST routes do. One module per area (``privacy_*``,
``console_*``), sharing ``pages.WebPages``. See docs/web.md.
"""

from uprof.web.routes import create_router, page_error

__all__ = ["create_router", "page_error"]
