"""The sync client's deadline is built on public API only (0210-sdk-polish): its
default transport is the SDK's own around an httpcore pool given the deadlined network
layer by argument. 0208 set it on httpx's transport's private pool attribute, so an
httpx whose ``HTTPTransport`` changed inside broke every client's creation."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from uprof.sdk import Client, TransportError


def test_held_the_client_needs_nothing_inside_httpx_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def changed(*args: Any, **kwargs: Any) -> None:
        raise AttributeError("'HTTPTransport' object has no attribute '_pool'")

    monkeypatch.setattr(httpx.HTTPTransport, "__init__", changed)
    with Client("http://127.0.0.1:9", "k", timeout_s=1):
        pass


def test_held_a_refused_connection_is_a_transport_error_as_before() -> None:
    """httpcore's errors come up as httpx's (``ConnectError``), told as the SDK's."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with (
        Client(f"http://127.0.0.1:{port}", "k", timeout_s=1) as client,
        pytest.raises(TransportError, match="whoami: ConnectError"),
    ):
        client.whoami()
