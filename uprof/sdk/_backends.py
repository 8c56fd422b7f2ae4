"""Where a call goes: the REST API over httpx (sync or async), or a kernel in this process.

All backends take a validated ``Call`` and return its response model, or raise the
SDK error for the failure, so the clients above them cannot tell them apart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from uprof.sdk._errors import TransportError, error_for
from uprof.sdk._operations import Call

if TYPE_CHECKING:
    from uprof.kernel import Uprof

R = TypeVar("R", bound=BaseModel)


class SyncBackend(Protocol):
    def send(self, call: Call[R]) -> R: ...

    def send_for_bytes(self, call: Call[Any]) -> bytes: ...

    def stream_text(self, call: Call[Any]) -> Iterator[str]: ...

    def close(self) -> None: ...


def _request_kwargs(call: Call[Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if call.idempotency_key is not None:
        kwargs["headers"] = {"Idempotency-Key": call.idempotency_key}
    if call.body is None:
        return kwargs
    # exclude_unset: the server applies its own defaults, so SDK and server never disagree.
    kwargs["json"] = call.body.model_dump(mode="json", exclude_unset=True)
    return kwargs


def _parse(call: Call[R], response: httpx.Response) -> R:
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if response.status_code >= 400:
        raise error_for(response.status_code, payload)
    try:
        return call.operation.response.model_validate(payload)
    except ValidationError as error:
        raise TransportError(f"unexpected response to {call.operation.name}: {error}") from None


class HttpBackend:
    """Send calls to the REST API with ``Authorization: Bearer <api_key>``."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def send(self, call: Call[R]) -> R:
        op = call.operation
        try:
            response = self._client.request(op.method, op.path, **_request_kwargs(call))
        except httpx.HTTPError as error:
            raise TransportError(f"{op.name}: {type(error).__name__}: {error}") from error
        return _parse(call, response)

    def send_for_bytes(self, call: Call[Any]) -> bytes:
        """The answer's body as it came (a proof document is a file, checked byte for byte)."""
        op = call.operation
        try:
            response = self._client.request(op.method, op.path, **_request_kwargs(call))
        except httpx.HTTPError as error:
            raise TransportError(f"{op.name}: {type(error).__name__}: {error}") from error
        if response.status_code >= 400:
            _parse(call, response)  # raises the SDK error for the status
        return response.content

    def stream_text(self, call: Call[Any]) -> Iterator[str]:
        """The body of a streamed answer (an audit export) as text, as it arrives."""
        op = call.operation
        try:
            with self._client.stream(op.method, op.path, **_request_kwargs(call)) as response:
                if response.status_code >= 400:
                    response.read()
                    _parse(call, response)  # raises the SDK error for the status
                yield from response.iter_text()
        except httpx.HTTPError as error:
            raise TransportError(f"{op.name}: {type(error).__name__}: {error}") from error

    def close(self) -> None:
        self._client.close()


class AsyncHttpBackend:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def send(self, call: Call[R]) -> R:
        op = call.operation
        try:
            response = await self._client.request(op.method, op.path, **_request_kwargs(call))
        except httpx.HTTPError as error:
            raise TransportError(f"{op.name}: {type(error).__name__}: {error}") from error
        return _parse(call, response)

    async def send_for_bytes(self, call: Call[Any]) -> bytes:
        op = call.operation
        try:
            response = await self._client.request(op.method, op.path, **_request_kwargs(call))
        except httpx.HTTPError as error:
            raise TransportError(f"{op.name}: {type(error).__name__}: {error}") from error
        if response.status_code >= 400:
            _parse(call, response)
        return response.content

    async def stream_text(self, call: Call[Any]) -> AsyncIterator[str]:
        op = call.operation
        try:
            async with self._client.stream(op.method, op.path, **_request_kwargs(call)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _parse(call, response)
                async for text in response.aiter_text():
                    yield text
        except httpx.HTTPError as error:
            raise TransportError(f"{op.name}: {type(error).__name__}: {error}") from error

    async def aclose(self) -> None:
        await self._client.aclose()


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
        from domain.errors import UprofError
        from uprof.api.errors import EdgeError, body_for, classify

        op = call.operation
        try:
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
        except EdgeError as error:
            raise error_for(error.status, error.body().model_dump()) from error
        except UprofError as error:
            raise error_for(classify(error)[0], body_for(error).model_dump()) from error
        return op.response.model_validate(result.model_dump())

    def send_for_bytes(self, call: Call[Any]) -> bytes:
        from domain.errors import UprofError
        from uprof.api.errors import EdgeError, body_for, classify

        try:
            content: bytes = getattr(self._scope, call.operation.name)(call.body)
        except EdgeError as error:
            raise error_for(error.status, error.body().model_dump()) from error
        except UprofError as error:
            raise error_for(classify(error)[0], body_for(error).model_dump()) from error
        return content

    def stream_text(self, call: Call[Any]) -> Iterator[str]:
        from domain.errors import UprofError
        from uprof.api.errors import EdgeError, body_for, classify

        try:
            stream = self._scope.audit_export_stream(call.body)  # type: ignore[arg-type]
        except EdgeError as error:
            raise error_for(error.status, error.body().model_dump()) from error
        except UprofError as error:
            raise error_for(classify(error)[0], body_for(error).model_dump()) from error
        yield from stream.records

    def _whoami(self) -> BaseModel:
        from uprof.schemas.api import WhoAmI

        return WhoAmI(app_id=self._scope.app_id, key_id="embedded", roles=sorted(self._scope.roles))

    def close(self) -> None:
        # The kernel belongs to the caller, who closes it; only our worker stops here.
        self._runtime.stop()
