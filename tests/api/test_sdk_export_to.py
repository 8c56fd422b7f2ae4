"""A subject's export of any size through the SDK: ``export_subject_to`` (0199's Left).

Bug QO: ``export_subject`` reads its answer up to ``MAX_ANSWER_BYTES`` (64 MiB, bug PV),
and nothing else in the SDK read a subject's export, so an export over 64 MiB, which REST
answers, could not be had through the SDK at all. ``export_subject_to(subject, dest)``
writes the export document to a file as it arrives (sync, async, embedded): memory flat,
and a path holds the whole export or what it held before (no part of a refused or cut
answer is left at it).

The large and the broken answers come from a small ASGI app on real uvicorn (the server
builds a subject's export whole in memory, which is the server's bound, not the SDK's);
the ordinary one from the real server on both backends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import PRIVACY, Apps, LiveServer, bearer, grant, interaction
from uprof.kernel import Uprof
from uprof.sdk import AsyncClient, Client, PermissionDeniedError, TransportError

MIB = 1024 * 1024
#: Past the bound ``export_subject`` reads (docs/api.md, "SDK").
LARGE = 64 * MIB + 8 * MIB
CHUNK = 256 * 1024
BEFORE = "what the path held before\n"


async def answering(scope: dict[str, Any], receive: Any, send: Any) -> bool:
    """Serve an ASGI lifespan (False), or read a request and start its answer, 200 JSON
    (True): the body is the caller's to send."""
    if scope["type"] == "lifespan":
        while (kind := (await receive())["type"]) != "lifespan.shutdown":
            await send({"type": f"{kind}.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return False
    while (await receive()).get("more_body"):
        pass
    start = {"type": "http.response.start", "status": 200}
    await send({**start, "headers": [(b"content-type", b"application/json")]})
    return True


class _Export:
    """An ASGI app answering a subject export of ``size`` bytes of blob, in chunks, made
    as it is sent (``whole=False``: the closing braces never come)."""

    def __init__(self, size: int, *, whole: bool = True) -> None:
        self.size = size
        self.whole = whole

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not await answering(scope, receive, send):
            return

        async def body(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await body(b'{"export":{"subject":"alice","blob":"')
        for _ in range(self.size // CHUNK):
            await body(b"x" * CHUNK)
        await body(b'"}}' if self.whole else b"")
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.fixture
def served() -> Iterator[list[LiveServer]]:
    started: list[LiveServer] = []
    yield started
    for live in started:
        live.__exit__(None, None, None)


def _serve(served: list[LiveServer], app: _Export) -> str:
    live = LiveServer(app).__enter__()
    served.append(live)
    return live.url


def _both_ways(url: str, dest: Path) -> Iterator[BaseException | None]:
    """What ``export_subject_to`` raises (None when it returns), sync then async, each
    yielded before the next runs."""
    with Client(url, "k", timeout_s=120) as client:
        try:
            client.export_subject_to("alice", dest)
        except Exception as error:
            yield error
        else:
            yield None

    async def run() -> BaseException | None:
        async with AsyncClient(url, "k", timeout_s=120) as client:
            try:
                await client.export_subject_to("alice", dest)
            except Exception as error:
                return error
            return None

    yield asyncio.run(run())


def _leftovers(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != name)


def test_qo_an_export_over_the_answer_bound_is_written_whole(
    served: list[LiveServer], tmp_path: Path
) -> None:
    url = _serve(served, _Export(LARGE))
    dest = tmp_path / "alice.json"
    # Held: the in-memory read stops at its bound and says so.
    with Client(url, "k", timeout_s=120) as client, pytest.raises(TransportError) as bounded:
        client.export_subject("alice")
    assert "longer than" in str(bounded.value)
    for outcome in _both_ways(url, dest):
        assert outcome is None, outcome
        assert dest.stat().st_size == LARGE + len('{"subject":"alice","blob":""}')
        with dest.open("rb") as written:
            assert written.read(27) == b'{"subject":"alice","blob":"'
            written.seek(-5, 2)
            assert written.read() == b'xxx"}'
        assert _leftovers(tmp_path, dest.name) == []
        dest.unlink()


def test_qo_a_cut_answer_leaves_the_path_as_it_was(
    served: list[LiveServer], tmp_path: Path
) -> None:
    url = _serve(served, _Export(4 * MIB, whole=False))
    dest = tmp_path / "alice.json"
    dest.write_text(BEFORE)
    for outcome in _both_ways(url, dest):
        assert isinstance(outcome, TransportError), outcome
        assert "not a whole" in str(outcome)
        assert dest.read_text() == BEFORE
        assert _leftovers(tmp_path, dest.name) == []


def test_qo_the_document_is_export_subjects_on_the_real_server(
    server: LiveServer, http: httpx.Client, apps: Apps, kernel: Uprof, tmp_path: Path
) -> None:
    """Over HTTP and embedded, the file is ``export_subject``'s document; a refused export
    leaves the path as it was."""
    grant(http, apps.planner, "alice")
    for text in ("I am vegetarian", "I live in Lisbon \u2014 na\u00efve caf\u00e9 \U0001f600"):
        captured = http.post(
            "/v1/captures",
            headers=bearer(apps.planner),
            json={"subject": "alice", **interaction(text)},
        )
        assert captured.status_code == 201, captured.text
    folder = tmp_path / "exports"
    folder.mkdir()
    dest = folder / "alice.json"
    with (
        Client(server.url, apps.privacy) as remote,
        Client.embedded(kernel, PRIVACY) as local,
        Client(server.url, apps.calendar) as refused,
    ):
        for client in (remote, local):
            client.export_subject_to("alice", dest)
            written = json.loads(dest.read_text("utf-8"))
            read = client.export_subject("alice")
            assert written.pop("exported_at") <= read.pop("exported_at")  # type: ignore[operator]
            assert written == read
        dest.write_text(BEFORE)
        with pytest.raises(PermissionDeniedError):
            refused.export_subject_to("alice", dest)
    assert dest.read_text() == BEFORE
    assert _leftovers(folder, dest.name) == []
