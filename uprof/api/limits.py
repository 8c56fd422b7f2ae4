"""Refuse request bodies over a size limit (413) before they are parsed.

Two checks, because clients differ: a declared ``Content-Length`` over the limit is
refused before a byte of the body is read; a chunked body is counted as it arrives
and refused the moment it passes the limit. Either way the route never runs, so a
refused request writes nothing.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from uprof.api.errors import payload_too_large

#: Default request body limit: a batch of ~1,000 short interactions fits.
DEFAULT_MAX_BODY_BYTES = 1_048_576


class BodyTooLargeError(HTTPException):
    """Raised from ``receive``; an HTTPException so FastAPI's body reader passes it through."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(413, payload_too_large(limit_bytes).message)


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            if declared <= DRAIN_FACTOR * self.max_body_bytes:
                # Read and drop a moderately large body first: a client still sending when
                # the connection closes sees a reset instead of our 413.
                await _drain(receive)
            await self._refuse(scope, receive, send)
            return
        received = 0
        over = False
        started = False  # the app's own answer began before the body went over
        refused = False  # our 413 was sent

        async def counted() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    over = True
                    raise BodyTooLargeError(self.max_body_bytes)
            return message

        async def sent(message: Message) -> None:
            # Once the body went over, whatever the app answers for it is replaced by the
            # one refusal: REST turned it into its JSON error, but an app that is not
            # FastAPI's (the MCP SDK's Starlette app) answered text/plain (hostile callers
            # round 7, bug HK). An answer the app had already begun is left alone.
            nonlocal started, refused
            if over and not started:
                if not refused:
                    refused = True
                    await self._refuse(scope, receive, send)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, sent)
        except BodyTooLargeError:
            if started:
                raise
            if not refused:
                refused = True
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.responses import JSONResponse

        body = payload_too_large(self.max_body_bytes).body().model_dump(mode="json")
        # Connection: close, so the client does not go on streaming the body we refused.
        response = JSONResponse(body, status_code=413, headers={"Connection": "close"})
        await response(scope, receive, send)


#: Bodies up to this many times the limit are drained before the 413 is sent.
DRAIN_FACTOR = 16


async def _drain(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
