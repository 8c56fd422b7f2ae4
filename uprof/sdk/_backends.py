"""Where a call goes: the REST API over httpx (sync or async), or a kernel in this process.

All backends take a validated ``Call`` and return its response model, or raise the
SDK error for the failure, so the clients above them cannot tell them apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import time
import urllib.request
import uuid
from collections.abc import AsyncGenerator, Generator, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import httpcore
import httpx
from pydantic import BaseModel, ValidationError

from uprof.retry import Backoff, RetryPolicy
from uprof.sdk._errors import TransportError, UprofClientError, error_for, retry_after_header
from uprof.sdk._operations import Call

if TYPE_CHECKING:
    from uprof.kernel import Uprof

R = TypeVar("R", bound=BaseModel)

_log = logging.getLogger(__name__)

#: The most the SDK takes of an answer it returns whole as bytes: a proof document
#: (``audit_proof``). A proof of any tree is a few kilobytes, and ``uprof audit
#: verify-proof`` reads at most 16 MiB of one (``uprof.cli.govern.MAX_DOCUMENT_BYTES``):
#: a longer answer, from a broken or hostile server, is refused once one byte past this
#: has arrived, not taken whole (bug OI).
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024


#: The most the SDK takes of the body of an answer of status 400 or more to a streamed or
#: byte call (``audit_export``, ``audit_export_to``, ``audit_proof``): the server's
#: error is a small JSON object (``{"error": {code, message, details}}``, a few
#: kilobytes at most). The export's was read whole, and the proof's taken to
#: ``MAX_DOCUMENT_BYTES`` as if it were the proof (bug PE).
MAX_ERROR_BODY_BYTES = 1024 * 1024


#: The most the SDK takes of the answer of status below 400 to an ordinary JSON call
#: (``send``: every call but the export and the proof), in memory before it is parsed.
#: The largest is a subject's export (``export_subject``), all of one subject's data;
#: the figure is what ``audit_export`` collects in memory
#: (``uprof.sdk._client.AUDIT_EXPORT_MAX_BYTES``). Every answer was read whole: a broken
#: or hostile server answering without end took the app's memory (bug PV).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class _Capped:
    """The bytes of one answer, refused (``TransportError``) past ``limit``: a proof
    document's ``MAX_DOCUMENT_BYTES``, an error answer's ``MAX_ERROR_BODY_BYTES``, a JSON
    call's ``MAX_ANSWER_BYTES``."""

    def __init__(self, name: str, limit: int = MAX_DOCUMENT_BYTES, what: str = "") -> None:
        self._name = name
        self._limit = limit
        self._what = what or "the most the SDK takes of a proof document"
        self._chunks: list[bytes] = []
        self._size = 0

    @classmethod
    def error_of(cls, name: str, status: int) -> _Capped:
        """For the body of an answer of ``status`` (400 or more)."""
        return cls(
            name,
            MAX_ERROR_BODY_BYTES,
            f"the most the SDK takes of an error answer (status {status}): the server "
            "answered with an error and a body without end",
        )

    @classmethod
    def answer_of(cls, name: str, response: httpx.Response) -> _Capped:
        """For the whole of ``response`` to an ordinary JSON call (``send``)."""
        status = _plain(name, response)
        if status >= 400:
            return cls.error_of(name, status)
        return cls(
            name,
            MAX_ANSWER_BYTES,
            f"the most the SDK takes of an answer (status {status}) to a call",
        )

    def add(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self._limit:
            self._chunks = []  # let go of it before the error travels up
            raise TransportError(
                f"{self._name}: the answer is longer than {self._limit} bytes, {self._what}"
            )
        self._chunks.append(chunk)

    def content(self) -> bytes:
        return b"".join(self._chunks)


#: The only encoding the SDK asks for (``Accept-Encoding``) and reads. httpx decodes a
#: compressed answer a piece at a time, each piece whole, before any bound can count it:
#: ``gzip`` nested in ``gzip`` made 2 GiB of 1,827 bytes on the wire, ``zstd`` 1 GiB of
#: 32 KiB (bug QB). The server never compresses, and a proxy honours the ask.
ACCEPTED_ENCODING = "identity"


def _plain(name: str, response: httpx.Response) -> int:
    """``response``'s status, once its body is known to come as it is
    (``ACCEPTED_ENCODING``): an encoded answer is refused (``TransportError``) before a
    byte of it is read or decoded."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", ACCEPTED_ENCODING):
        raise TransportError(
            f"{name}: the answer (status {response.status_code}) came encoded "
            f"({encoding!r}), though the SDK asks for it as it is ({ACCEPTED_ENCODING!r}): "
            "a compressed answer may decode to far more than any bound, so none is read"
        )
    return response.status_code


def _read(response: httpx.Response, body: bytes) -> httpx.Response:
    """``response`` with ``body``, the decoded bytes read of it through a ``_Capped``:
    its status and headers (Retry-After) kept, less those that describe the bytes on the
    wire (already decoded; a ``Content-Encoding`` kept would decode them twice)."""
    headers = httpx.Headers(response.headers)
    for name in ("content-encoding", "content-length", "transfer-encoding"):
        headers.pop(name, None)
    return httpx.Response(
        response.status_code, headers=headers, content=body, request=response.request
    )


def _raise_error_answer(call: Call[Any], response: httpx.Response, body: bytes) -> None:
    """Raise the SDK error for ``response`` (status 400 or more), its body ``body`` (read
    through ``_Capped.error_of``), its headers (Retry-After) kept: the proof's error,
    rebuilt from its bytes alone, lost the wait the server asked for (bug PE)."""
    _parse(call, _read(response, body))


def _answer_whole(call: Call[Any], response: httpx.Response) -> httpx.Response:
    """The answer of a JSON call read through ``_Capped.answer_of``, for ``send`` (bug
    PV: httpx read it whole, however long). Past the bound, ``TransportError`` naming the
    call, the status and the bound (and the key its write was sent with); the caller's
    ``stream`` block then closes the connection unread."""
    try:
        body = _Capped.answer_of(call.operation.name, response)
        for chunk in response.iter_bytes():
            body.add(chunk)
    except TransportError as too_long:
        raise _with_key(call, too_long) from None
    return _read(response, body.content())


async def _answer_whole_async(call: Call[Any], response: httpx.Response) -> httpx.Response:
    """``_answer_whole`` for the async client."""
    try:
        body = _Capped.answer_of(call.operation.name, response)
        async for chunk in response.aiter_bytes():
            body.add(chunk)
    except TransportError as too_long:
        raise _with_key(call, too_long) from None
    return _read(response, body.content())


class _Deadline:
    """When one send of a call must have its whole answer: ``timeout_s`` after it began
    (bug RL: httpx's timeouts are per read, so a server sending a byte every half second,
    or ``100 Continue`` without end, held a call with ``timeout_s=1`` past 12 s). Each
    resend has its own: their number and pauses are bounded apart (``write_retries``,
    ``in_progress_resends``, ``IN_PROGRESS_MAX_PAUSE_S``), and the server's wait for a
    write still running is told as half of this bound (``_server_wait_s``), so a resend
    must have all of it. None: the client has no timeout, no deadline."""

    def __init__(self, call: Call[Any], bound_s: float | None) -> None:
        self._call = call
        self.bound_s = bound_s
        self._at = None if bound_s is None else time.monotonic() + bound_s

    def left_s(self) -> float | None:
        return None if self._at is None else self._at - time.monotonic()

    def passed(self) -> bool:
        left = self.left_s()
        return left is not None and left <= 0

    def expired(self) -> TransportError:
        """The error of a send past its deadline: the call, the bound, the key of its
        write (it may have been stored; sent again with that key, it is not twice)."""
        return _with_key(
            self._call,
            TransportError(
                f"{self._call.operation.name}: no whole answer within timeout_s="
                f"{self.bound_s:g}, the bound of each send of a call"
            ),
        )


#: The deadline of the sync call running in this thread (or task), which the network
#: layer below httpx reads at each connect, read and write (``_DeadlinedStream``).
_DEADLINE: ContextVar[_Deadline | None] = ContextVar("uprof_sdk_deadline", default=None)


def _clamped(timeout: float | None, expired: type[httpcore.TimeoutException]) -> float | None:
    """One read's (write's, connect's) timeout, no longer than what is left of the
    call's deadline; once it has passed, ``expired`` (httpcore's timeout of that step)
    without touching the socket. A read given a tiny timeout still returns what has
    already arrived: a server sending ``100 Continue`` as fast as it can always had
    something there, and held a sync call with ``timeout_s=0.5`` as long as it sent (bug
    SA, 0208's RL clamp)."""
    deadline = _DEADLINE.get()
    left = None if deadline is None else deadline.left_s()
    if deadline is None or left is None:
        return timeout
    if left <= 0:
        raise expired(f"no whole answer within timeout_s={deadline.bound_s:g}")
    return left if timeout is None else min(timeout, left)


class _DeadlinedStream(httpcore.NetworkStream):
    """A connection whose every read and write waits no longer than the call's deadline
    allows: httpcore reads an answer's headers, each ``100 Continue`` and its body with
    one fixed read timeout, and nothing above it runs between those reads."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _clamped(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _clamped(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        tls = self._stream.start_tls(
            ssl_context, server_hostname, _clamped(timeout, httpcore.ConnectTimeout)
        )
        return _DeadlinedStream(tls)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlinedNetwork(httpcore.NetworkBackend):
    """httpcore's network layer, its connections ``_DeadlinedStream``s."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(
            host, port, _clamped(timeout, httpcore.ConnectTimeout), local_address, socket_options
        )
        return _DeadlinedStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_unix_socket(
            path, _clamped(timeout, httpcore.ConnectTimeout), socket_options
        )
        return _DeadlinedStream(stream)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


