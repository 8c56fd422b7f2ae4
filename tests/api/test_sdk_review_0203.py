"""Held (review of 0203 and 0205): the SDK against a hostile server, beside 0203's QB.

A real loopback server (``tests.api.conftest.LiveServer``) answering a redirect to
another host: the SDK does not follow it (httpx's default, kept), so neither the key
nor the body goes there, and the call ends in the SDK's error. Every request, the
redirect's included, asked for ``identity``; an answer with an empty
``Content-Encoding`` is read as one without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import LiveServer
from tests.api.test_sdk_encoded_answers import _answer, _Asked
from uprof.sdk import UprofClientError

WHO = b'{"app_id": "app:planner", "key_id": "k1", "roles": ["app"]}'


def _asked(status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
    app = _Asked(status, body, headers)
    app.asked = []
    return app


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_held_a_redirect_to_another_host_is_not_followed(
    how: str, status: int, tmp_path: Path
) -> None:
    elsewhere = _asked(200, WHO, [(b"content-type", b"application/json")])
    with LiveServer(elsewhere) as other:
        there = f"{other.url}/v1/whoami".encode()
        hostile = _asked(status, b"", [(b"location", there)])
        with LiveServer(hostile) as server:
            got, _ = _answer(server.url, how, "whoami", tmp_path)
    assert isinstance(got, UprofClientError), repr(got)
    assert elsewhere.asked == [], "the SDK followed the redirect to another host"
    assert hostile.asked == [b"identity"]


@pytest.mark.parametrize("how", ["sync", "async"])
def test_held_an_empty_content_encoding_is_read_as_none(how: str, tmp_path: Path) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-encoding", b"")]
    with LiveServer(_asked(200, WHO, headers)) as server:
        got, _ = _answer(server.url, how, "whoami", tmp_path)
    assert getattr(got, "app_id", None) == "app:planner", repr(got)
