"""The FastAPI app factory: routers, middleware and the one error mapping.

``create_app(kernel, api_keys)`` builds nothing else: the caller built the kernel
(``bootstrap``) and the key store. No module-level app, settings or engine exist.
When the kernel's settings ask for background workers, the app's lifespan starts
the pipeline worker and stops it at shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Route

import uprof
from domain.errors import (
    UprofError,
)
from uprof.api.errors import (
    STORE_ERRORS,
    EdgeError,
    body_for,
    classify,
    internal_body,
    log_store_trouble,
    retry_after_s,
    store_refusal,
    validation_problem,
)
from uprof.api.limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimitMiddleware
from uprof.api.metrics import Metrics, MetricsMiddleware
from uprof.api.ratelimit import RateLimitedError, limiter_for
from uprof.api.routes import (
    audit,
    captures,
    consents,
    governance,
    ops,
    policy,
    profiles,
    proposals,
    quarantine,
    slices,
    subjects,
)
from uprof.api.routes.docs import operation_id
from uprof.api.runtime import ServiceRuntime
from uprof.api.tracing import TracingMiddleware
from uprof.apikeys.store import ApiKeyStore
from uprof.kernel import Uprof
from uprof.schemas.api import ErrorBody, ErrorOut, field_problems

_log = logging.getLogger(__name__)

#: Readiness fails when extraction plus projection are further behind than this.
DEFAULT_MAX_READY_LAG = 10_000

_HTTP_CODES = {
    400: "malformed_body",  # FastAPI's answer to a body that is not UTF-8 JSON
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


#: The REST API's route modules, in the order their routes are matched.
_ROUTE_MODULES = (
    captures,
    proposals,
    slices,
    profiles,
    consents,
    subjects,
    governance,
    audit,
    policy,
    quarantine,
    ops,
)


def _served_routes(router: APIRouter) -> list[BaseRoute] | None:
    """The routes of ``router`` as an app may hold them, or None if it must include it.

    Routes declared on an ``api_router`` are already what an app serves (path, tags,
    operation ids), so the app holds them and nothing analyses them again: the API's
    routes are built once per process, at import. A router holding anything else (an
    included router, a mount) is included the ordinary way.
    """
    if router.generate_unique_id_function is not operation_id:
        return None
    if not all(type(route) in (APIRoute, Route) for route in router.routes):
        return None
    return list(router.routes)


def create_app(
    kernel: Uprof,
    api_keys: ApiKeyStore,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_ready_lag: int = DEFAULT_MAX_READY_LAG,
    rate_limit: str | None = None,
    extra_routers: Iterable[APIRouter] = (),
    page_errors: PageErrors | None = None,
) -> FastAPI:
    """Build the REST API over one kernel; apps authenticate with keys from ``api_keys``.

    ``extra_routers`` are mounted beside the REST routes, inside the same error handling
    and limits: the web pages come in this way (``uprof.server``), so the API package
    never imports the web package that builds on it. ``page_errors`` answers a refusal
    raised under those routes as a page (a browser gets HTML, not the REST error's JSON);
    it returns None for a path that is not its own.
    """
    runtime = ServiceRuntime.for_kernel(kernel)
    metrics = Metrics()
    metrics.add_collector(_LagCollector(runtime))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        try:
            yield
        finally:
            runtime.stop()

    # Swagger UI and ReDoc from assets installed with fastapi-offline: the stock pages
    # load them from a CDN, so /docs was blank on a machine without network.
    routes: list[BaseRoute] = []
    included: list[APIRouter] = []
    for router in (*(module.router for module in _ROUTE_MODULES), *extra_routers):
        served = _served_routes(router)
        if served is None:
            included.append(router)
        else:
            routes.extend(served)
    # Without the docs pages, plain FastAPI: FastAPIOffline mounts the pages' bundles
    # (Swagger UI's and ReDoc's JavaScript) on the origin whether or not it serves them.
    app = (FastAPIOffline if kernel.settings.api_docs else FastAPI)(
        routes=routes,
        title="uprof",
        version=uprof.__version__,
        summary="Governed, event-sourced profiles for multi-agent LLM systems.",
        description=(
            "Apps authenticate with an API key (`Authorization: Bearer <key>`); the app "
            "identity of every request is the key's, never a request field. Requests that "
            "concern a subject carry it in the JSON body, never in the URL."
        ),
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        docs_url="/docs" if kernel.settings.api_docs else None,
        redoc_url="/redoc" if kernel.settings.api_docs else None,
    )
    app.state.runtime = runtime
    app.state.api_keys = api_keys
    app.state.metrics = metrics
    app.state.max_ready_lag = max_ready_lag
    app.state.rate_limiter = limiter_for(kernel, rate_limit)

    for router in included:
        app.include_router(router)

    _install_error_handlers(app, page_errors)
    # Added last = outermost: the size limit refuses before anything else runs, and
    # the metrics middleware times everything inside it, errors included.
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    # Outermost: the request's span covers everything, refusals by the size limit too.
    app.add_middleware(TracingMiddleware)
    return app


def _json(error: ErrorOut, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.model_dump(mode="json"), status_code=status, headers=headers)


#: A refusal raised under a page's route, answered as a page; None: not a page's path.
PageErrors = Callable[[Request, UprofError], Response | None]


def _install_error_handlers(app: FastAPI, page_errors: PageErrors | None = None) -> None:
    """Map every failure to the one ``ErrorOut`` shape (STYLE P7: the edge maps, nothing
    else), or, under a page's route, to the page ``page_errors`` renders."""

    def refusal(request: Request, error: UprofError) -> Response:
        status, _code = classify(error)
        if status >= 500:
            _log.error("uprof error mapped to %d: %s", status, type(error).__name__)
        if page_errors is not None and (page := page_errors(request, error)) is not None:
            return page
        wait = retry_after_s(error)
        headers = None if wait is None else {"Retry-After": str(wait)}
        return _json(body_for(error), status, headers)

    @app.exception_handler(UprofError)
    async def uprof_error(request: Request, error: UprofError) -> Response:
        return refusal(request, error)

    async def store_trouble(request: Request, error: Exception) -> Response:
        # The database not answering is an outage (503, Retry-After), on every surface
        # and page, not a fault (500): review of 0176, bug NH. Stored data damaged (a
        # file replaced, a table of the wrong shape) is 500 ``stored_data_damaged`` with
        # the operator's hint, logged once, not ``internal`` and a traceback per request
        # (0214-store-damage-in-servers, bugs SG, SH).
        answer = store_refusal(error)
        if answer is None:  # any other driver error is a fault: the handler below
            raise error
        log_store_trouble(answer)
        return refusal(request, answer)

    for store_error in STORE_ERRORS:
        app.add_exception_handler(store_error, store_trouble)

    @app.exception_handler(EdgeError)
    async def edge_error(_: Request, error: EdgeError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        if isinstance(error, RateLimitedError):
            headers = {"Retry-After": str(error.retry_after_s)}
        return _json(error.body(), error.status, headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        problem = validation_problem(field_problems(list(error.errors()), request_parts=True))
        return _json(problem.body(), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(error.status_code, "http_error")
        body = ErrorOut(error=ErrorBody(code=code, message=str(error.detail)))
        return _json(body, error.status_code, dict(error.headers or {}))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        # The message may quote stored data; the log keeps the traceback, the caller
        # gets a generic answer.
        _log.exception("unhandled error", exc_info=error)
        return _json(internal_body(), 500)


class _LagCollector:
    """Pipeline gauges, read from the kernel at each scrape."""

    def __init__(self, runtime: ServiceRuntime) -> None:
        self._runtime = runtime

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("uprof_store_up", "Whether the stores answered the last scrape.")
        try:
            lag = self._runtime.kernel.lag()
        except Exception:
            up.add_metric([], 0)
            yield up
            return
        pending = GaugeMetricFamily(
            "uprof_projection_lag_events",
            "Events recorded but not yet processed, by stage.",
            labels=["stage"],
        )
        pending.add_metric(["extraction"], lag.extraction_pending)
        pending.add_metric(["projection"], lag.projection_pending)
        yield pending
        yield GaugeMetricFamily(
            "uprof_log_position",
            "Highest notification id in the event log.",
            value=lag.log_position,
        )
        yield GaugeMetricFamily(
            "uprof_quarantined_captures",
            "Captures set aside because their extraction failed on every attempt.",
            value=lag.quarantined,
        )
        up.add_metric([], 1)
        yield up
        worker = self._runtime.worker
        yield CounterMetricFamily(
            "uprof_pipeline_failures",
            "Background pipeline runs that failed.",
            value=worker.status.failures if worker else 0,
        )
        # The extraction worker's check of capture.accepted (decision 0101): a failure
        # is tried again; captures dropped unchecked are a persistent one's cost.
        late = self._runtime.kernel.extraction.late_captures
        yield CounterMetricFamily(
            "uprof_late_capture_check_failures",
            "Checks of extracted captures against the audit log that failed (retried).",
            value=late.failures if late else 0,
        )
        yield CounterMetricFamily(
            "uprof_late_captures_unchecked",
            "Extracted captures dropped unchecked against the audit log.",
            value=late.dropped if late else 0,
        )
