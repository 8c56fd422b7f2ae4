"""Review of 0208-sdk-deadline-and-console-door and 0210-sdk-polish by attack: the SDK's
bound against a server (or proxy) that floods rather than drips, ``timeout_s`` values no
call can be sent under, and the environment's proxy (0212-review-of-0208-to-0210).

Every server here is a real loopback socket. A hostile one gives in after a while and
sends a whole answer, so a call without the bound returns, and the test fails, instead of
hanging."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.test_sdk_deadline import WHOAMI, _answer, _HostileServer, _read_request
from uprof.sdk import AsyncClient, Client, InvalidRequestError, TransportError

BOUND_S = 0.5
#: How long the flooding server floods before it gives in and answers.
FLOOD_S = 6.0
CONTINUES = b"HTTP/1.1 100 Continue\r\n\r\n" * 1000


class _Server:
    """A loopback server running ``answer(conn)`` for each connection after reading its
    request; ``requests`` holds each request's first line."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self._answer = answer
        self.requests: list[bytes] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self.url = f"http://{self.address}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            first = conn.recv(65536, socket.MSG_PEEK).split(b"\r\n", 1)[0]
            self.requests.append(first)
            _read_request(conn)
            self._answer(conn)

    def close(self) -> None:
        self.stop.set()
        self._sock.close()


@contextlib.contextmanager
def _serving(answer: Callable[[socket.socket], None]) -> Iterator[_Server]:
    server = _Server(answer)
    try:
        yield server
    finally:
        server.close()


def _flooding(body: bytes) -> Callable[[socket.socket], None]:
    """``100 Continue`` as fast as the socket takes it for ``FLOOD_S``, then ``body``."""

    def answer(conn: socket.socket) -> None:
        until = time.monotonic() + FLOOD_S
        while time.monotonic() < until:
            conn.sendall(CONTINUES)
        conn.sendall(_answer(body))

    return answer


def _whole(body: bytes) -> Callable[[socket.socket], None]:
    return lambda conn: conn.sendall(_answer(body))


def _sync(url: str, call: Callable[[Client], Any], **kwargs: Any) -> Any:
    with Client(url, "uprof_test_key", **kwargs) as client:
        try:
            return call(client)
        except TransportError as error:
            return error


def _async(url: str, call: Callable[[AsyncClient], Any], **kwargs: Any) -> Any:
    async def run() -> Any:
        async with AsyncClient(url, "uprof_test_key", **kwargs) as client:
            try:
                return await call(client)
            except TransportError as error:
                return error

    return asyncio.run(run())


def _assert_expired(outcome: Any, name: str) -> None:
    assert isinstance(outcome, TransportError), f"{name} returned {outcome!r}: no deadline"
    assert f"{name}: no whole answer within timeout_s={BOUND_S}" in str(outcome), str(outcome)


# -- SA: a flood, not a drip ---------------------------------------------------------------

FLOODED: dict[str, Callable[[Any], Any]] = {
    "whoami": lambda client: client.whoami(),
    "capture": lambda client: client.capture("alice", agent_id="agent:one", user_input="hi"),
}


@pytest.mark.parametrize("name", sorted(FLOODED))
def test_sa_a_flood_of_100_continue_cannot_hold_a_sync_call_past_timeout_s(name: str) -> None:
    """Each read found bytes already there, so the clamp's tiny last timeout never fired."""
    with _serving(_flooding(WHOAMI)) as server:
        _assert_expired(_sync(server.url, FLOODED[name], timeout_s=BOUND_S), name)


def test_sa_a_flood_cannot_hold_a_sync_export_waiting_for_its_answer(tmp_path: Path) -> None:
    dest = tmp_path / "trail.jsonl"
    with _serving(_flooding(b"")) as server:
        outcome = _sync(server.url, lambda client: client.audit_export_to(dest), timeout_s=BOUND_S)
    _assert_expired(outcome, "audit_export")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", sorted(FLOODED))
