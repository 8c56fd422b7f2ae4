"""The interactive API docs work on a machine with no network.

Swagger UI and ReDoc are served from assets installed with the package; the stock FastAPI
pages load them from a CDN and render blank offline. Chromium runs with the network limited
to loopback by the test's own request filter, so a CDN reference would fail the test.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from tests.api.conftest import LiveServer
from tests.web.conftest import needs_chromium
from uprof.apikeys.store import ApiKeyStore
from uprof.kernel import Uprof
from uprof.server import create_server

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def _loopback_only(page: Any, server: LiveServer) -> list[str]:
    """Abort every request that leaves the server; return the URLs that tried."""
    refused: list[str] = []
    own = urlparse(server.url).netloc

    def route(intercepted: Any) -> None:
        url = intercepted.request.url
        if urlparse(url).netloc == own:
            intercepted.continue_()
        else:
            refused.append(url)
            intercepted.abort()

    page.route("**/*", route)
    return refused


@needs_chromium
def test_swagger_ui_lists_the_operations_offline(page: Any, server: LiveServer) -> None:
    refused = _loopback_only(page, server)
    page.goto(f"{server.url}/docs")
    page.locator(".opblock-summary-path", has_text="/v1/slices").first.wait_for()
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/v1/captures" in [p.strip() for p in paths]
    assert refused == []


@needs_chromium
def test_redoc_renders_offline(page: Any, server: LiveServer) -> None:
    refused = _loopback_only(page, server)
    page.goto(f"{server.url}/redoc")
    page.get_by_text("/v1/slices").first.wait_for()
    # The ReDoc bundle hard-codes one decorative image, its "API docs by Redocly" logo;
    # the page renders without it. Anything else leaving loopback fails the test.
    assert [u for u in refused if not u.startswith("https://cdn.redoc.ly/redoc/logo")] == []


def test_docs_pages_reference_only_local_assets(http: httpx.Client) -> None:
    for path in ("/docs", "/redoc"):
        html = http.get(path).text
        assert "cdn." not in html and "https://" not in html, path
        for asset in (
            ("/static-offline-docs/swagger-ui-bundle.js",)
            if path == "/docs"
            else ("/static-offline-docs/redoc.standalone.js",)
        ):
            assert asset in html
            assert http.get(asset).status_code == 200


def test_a_deployment_can_turn_the_docs_pages_off_and_keep_the_openapi_document(
    kernel: Uprof, keys: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Swagger UI and ReDoc run third-party JavaScript on the privacy center's origin;
    ``UPROF_API_DOCS=false`` (``uprof serve --no-api-docs``) serves neither page."""
    monkeypatch.setattr(kernel, "settings", kernel.settings.model_copy(update={"api_docs": False}))
    with (
        LiveServer(create_server(kernel, keys)) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        assert http.get("/docs").status_code == 404
        assert http.get("/redoc").status_code == 404
        # Nor their code: the bundles the pages load are not on the origin either.
        for asset in ("swagger-ui-bundle.js", "redoc.standalone.js", "swagger-ui.css"):
            assert http.get(f"/static-offline-docs/{asset}").status_code == 404, asset
        assert http.get("/docs/oauth2-redirect").status_code == 404
        assert "/v1/slices" in http.get("/openapi.json").json()["paths"]
        assert http.get("/privacy/login").status_code != 404
