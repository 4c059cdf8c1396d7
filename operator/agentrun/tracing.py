"""OpenTelemetry spans over OTLP, for the operator and the SDK: on only when OTEL_EXPORTER_OTLP_ENDPOINT is
set and the optional extra agentrun-k8s[otel] is installed; otherwise every call here is a no-op.

Spans go to the collector, never to the API server: tracing costs no Kubernetes request. The ids of the
Run's and the Attempts' spans are derived (agentrun.core.traces), so the operator records those spans
once it has seen them end (`record`), with their real start and end times, even for an Attempt whose Pod
died without a word; the attempt Pod's own spans (`span`) are children of its Attempt's span, which it
finds in TRACEPARENT. Exports are batched on a background thread and flushed at `shutdown`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import random
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from agentrun.core.traces import TRACEPARENT_ENV, SpanRef, parse_traceparent

# The optional extra agentrun-k8s[otel], imported where a span is made: a process without an endpoint (most
# attempt Pods) never loads it (a tenth of the worker's start-up time). find_spec loads no module of it
# but its empty namespace package.
HAVE_OPENTELEMETRY = importlib.util.find_spec("opentelemetry.sdk") is not None

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import Span
    from opentelemetry.trace import Tracer as OtelTracer

log = logging.getLogger("agentrun.tracing")
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
Attributes = Mapping[str, str | int | float | bool]


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, str | int | float | bool]:
    return {k: v for k, v in (attributes or {}).items() if isinstance(v, str | int | float | bool)}


class Tracing:
    """The process's tracer. `enabled` is False without an endpoint or without the packages."""

    def __init__(self, service_name: str, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.enabled = False
        self._provider: TracerProvider | None = None
        self._processor: BatchSpanProcessor | None = None
        self._tracer: OtelTracer | None = None
        if not env.get(ENDPOINT_ENV):
            return
        if not HAVE_OPENTELEMETRY:
            log.warning("%s is set, but OpenTelemetry is not installed: agentrun-k8s[otel]", ENDPOINT_ENV)
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
        self._provider = TracerProvider(resource=resource)
        # The exporter reads the endpoint (and headers, timeouts) from the standard OTEL_* variables.
        self._processor = BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=500)
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("agentrun")
        self.enabled = True

    # ---- spans of this process's own work ----------------------------------------------------------

    @contextlib.contextmanager
    def span(
        self, name: str, attributes: Attributes | None = None, parent: SpanRef | None = None
    ) -> Iterator[Span | None]:
        """A span around a block: a child of the current span (in this task), or of `parent`. An
        exception leaving the block marks the span as an error."""
        if self._tracer is None:
            yield None
            return
        context = _context_of(parent) if parent is not None else None
        with self._tracer.start_as_current_span(name, context=context, attributes=_clean(attributes)) as s:
            yield s

    @contextlib.contextmanager
    def continuing(self, parent: SpanRef | None) -> Iterator[None]:
        """Makes `parent` the current span of this task (and of the tasks it creates), so that the spans
        made inside are its children."""
        if self._tracer is None or parent is None:
            yield
            return
        from opentelemetry import context as otel_context  # noqa: PLC0415

        token = otel_context.attach(_context_of(parent))
        try:
            yield
        finally:
            otel_context.detach(token)

    # ---- spans with derived ids, recorded once their end was seen ----------------------------------

    def record(
        self,
        name: str,
        *,
        span: SpanRef,
        parent: SpanRef | None,
        start: float,
        end: float,
        attributes: Attributes | None = None,
        error: str | None = None,
    ) -> None:
        """Exports a finished span with the given ids and times (seconds since the epoch)."""
        if self._processor is None or self._provider is None:
            return
        from opentelemetry.sdk.trace import ReadableSpan  # noqa: PLC0415
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: PLC0415
        from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

        status = Status(StatusCode.ERROR, error) if error else Status(StatusCode.OK)
        finished = ReadableSpan(
            name,
            context=_span_context(span),
            parent=_span_context(parent) if parent is not None else None,
            resource=self._provider.resource,
            attributes=_clean(attributes),
            status=status,
            start_time=int(start * 1e9),
            end_time=int(max(end, start) * 1e9),
            instrumentation_scope=InstrumentationScope("agentrun"),
        )
        self._processor.on_end(finished)

    def random_child(self, parent: SpanRef) -> SpanRef:
        return SpanRef(parent.trace_id, f"{random.getrandbits(64) or 1:016x}", parent.sampled)

    def shutdown(self) -> None:
        """Flushes what is still batched (bounded by the exporter's timeout)."""
        if self._provider is not None:
            self._provider.shutdown()


def _span_context(ref: SpanRef) -> Any:
    from opentelemetry.trace import SpanContext, TraceFlags  # noqa: PLC0415

    flags = TraceFlags(TraceFlags.SAMPLED if ref.sampled else TraceFlags.DEFAULT)
    return SpanContext(int(ref.trace_id, 16), int(ref.span_id, 16), is_remote=True, trace_flags=flags)


def _context_of(ref: SpanRef) -> Any:
    from opentelemetry import trace as otel_trace  # noqa: PLC0415

    return otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(_span_context(ref)))


def attempt_parent(env: Mapping[str, str] | None = None) -> SpanRef | None:
    """The Attempt's span, from TRACEPARENT (set on every attempt Pod by the operator)."""
    return parse_traceparent((os.environ if env is None else env).get(TRACEPARENT_ENV))
