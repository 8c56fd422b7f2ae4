"""Web pages served by the API app: the privacy center (users) and the compliance console.

``create_router()`` returns one router; ``uprof.api.app.create_app`` includes it. The pages
reach the kernel through ``app.state.runtime`` and keys through ``app.state.api_keys``, like
the REST routes do. See docs/web.md.
"""

from uprof.web.routes import create_router

__all__ = ["create_router"]
