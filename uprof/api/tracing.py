"""One server span per HTTP request, when tracing is on (decision 0035-observability).

The span is named and labelled by the route *template* (``POST /v1/captures``), never the
raw path or query string, and carries the method and status only: nothing a caller sends
becomes part of a span. A caller's W3C ``traceparent`` header is continued, so an agent
that traces its own work sees uprof's spans inside its trace. Off, a request pays one
check of a module global.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from uprof import telemetry
from uprof.api.metrics import KNOWN_METHODS

_PROPAGATED = (b"traceparent", b"tracestate")


class TracingMiddleware:
    """Open the request's server span; the kernel's spans become its children."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not telemetry.enabled():
            await self.app(scope, receive, send)
            return
        method = scope["method"] if scope["method"] in KNOWN_METHODS else "OTHER"
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in _PROPAGATED
        }
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        with telemetry.server_span(method, headers) as traced:
            try:
                await self.app(scope, receive, record_status)
            finally:
                route = getattr(scope.get("route"), "path", None) or "<unmatched>"
                if isinstance(traced, telemetry.Span):
                    traced.rename(f"{method} {route}")
                    traced.set_http(method=method, route=route, status=status)
