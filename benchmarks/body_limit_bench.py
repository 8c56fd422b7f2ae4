"""Cost of the request body limit's wrapper per request (decision 0138-hostile-callers-round-7).

``BodySizeLimitMiddleware`` around an ASGI app that reads a small body and answers ``{}``,
called in process (no server, no network): what the limit itself adds to every REST and
MCP request. Run from a tree's root to measure that tree's code:
``python -m benchmarks.body_limit_bench``.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from starlette.types import Message, Receive, Scope, Send

from uprof.api.limits import BodySizeLimitMiddleware

RUNS = 15
REQUESTS = 20_000


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"{}"})


async def _measure() -> float:
    limited = BodySizeLimitMiddleware(_app, 1_048_576)
    scope: Scope = {"type": "http", "method": "POST", "headers": []}

    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"a":1}', "more_body": False}

    async def send(message: Message) -> None:
        return None

    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(REQUESTS):
            await limited(scope, receive, send)
        runs.append((time.perf_counter() - start) / REQUESTS * 1e6)
    return statistics.median(runs)


def main() -> None:
    median = asyncio.run(_measure())
    print(f"body limit: median {median:.2f} us per request ({RUNS} runs x {REQUESTS})")


if __name__ == "__main__":
    main()