def test_held_a_flood_cannot_hold_an_async_call_past_timeout_s(name: str) -> None:
    """anyio's reads are checkpoints: the cancel lands though bytes keep coming."""
    with _serving(_flooding(WHOAMI)) as server:
        _assert_expired(_async(server.url, FLOODED[name], timeout_s=BOUND_S), name)


def test_held_a_deadlined_connection_is_not_reused_half_read() -> None:
    """A send cut by its deadline mid-answer closes its connection: the next call on the
    same client opens a new one and reads its own answer, not the rest of the last."""
    served = 0

    def answer(conn: socket.socket) -> None:
        nonlocal served
        served += 1
        if served == 1:  # the first connection: headers, then the body a byte at a time
            head, _, body = _answer(WHOAMI).partition(b"\r\n\r\n")
            conn.sendall(head + b"\r\n\r\n")
            for i in range(len(body)):
                conn.sendall(body[i : i + 1])
                time.sleep(0.05)
            return
        conn.sendall(_answer(WHOAMI))

    with _serving(answer) as server, Client(server.url, "k", timeout_s=BOUND_S) as client:
        _assert_expired(_catch(client.whoami), "whoami")
        assert client.whoami().app_id == "app:one"
        assert len(server.requests) == 2


def _catch(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except TransportError as error:
        return error


# -- SB: timeout_s no call can be sent under -----------------------------------------------

BAD_TIMEOUTS = [0, 0.0, -1, float("nan"), float("inf"), 1e300, threading.TIMEOUT_MAX * 2, "5", True]


@pytest.mark.parametrize("value", BAD_TIMEOUTS, ids=repr)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sb_a_timeout_s_no_call_can_be_sent_under_is_refused_naming_it(
    value: Any, kind: str
) -> None:
    """Taken as given, each failed only at the first call: 0 and -1 as an expired
    deadline (nothing ever sent), NaN a socket's ValueError, inf an OverflowError."""
    with pytest.raises(InvalidRequestError) as refused:
        if kind == "sync":
            Client("http://127.0.0.1:9", "k", timeout_s=value).close()
        else:
            asyncio.run(AsyncClient("http://127.0.0.1:9", "k", timeout_s=value).aclose())
    assert [problem.field for problem in refused.value.fields] == ["timeout_s"]
    assert "timeout_s" in str(refused.value)


@pytest.mark.parametrize("value", [None, 0.001 * 1000, 7, threading.TIMEOUT_MAX], ids=repr)
def test_held_every_timeout_s_in_range_is_a_bound_calls_are_sent_under(value: Any) -> None:
    """The bounds of the range, and None (no bound), answer a quick server, sync and
    async: the upper one is one the system's waits take."""
    with _serving(_whole(WHOAMI)) as server:
        for run in (_sync, _async):
            answer = run(server.url, lambda client: client.whoami(), timeout_s=value)
            assert getattr(answer, "app_id", answer) == "app:one"


# -- SC: the environment's proxy -----------------------------------------------------------


def _unused_origin() -> str:
    """A loopback address nothing listens on: only a proxy can answer for it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Set the environment's proxies (lower case, the spelling urllib prefers), all
    others cleared."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)

    def setting(**names: str) -> None:
        for name, value in names.items():
            monkeypatch.setenv(name, value)

    return setting


@pytest.mark.parametrize("variable", ["http_proxy", "all_proxy"])
def test_sc_the_sync_client_goes_through_the_environment_proxy(
    proxy_env: Callable[..., None], variable: str
) -> None:
    """httpx mounts the environment's proxies only when given no transport; given the
    SDK's own (0208 on), none was mounted and every sync call went direct."""
    origin = _unused_origin()
    with _serving(_whole(WHOAMI)) as proxy:
        proxy_env(**{variable: proxy.url})
        answer = _sync(origin, lambda client: client.whoami(), timeout_s=5)
        assert getattr(answer, "app_id", answer) == "app:one"
        assert proxy.requests == [f"GET {origin}/v1/whoami HTTP/1.1".encode()]


def test_sc_a_proxy_without_a_scheme_is_http(proxy_env: Callable[..., None]) -> None:
    origin = _unused_origin()
    with _serving(_whole(WHOAMI)) as proxy:
        proxy_env(http_proxy=proxy.address)
        answer = _sync(origin, lambda client: client.whoami(), timeout_s=5)
        assert getattr(answer, "app_id", answer) == "app:one"


def test_sc_a_slow_proxy_cannot_hold_a_sync_call_past_timeout_s(
    proxy_env: Callable[..., None],
) -> None:
    """Through the proxy the bound is the SDK's whole-send bound, not a per-read one."""
    proxy = _HostileServer("headers", WHOAMI)
    try:
        proxy_env(http_proxy=proxy.url)
        outcome = _sync(_unused_origin(), lambda client: client.whoami(), timeout_s=BOUND_S)
    finally:
        proxy.close()
    _assert_expired(outcome, "whoami")


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "*", "localhost,127.0.0.1/8"])
def test_held_no_proxy_sends_direct(proxy_env: Callable[..., None], no_proxy: str) -> None:
    with _serving(_whole(WHOAMI)) as proxy, _serving(_whole(WHOAMI)) as origin:
        proxy_env(http_proxy=proxy.url, no_proxy=no_proxy)
        answer = _sync(origin.url, lambda client: client.whoami(), timeout_s=5)
        assert getattr(answer, "app_id", answer) == "app:one"
        assert proxy.requests == [] and len(origin.requests) == 1


