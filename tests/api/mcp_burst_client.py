"""A client process for tests: send N ``initialize`` requests of one key at once.

``python mcp_burst_client.py URL TOKEN N``: prints ``{"<status>": <count>, ...}``.
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
from mcp_messages import ACCEPT, HELLO  # beside this file: it runs as a script


async def _burst(url: str, token: str, n: int) -> dict[str, int]:
    headers = {**ACCEPT, "Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        answers = await asyncio.gather(
            *[client.post(url, json=HELLO, headers=headers) for _ in range(n)]
        )
    counts: dict[str, int] = {}
    for answer in answers:
        counts[str(answer.status_code)] = counts.get(str(answer.status_code), 0) + 1
    return counts


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_burst(sys.argv[1], sys.argv[2], int(sys.argv[3])))))
