"""Tracing: OpenTelemetry spans when an exporter is configured, nothing at all otherwise.

Off (the default, ``UPROF_OTEL_EXPORTER=none``) ``span()`` returns one shared object whose
``__enter__``/``__exit__`` do nothing, and this module never imports opentelemetry: a
CLI command pays a global lookup per span, not an import (decision 0035-observability).
On, spans go to a tracer provider of uprof's own (``console``: stderr, ``otlp``: an OTLP/HTTP
collector, an optional extra), or to one a program hands to ``trace_with`` (tests pass
the SDK's in-memory exporter this way).

What a span may carry is closed: attribute names come from ``ATTRIBUTES`` (counts, sizes,
durations, outcomes, categories, purposes, partitions); free-text values only for the
few names in ``CATEGORICAL``, and short. No span ever carries captured text, a subject
reference, a session id, a source ref or any other identifier a caller sent (decision
0013 seals those in the views; a trace would leak them past the seal). Exceptions are
recorded by class name only: an exception's message may quote data.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from domain.errors import UprofError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Link, Tracer

    from uprof.settings import Settings

#: Attribute names a span may carry, as keyword arguments of ``span``/``Span.set``;
#: exported as ``uprof.<name>``. Each is a number, a flag or (``CATEGORICAL``) a label.
ATTRIBUTES = frozenset(
    {
        "attributes",  # profile attributes considered (a count)
        "budget_tokens",
        "candidates",  # items that reached ranking (a count)
        "captures",
        "category",
        "error",  # the exception's class name, set by the span itself
        "events",
        "fresh",
        "groups",
        "intents",
        "interactions",
        "items",
        "lexical_only",
        "memories",
        "n_tokens",
        "notifications",
        "outcome",
        "partition",
        "proposals",
        "purpose",
        "reason",
        "refused",
        "replayed",
        "requests",
        "scope",
        "stage",
        "subjects",
        "waited_ms",
        "withheld",
    }
)
#: The attributes that may hold a string: labels from a closed or operator-defined set
#: (a purpose or category is policy vocabulary, checked as a token at the edge).
CATEGORICAL = frozenset({"category", "error", "outcome", "purpose", "reason", "scope", "stage"})
#: Longest label kept; a longer one is refused (a label is a word, not a sentence).
MAX_LABEL_CHARS = 64
EXPORTERS = ("none", "console", "otlp")

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_configure_lock = threading.Lock()


class TelemetryError(ValueError):
    """A span was given an attribute outside the allowed set (a programming error)."""


class TracingSetupError(UprofError):
    """The configured exporter cannot be built (its package is not installed)."""

    hint = "install the extra the message names, or set UPROF_OTEL_EXPORTER=none"


def checked(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes under their exported names, or TelemetryError naming the bad one."""
    out: dict[str, Any] = {}
    for name, value in attributes.items():
        if name not in ATTRIBUTES:
            raise TelemetryError(f"span attribute {name!r} is not in telemetry.ATTRIBUTES")
        if isinstance(value, str):
            if name not in CATEGORICAL:
                raise TelemetryError(f"span attribute {name!r} takes a number or a flag")
            if len(value) > MAX_LABEL_CHARS:
                raise TelemetryError(f"span attribute {name!r} is longer than a label")
        elif not isinstance(value, bool | int | float):
            raise TelemetryError(f"span attribute {name!r} must be a number, flag or label")
        out[f"uprof.{name}"] = value
    return out


class _NoSpan:
    """What ``span`` returns while tracing is off: one shared object that does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, **attributes: Any) -> None:
        return None

    def link(self) -> None:
        return None


NO_SPAN = _NoSpan()


class Span:
    """An open span (tracing on): ``set`` adds attributes; an exception marks it failed."""

    __slots__ = ("_cm", "_links", "_name", "_parent", "_span", "_start", "_tracer")

    def __init__(
        self,
        tracer: Tracer,
        name: str,
        attributes: dict[str, Any],
        links: list[Link],
        parent: Any = None,
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._start = attributes
        self._links = links
        self._parent = parent
        self._cm: Any = None
        self._span: Any = None

    def __enter__(self) -> Span:
        # Status and exception events are set below from the class name alone: the SDK's
        # own would copy the exception's message into the span.
        self._cm = self._tracer.start_as_current_span(
            self._name,
            context=self._parent,
            attributes=self._start,
            links=self._links,
            record_exception=False,
            set_status_on_exception=False,
        )
        self._span = self._cm.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        if exc_type is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_attribute("uprof.outcome", "error")
            self._span.set_attribute("uprof.error", exc_type.__name__)
            self._span.set_status(Status(StatusCode.ERROR, exc_type.__name__))
        self._cm.__exit__(exc_type, exc, tb)

    def set(self, **attributes: Any) -> None:
        self._span.set_attributes(checked(attributes))

    def set_http(self, *, method: str, route: str, status: int) -> None:
        """The server span's standard HTTP attributes: the route *template*, never the path."""
        self._span.set_attributes(
            {
                "http.request.method": method,
                "http.route": route,
                "http.response.status_code": status,
            }
        )

    def rename(self, name: str) -> None:
        self._span.update_name(name)

    def link(self) -> Link:
        """A link to this span, for work it hands to another thread (the capture writer)."""
        from opentelemetry.trace import Link

        return Link(self._span.get_span_context())


