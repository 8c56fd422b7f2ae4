"""The whole HTTP service of one deployment: the REST API plus the web pages.

``uprof serve`` runs this. The REST API (``uprof.api``) and the privacy center and
compliance console (``uprof.web``, which builds on the API's authentication, errors and
runtime) are composed here, so neither package imports the one above it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from uprof.api import ApiKeyStore, create_app
from uprof.kernel import Uprof
from uprof.web import create_router as create_web_router
from uprof.web import page_error


def create_server(kernel: Uprof, api_keys: ApiKeyStore, **options: Any) -> FastAPI:
    """The REST API with the privacy center and the compliance console mounted.

    ``options`` are ``create_app``'s (body size limit, readiness lag bound).
    """
    return create_app(
        kernel,
        api_keys,
        extra_routers=(create_web_router(),),
        page_errors=page_error,
        **options,
    )
