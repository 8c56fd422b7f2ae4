"""Operations: liveness, readiness and metrics (no API key: probes and scrapers have none).

None of them reveals personal data: counts, positions and route templates only.
Bind the server to loopback or put these paths behind the network boundary.
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse

from uprof.api.deps import KeyStore, Runtime
from uprof.api.metrics import CONTENT_TYPE, Metrics
from uprof.api.routes.docs import api_router
from uprof.schemas.api import Health, Readiness

router = api_router(tags=["operations"])
_log = logging.getLogger(__name__)


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
def readyz(request: Request, runtime: Runtime, store: KeyStore) -> JSONResponse:
    """Readiness: databases and the policy store answer, the worker is healthy, lag is small."""
    max_lag: int = request.app.state.max_ready_lag
    try:
        lag = runtime.kernel.lag()
        database = store.ping()
    except Exception as error:
        _log.warning("readiness check failed: %s", type(error).__name__)
        body = Readiness(
            ready=False,
            database=False,
            log_position=0,
            extraction_pending=0,
            projection_pending=0,
            worker=runtime.worker_state(),
            detail=f"database unreachable: {type(error).__name__}",
        )
        return JSONResponse(body.model_dump(mode="json"), status_code=503)
    worker = runtime.worker_state()
    detail = ""
    policy_problem = runtime.kernel.policy_health()
    if not database:
        detail = "api key store unreachable"
    elif policy_problem:
        detail = f"{policy_problem}: every policy check denies"
    elif worker in ("failing", "stopped"):
        last = runtime.worker.status.last_error if runtime.worker else ""
        detail = f"pipeline worker {worker}: {last}"
    elif not runtime.kernel.reads.healthy:
        detail = "the read recorder gave up: slices are refused until restart"
    elif lag.projection_pending + lag.extraction_pending > max_lag:
        detail = f"projections more than {max_lag} events behind"
    body = Readiness(
        ready=not detail,
        database=database,
        log_position=lag.log_position,
        extraction_pending=lag.extraction_pending,
        projection_pending=lag.projection_pending,
        quarantined=lag.quarantined,
        worker=worker,
        pipeline_unmoved_s=(
            runtime.external_progress.unmoved_s(lag) if worker == "external" else None
        ),
        detail=detail,
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if body.ready else 503)


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    """Prometheus text exposition of request counts, latencies and projection lag."""
    registry: Metrics = request.app.state.metrics
    return PlainTextResponse(registry.render(), media_type=CONTENT_TYPE)