#: What ``span`` returns: a real span, or the shared do-nothing one.
SpanLike = Span | _NoSpan


def enabled() -> bool:
    return _tracer is not None


def span(name: str, *, links: list[Any] | None = None, **attributes: Any) -> SpanLike:
    """A span named ``name`` (``uprof.<area>.<step>``), child of the current one.

    ``links``: spans this one works for without being their child (from ``Span.link``;
    ``None`` entries, from spans opened while tracing was off, are skipped).
    """
    tracer = _tracer
    if tracer is None:
        return NO_SPAN
    return Span(tracer, name, checked(attributes), [x for x in links or () if x is not None])


def server_span(name: str, headers: Mapping[str, str]) -> SpanLike:
    """The span of one HTTP request, continuing the caller's trace (W3C ``traceparent``)."""
    tracer = _tracer
    if tracer is None:
        return NO_SPAN
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {k: v for k, v in headers.items() if k in ("traceparent", "tracestate")}
    parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
    return Span(tracer, name, {}, [], parent=parent)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the current span, for log lines; None when off."""
    if _tracer is None:
        return None
    from opentelemetry.trace import get_current_span

    context = get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def trace_with(provider: TracerProvider | None) -> None:
    """Send uprof's spans to ``provider`` (None: tracing off). For embedding programs and
    tests; ``configure`` does it from the settings."""
    global _tracer, _provider
    with _configure_lock:
        _provider = provider
        _tracer = None if provider is None else provider.get_tracer("uprof")


def configure(settings: Settings) -> None:
    """Turn tracing on as the settings ask (bootstrap calls this); ``none`` changes nothing.

    A process has one exporter: the first configuration that asks for one installs it,
    later ones (another kernel in the same process) keep it.
    """
    if settings.otel_exporter == "none" or _tracer is not None:
        return
    from importlib.metadata import version

    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise TracingSetupError(
            f"UPROF_OTEL_EXPORTER={settings.otel_exporter} needs the OpenTelemetry SDK: "
            "pip install 'uprof[otel]'"
        ) from None
    exporter: Any
    if settings.otel_exporter == "console":
        # stderr: several commands print results on stdout that scripts read.
        exporter = ConsoleSpanExporter(out=sys.stderr)
    else:
        exporter = _otlp_exporter(settings.otel_endpoint)
    provider = TracerProvider(
        resource=Resource.create({"service.name": "uprof", "service.version": version("uprof")})
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace_with(provider)


def _otlp_exporter(endpoint: str | None) -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TracingSetupError(
            "UPROF_OTEL_EXPORTER=otlp needs the OTLP exporter: pip install 'uprof[otlp]'"
        ) from None
    if endpoint is None:
        return OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else localhost:4318
    # Given like OTEL_EXPORTER_OTLP_ENDPOINT: the collector's base URL.
    url = endpoint.rstrip("/")
    return OTLPSpanExporter(endpoint=url if url.endswith("/v1/traces") else url + "/v1/traces")


def flush(timeout_ms: int = 5_000) -> None:
    """Export what is buffered (a short-lived command calls this before it exits)."""
    provider = _provider
    if provider is not None:
        provider.force_flush(timeout_ms)


@contextmanager
def tracing_to(provider: TracerProvider) -> Iterator[None]:
    """Trace into ``provider`` for the duration of a block (tests, benchmarks)."""
    previous = _provider
    trace_with(provider)
    try:
        yield
    finally:
        trace_with(previous)