#: httpx's exceptions by httpcore's, for the errors our transport lets up: the same names,
#: so a caller (and ``_within``'s timeout test) sees what httpx's own transport raises.
_HTTPX_ERRORS: dict[type[Exception], type[httpx.TransportError]] = {
    getattr(httpcore, name): getattr(httpx, name)
    for name in (
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "TimeoutException",
        "ConnectError",
        "ReadError",
        "WriteError",
        "NetworkError",
        "ProxyError",
        "UnsupportedProtocol",
        "LocalProtocolError",
        "RemoteProtocolError",
        "ProtocolError",
    )
}


@contextlib.contextmanager
def _as_httpx() -> Iterator[None]:
    """httpcore's error as httpx's of the same name: the most specific one, found along
    the error's class's ancestry."""
    try:
        yield
    except Exception as error:
        mapped = next((_HTTPX_ERRORS[c] for c in type(error).__mro__ if c in _HTTPX_ERRORS), None)
        if mapped is None:
            raise
        raise mapped(str(error)) from error


class _AnswerBytes(httpx.SyncByteStream):
    """An answer's body from httpcore, its errors httpx's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx():
            yield from self._stream

    def close(self) -> None:
        with _as_httpx():
            self._stream.close()


class DeadlinedTransport(httpx.BaseTransport):
    """The sync client's default transport: an httpcore pool, as httpx's own transport
    builds with its defaults (verified TLS, the environment's certificates, httpx's
    limits), whose network layer is ``_DeadlinedNetwork``. httpx's transport takes no
    network layer; httpcore's pool does, by a public argument, so nothing private is
    touched (an httpx or httpcore upgrade renaming a private attribute broke the
    client's creation). ``proxy``: the pool is httpcore's proxy pool for it, as
    httpx's transport builds it, on the same network layer (``environment_mounts``)."""

    def __init__(self, proxy: httpx.Proxy | None = None) -> None:
        network = _DeadlinedNetwork(httpcore.SyncBackend())
        ssl_context = httpx.create_ssl_context()
        # httpx's own defaults (``httpx.HTTPTransport``'s limits).
        limits: dict[str, Any] = {
            "max_connections": 100,
            "max_keepalive_connections": 20,
            "keepalive_expiry": 5.0,
        }
        self._pool: httpcore.ConnectionPool
        if proxy is None:
            self._pool = httpcore.ConnectionPool(
                ssl_context=ssl_context, network_backend=network, **limits
            )
            return
        url = httpcore.URL(
            scheme=proxy.url.raw_scheme,
            host=proxy.url.raw_host,
            port=proxy.url.port,
            target=proxy.url.raw_path,
        )
        if proxy.url.scheme in ("socks5", "socks5h"):
            self._pool = httpcore.SOCKSProxy(
                proxy_url=url,
                proxy_auth=proxy.raw_auth,
                ssl_context=ssl_context,
                network_backend=network,
                **limits,
            )
        else:  # http, https: httpx.Proxy refuses any other scheme
            self._pool = httpcore.HTTPProxy(
                proxy_url=url,
                proxy_auth=proxy.raw_auth,
                proxy_headers=proxy.headers.raw,
                ssl_context=ssl_context,
                proxy_ssl_context=proxy.ssl_context,
                network_backend=network,
                **limits,
            )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx():
            answer = self._pool.handle_request(core_request)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_AnswerBytes(answer.stream),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def environment_mounts() -> dict[str, httpx.BaseTransport | None]:
    """The proxies the environment names (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``,
    ``NO_PROXY``, as ``urllib.request.getproxies`` reads them), as ``httpx.Client``'s
    ``mounts``: a ``DeadlinedTransport`` through each proxy, None (the client's own
    transport, direct) for each host ``NO_PROXY`` names. httpx mounts its environment's
    proxies only when it is given no transport; given the SDK's, it mounted none, and
    every sync call went direct, past the proxy the environment names (bug SC). The
    rules are httpx's (``httpx._utils.get_environment_proxies``, private, so written
    here): a proxy without a scheme is ``http://``; ``NO_PROXY=*`` turns every proxy
    off; a name in it covers itself and every name ending in it."""
    found = urllib.request.getproxies()
    direct = [host.strip() for host in found.get("no", "").split(",")]
    if "*" in direct:
        return {}
    mounts: dict[str, httpx.BaseTransport | None] = {}
    for scheme in ("http", "https", "all"):
        if found.get(scheme):
            url = found[scheme] if "://" in found[scheme] else f"http://{found[scheme]}"
            mounts[f"{scheme}://"] = DeadlinedTransport(httpx.Proxy(url))
    mounts.update((_no_proxy_pattern(host), None) for host in direct if host)
    return mounts


def _no_proxy_pattern(host: str) -> str:
    """httpx's mount pattern for one ``NO_PROXY`` entry: an address or ``localhost``
    exactly, a name with every name ending in it."""
    if "://" in host:
        return host
    with contextlib.suppress(ValueError):
        ipaddress.IPv4Address(host.split("/")[0])
        return f"all://{host}"
    with contextlib.suppress(ValueError):
        ipaddress.IPv6Address(host.split("/")[0])
        return f"all://[{host}]"
    return f"all://{host}" if host.lower() == "localhost" else f"all://*{host}"


class _Expired(httpx.TimeoutException):
    """A send past its deadline: an httpx timeout, so a keyed write is sent again like
    after any other (``_resend_policy``), then told as ``_Deadline.expired()``."""

    def __init__(self, deadline: _Deadline) -> None:
        super().__init__(str(deadline.expired()))
        self.deadline = deadline


@contextlib.contextmanager
def _within(deadline: _Deadline) -> Iterator[None]:
    """Run one sync send under ``deadline``: the network layer reads it, and a failure
    once it has passed is ``_Expired``, whatever httpx called it."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    except httpx.HTTPError as error:
        if deadline.passed():
            raise _Expired(deadline) from error
        raise
    finally:
        _DEADLINE.reset(token)


@contextlib.contextmanager
def _within_async(deadline: _Deadline) -> Iterator[None]:
    """Run one async send under ``deadline``: cancelled when it passes (anyio, so under
    asyncio or trio), wherever it waits, then ``_Expired``."""
    try:
        with anyio.fail_after(deadline.left_s()):
            yield
    except TimeoutError as error:
        raise _Expired(deadline) from error
    except httpx.HTTPError as error:
        if deadline.passed():
            raise _Expired(deadline) from error
        raise


class SyncBackend(Protocol):
    def send(self, call: Call[R]) -> R: ...

    def send_for_bytes(self, call: Call[Any]) -> bytes: ...

    def stream_text(self, call: Call[Any]) -> Generator[str, None, None]: ...

    def close(self) -> None: ...


#: How many times an HTTP backend sends a write again after a network failure.
DEFAULT_WRITE_RETRIES = 2
#: The pause before the n-th resend is this times 2**(n-1) seconds.
RETRY_PAUSE_S = 0.1


def _keyed(call: Call[R]) -> Call[R]:
    """The call with an idempotency key, if its operation takes one and it has none.

    A write sent over a network can fail after the server committed it (the answer is
    lost): sent again, it must not be written twice. The key is made once per call, here,
    and every resend of that call carries it; it is random, so two calls never share one
    (never derived from what the caller passes, which two calls may have in common)."""
    if call.operation.keyed and call.idempotency_key is None:
        return dataclasses.replace(call, idempotency_key=f"uprof-sdk-{uuid.uuid4().hex}")
    return call


def _attempts(call: Call[Any], retries: int) -> int:
    """How many times a call may be sent: a keyed write ``1 + retries``, anything else once
    (a write without a key, an erasure, could be done twice)."""
    return 1 + max(0, retries) if call.idempotency_key is not None and call.operation.keyed else 1


def _resend_policy(attempts: int) -> RetryPolicy:
    """Sending a call ``attempts`` times in all, again only after a transport error (no
    answer), ``RETRY_PAUSE_S`` then twice as long each time (``uprof.retry``: the one
    retry policy of the project)."""
    return RetryPolicy(
        attempts=attempts,
        on=(httpx.TransportError,),
        backoff=Backoff(first_s=RETRY_PAUSE_S, max_s=RETRY_PAUSE_S * 2**8),
    )


#: How many times a keyed write answered 409 ``request_in_progress`` (its first request,
#: with the same key, still runs on the server) is sent again with that key.
DEFAULT_IN_PROGRESS_RESENDS = 3
#: The longest pause before such a resend, whatever the server's Retry-After says.
IN_PROGRESS_MAX_PAUSE_S = 30.0


class _StillRunning(Exception):
    """A keyed write was answered 409 ``request_in_progress``: the first request with
    its key still runs. Sent again after Retry-After, it gets that request's answer."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__("request_in_progress")
        self.response = response

    @property
    def retry_after_s(self) -> float | None:
        """The server's Retry-After in seconds (the server sends delta-seconds), or None."""
        try:
            return float(self.response.headers.get("Retry-After", ""))
        except ValueError:
            return None


def _unless_still_running(response: httpx.Response) -> httpx.Response:
    if response.status_code == 409:
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if code == "request_in_progress":
            raise _StillRunning(response)
    return response


def _in_progress_policy(call: Call[Any], resends: int) -> RetryPolicy:
    """Sending a keyed write again, with its key, while the server answers that its first
    request still runs: after the server's Retry-After (at most
    ``IN_PROGRESS_MAX_PAUSE_S``), ``resends`` times (bug KE: the SDK raised
    ``ConflictError`` where the resend would have replayed the first answer). A call
    without a key is never refused so, and is sent once."""
    keyed = call.idempotency_key is not None and call.operation.keyed
    return RetryPolicy(
        attempts=1 + max(0, resends) if keyed else 1,
        on=(_StillRunning,),
        backoff=Backoff(first_s=1.0, max_s=IN_PROGRESS_MAX_PAUSE_S),
        told_wait=lambda error: error.retry_after_s if isinstance(error, _StillRunning) else None,
    )


def _failed(call: Call[Any], error: BaseException) -> TransportError:
    if isinstance(error, _Expired):
        return error.deadline.expired()
    return _with_key(
        call, TransportError(f"{call.operation.name}: {type(error).__name__}: {error}")
    )


E = TypeVar("E", bound=UprofClientError)


def _with_key(call: Call[Any], error: E) -> E:
    """The error, naming the key its write was sent with: a caller whose write may have
    been stored (no answer, or an error answered to a resend) retries with that key, so
    the retry is that write, not a second one (bug JE: the key made for the call was
    lost with the call, and the caller's retry after a restart stored it twice)."""
    if call.operation.keyed:
        error.idempotency_key = call.idempotency_key
    return error


def _request_kwargs(call: Call[Any], timeout: httpx.Timeout | None = None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if call.idempotency_key is not None:
        kwargs["headers"] = {"Idempotency-Key": call.idempotency_key}
        wait = _server_wait_s(timeout)
        if wait is not None:
            kwargs["headers"]["Prefer"] = f"wait={wait}"
    if call.body is None:
        return kwargs
    # exclude_unset: the server applies its own defaults, so SDK and server never disagree.
    kwargs["json"] = call.body.model_dump(mode="json", exclude_unset=True)
    return kwargs


def _server_wait_s(timeout: httpx.Timeout | None) -> int | None:
    """How long the server may keep a keyed write waiting for its first request (still
    running) before it answers 409 ``request_in_progress``: half this client's read
    timeout, the other half for the write itself once the first is done. Sent as
    ``Prefer: wait``; the server's own wait may be up to 300 s, and a send cut by the read
    timeout never hears the 409 (bug LV). None: no read timeout, no limit to tell."""
    if timeout is None or timeout.read is None:
        return None
    return int(timeout.read // 2)


def _parse(call: Call[R], response: httpx.Response) -> R:
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if response.status_code >= 400:
        wait = retry_after_header(response.headers.get("Retry-After"))
        raise _with_key(call, error_for(response.status_code, payload, wait))
    try:
        return call.operation.response.model_validate(payload)
    except ValidationError as error:
        raise _with_key(
            call, TransportError(f"unexpected response to {call.operation.name}: {error}")
        ) from None


def _capped_for(name: str, response: httpx.Response) -> _Capped:
    """What a byte call takes of ``response``: a proof document, or an error answer."""
    if _plain(name, response) >= 400:
        return _Capped.error_of(name, response.status_code)
    return _Capped(name)


class HttpBackend:
    """Send calls to the REST API with ``Authorization: Bearer <api_key>``."""

    def __init__(
        self,
        client: httpx.Client,
        write_retries: int = DEFAULT_WRITE_RETRIES,
        in_progress_resends: int = DEFAULT_IN_PROGRESS_RESENDS,
    ) -> None:
        self._client = client
        self._retries = write_retries
        self._in_progress_resends = in_progress_resends

    def _deadline(self, call: Call[Any]) -> _Deadline:
        return _Deadline(call, self._client.timeout.read)

    def send(self, call: Call[R]) -> R:
        call = _keyed(call)
        op, kwargs = call.operation, _request_kwargs(call, self._client.timeout)
        # No answer (a transport error): the write may have been committed. Sent again
        # with its key, the server answers it once (``uprof.services.idempotency``).
        resend = _resend_policy(_attempts(call, self._retries))

        def request() -> httpx.Response:
            # Streamed, so the body is read through the bound; read inside the resend,
            # as ``request`` read it, so a connection lost mid-body is sent again too.
            # An expired send is a timeout (no answer): a keyed write is sent again.
            with (
                _within(self._deadline(call)),
                self._client.stream(op.method, op.path, **kwargs) as response,
            ):
                return _answer_whole(call, response)

        def answered() -> httpx.Response:
            response = resend.call(request, give_up=lambda error: _failed(call, error))
            return _unless_still_running(response)

        try:
            response = _in_progress_policy(call, self._in_progress_resends).call(answered)
        except _StillRunning as still:  # still running after every resend: ConflictError
            response = still.response
        except httpx.HTTPError as error:  # any other failure: not sent again
            raise _failed(call, error) from error
        return _parse(call, response)

    def send_for_bytes(self, call: Call[Any]) -> bytes:
        """The answer's body as it came (a proof document is a file, checked byte for
        byte), at most ``MAX_DOCUMENT_BYTES`` of it, an error's body too (bug OI)."""
        op = call.operation
        try:
            with (
                _within(self._deadline(call)),
                self._client.stream(op.method, op.path, **_request_kwargs(call)) as response,
            ):
                body = _capped_for(op.name, response)
                for chunk in response.iter_bytes():
                    body.add(chunk)
        except httpx.HTTPError as error:
            raise _failed(call, error) from error
        if response.status_code >= 400:
            _raise_error_answer(call, response, body.content())
        return body.content()

    def stream_text(self, call: Call[Any]) -> Generator[str, None, None]:
        """The body of an answer as text, as it arrives: an audit export, or a subject's
        export written to a file (``export_subject_to``: past ``send``'s bound).

        The deadline bounds the wait for the answer (its status and headers, an error's
        whole body); the body of an export then runs as long as it keeps coming, each
        read within ``timeout_s`` (an export of a gigabyte legitimately takes long)."""
        op = call.operation
        try:
            with contextlib.ExitStack() as answer:
                with _within(self._deadline(call)):
                    response = answer.enter_context(
                        self._client.stream(op.method, op.path, **_request_kwargs(call))
                    )
                    if _plain(op.name, response) >= 400:
                        body = _Capped.error_of(op.name, response.status_code)
                        for chunk in response.iter_bytes():
                            body.add(chunk)
                        _raise_error_answer(call, response, body.content())
                yield from response.iter_text()
        except httpx.HTTPError as error:
            raise _failed(call, error) from error

    def close(self) -> None:
        self._client.close()


class AsyncHttpBackend:
    def __init__(
        self,
        client: httpx.AsyncClient,
        write_retries: int = DEFAULT_WRITE_RETRIES,
        in_progress_resends: int = DEFAULT_IN_PROGRESS_RESENDS,
    ) -> None:
        self._client = client
        self._retries = write_retries
        self._in_progress_resends = in_progress_resends

    def _deadline(self, call: Call[Any]) -> _Deadline:
        return _Deadline(call, self._client.timeout.read)

    async def send(self, call: Call[R]) -> R:
        call = _keyed(call)  # as ``HttpBackend.send``
        op, kwargs = call.operation, _request_kwargs(call, self._client.timeout)
        resend = _resend_policy(_attempts(call, self._retries))

        async def request() -> httpx.Response:  # a coroutine function: tenacity awaits it
            with _within_async(self._deadline(call)):
                async with self._client.stream(op.method, op.path, **kwargs) as response:
                    return await _answer_whole_async(call, response)

        async def answered() -> httpx.Response:
            response = await resend.call_async(request, give_up=lambda error: _failed(call, error))
            return _unless_still_running(response)

        try:
            waiting = _in_progress_policy(call, self._in_progress_resends)
            response = await waiting.call_async(answered)
        except _StillRunning as still:
            response = still.response
        except httpx.HTTPError as error:
            raise _failed(call, error) from error
        return _parse(call, response)

    async def send_for_bytes(self, call: Call[Any]) -> bytes:
        op = call.operation  # as ``HttpBackend.send_for_bytes``
        try:
            with _within_async(self._deadline(call)):
                async with self._client.stream(
                    op.method, op.path, **_request_kwargs(call)
                ) as response:
                    body = _capped_for(op.name, response)
                    async for chunk in response.aiter_bytes():
                        body.add(chunk)
        except httpx.HTTPError as error:
            raise _failed(call, error) from error
        if response.status_code >= 400:
            _raise_error_answer(call, response, body.content())
        return body.content()

    async def stream_text(self, call: Call[Any]) -> AsyncGenerator[str, None]:
        """As ``HttpBackend.stream_text``: the deadline bounds the wait for the answer;
        no cancel scope is held across a ``yield``, so the body runs under the per-read
        timeout alone."""
        op = call.operation
        deadline = self._deadline(call)
        try:
            request = self._client.build_request(op.method, op.path, **_request_kwargs(call))
            with _within_async(deadline):
                response = await self._client.send(request, stream=True)
            try:
                if _plain(op.name, response) >= 400:
                    body = _Capped.error_of(op.name, response.status_code)
                    with _within_async(deadline):
                        async for chunk in response.aiter_bytes():
                            body.add(chunk)
                    _raise_error_answer(call, response, body.content())
                async for text in response.aiter_text():
                    yield text
            finally:
                await response.aclose()
        except httpx.HTTPError as error:
            raise _failed(call, error) from error

    async def aclose(self) -> None:
        await self._client.aclose()


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """Raise, for a failure of the kernel in this process, the SDK error an HTTP caller
    would get: the server's status table, and the database not answering as its 503
    ``store_unavailable`` with the wait (``uprof.api.errors.store_outage``). It escaped as
    the driver's own error (SQLAlchemy's ``OperationalError``, bug OK). Any other driver
    error is a fault and stays what it is."""
    # Imported here: only embedded mode needs the service layer.
    from domain.errors import UprofError
    from uprof.api.errors import (
        STORE_ERRORS,
        EdgeError,
        body_for,
        classify,
        log_store_trouble,
        retry_after_s,
        store_refusal,
    )

    try:
        yield
    except EdgeError as error:
        raise error_for(error.status, error.body().model_dump()) from error
    except UprofError as error:
        wait = retry_after_s(error)
        raise error_for(classify(error)[0], body_for(error).model_dump(), wait) from error
    except STORE_ERRORS as error:
        answer = store_refusal(error)  # damage too (0214-store-damage-in-servers, SG)
        if answer is None:
            raise
        log_store_trouble(answer)
        # Not chained: the driver's text may quote a statement's parameters.
        body = body_for(answer).model_dump()
        raise error_for(classify(answer)[0], body, retry_after_s(answer)) from None


class EmbeddedBackend:
    """Call the kernel in this process through the same ``AppScope`` the REST routes use.

    Errors go through the server's status table, so an embedded caller gets the same
    SDK exception (and code) an HTTP caller would.
    """

    def __init__(self, kernel: Uprof, app_id: str, roles: frozenset[str]) -> None:
        # Imported here: only embedded mode needs the service layer.
        from uprof.api.runtime import ServiceRuntime
        from uprof.api.scoped import AppScope

        # A kernel configured for background workers gets its worker here, for the
        # client's lifetime; otherwise the kernel does the pipeline work inline.
        self._runtime = ServiceRuntime.for_kernel(kernel)
        self._runtime.start()
        self._scope = AppScope(self._runtime, app_id, roles)

    def send(self, call: Call[R]) -> R:
        op = call.operation
        with _refusals():
            if op.name == "whoami":
                result = self._whoami()
            elif call.body is None:
                result = getattr(self._scope, op.name)()
            elif call.idempotency_key is not None:
                result = getattr(self._scope, op.name)(
                    call.body, idempotency_key=call.idempotency_key
                )
            else:
                result = getattr(self._scope, op.name)(call.body)
        return op.response.model_validate(result.model_dump())

    def send_for_bytes(self, call: Call[Any]) -> bytes:
        with _refusals():
            content: bytes = getattr(self._scope, call.operation.name)(call.body)
        return content

    def stream_text(self, call: Call[Any]) -> Generator[str, None, None]:
        if call.operation.name != "audit_export":
            # An answer the service builds whole (a subject's export): its JSON, as the
            # server would send it; no wire, so no bound to stream past.
            yield self.send(call).model_dump_json()
            return
        # The records are read as they are taken: the database may stop answering
        # midway, and that is refused like a failure before the first (bug OK).
        with _refusals():
            stream = self._scope.audit_export_stream(call.body)  # type: ignore[arg-type]
            yield from stream.records

    def _whoami(self) -> BaseModel:
        from uprof.schemas.api import WhoAmI

        return WhoAmI(app_id=self._scope.app_id, key_id="embedded", roles=sorted(self._scope.roles))

    def close(self) -> None:
        # The kernel belongs to the caller, who closes it; only our worker stops here.
        self._runtime.stop()