def test_held_a_transport_given_is_the_whole_road(proxy_env: Callable[..., None]) -> None:
    """The caller's own ``transport=`` is used as httpx uses it: no proxy mounted over it."""
    with _serving(_whole(WHOAMI)) as proxy, _serving(_whole(WHOAMI)) as origin:
        proxy_env(http_proxy=proxy.url)
        answer = _sync(
            origin.url, lambda client: client.whoami(), timeout_s=5, transport=httpx.HTTPTransport()
        )
        assert getattr(answer, "app_id", answer) == "app:one"
        assert proxy.requests == []


# -- the export under the deadline, cancelled from outside ---------------------------------


def _export_answer(conn: socket.socket, cut: bool) -> None:
    """A subject export's answer whose headers come at once and whose body drips, a piece
    each 0.05 s, well inside each read's timeout; ``cut``: the connection closes halfway."""
    body = b'{"export": {"subject": "alice", "items": [' + b'"x", ' * 400 + b'"x"]}}'
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
    conn.sendall(head.encode() + b"\r\n\r\n")
    for at in range(0, len(body) // 2 if cut else len(body), 8):
        conn.sendall(body[at : at + 8])
        time.sleep(0.05)


def test_held_an_export_cancelled_by_its_caller_mid_body_leaves_the_path_as_it_was(
    tmp_path: Path,
) -> None:
    """The async export cancelled from outside (``wait_for``) while its body arrives: the
    path keeps what it held, and no part file stays."""
    dest = tmp_path / "alice.json"
    dest.write_text("before")

    async def cancelled(url: str) -> None:
        async with AsyncClient(url, "k", timeout_s=5) as client:
            await asyncio.wait_for(client.export_subject_to("alice", dest), 0.5)

    with _serving(lambda conn: _export_answer(conn, cut=False)) as server:
        with pytest.raises(TimeoutError):
            asyncio.run(cancelled(server.url))
    assert dest.read_text() == "before"
    assert [p.name for p in tmp_path.iterdir()] == ["alice.json"]


def test_held_an_export_whose_server_hangs_up_mid_body_leaves_the_path_as_it_was(
    tmp_path: Path,
) -> None:
    dest = tmp_path / "alice.json"
    dest.write_text("before")
    with _serving(lambda conn: _export_answer(conn, cut=True)) as server:
        outcome = _sync(server.url, lambda client: client.export_subject_to("alice", dest))
    assert isinstance(outcome, TransportError), outcome
    assert dest.read_text() == "before"
    assert [p.name for p in tmp_path.iterdir()] == ["alice.json"]
