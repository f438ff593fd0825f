"""OpenTelemetry traces: one trace per saga, carried hop to hop in AMQP headers (W3C trace
context: ``traceparent``; a client's ``tracestate`` is not taken, so what a sender can make
every later message of a saga carry is one validated 55-character header).

The agent's publish starts it; the coordinator's span for the start becomes the saga's root,
kept in its register, so that messages arriving without a context (a step's deadline, an
operator's resume, a saga that waited for its order) still join the saga's trace. Each adapter
call is a child of the coordinator span that sent its request, and the coordinator span that
handles the outcome a child of the adapter's. Spans are exported over OTLP when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the SDK reads the ``OTEL_*`` variables); otherwise
the API records nothing, but the context still travels, so a process that exports keeps the
chain whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind

TRACER = trace.get_tracer("saga")
__all__ = ["TRACER", "Span", "SpanKind", "attributes", "configure", "extract",
           "headers_of", "same_trace", "traceparent"]  # fmt: skip


def configure(service: str) -> bool:
    """Export this process's spans over OTLP when the endpoint is set; once per process."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def extract(headers: Mapping[str, object] | None) -> Context | None:
    """The context a message carries, or None."""
    value = (headers or {}).get("traceparent")
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or len(value) > 100:
        return None
    context = propagate.extract({"traceparent": value})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def headers_of(span: Span | None = None) -> dict[str, str]:
    """The headers that carry ``span`` (default: the current one) to the next hop."""
    carrier: dict[str, str] = {}
    context = trace.set_span_in_context(span) if span is not None else None
    propagate.inject(carrier, context=context)
    return carrier


def traceparent(span: Span) -> str | None:
    return headers_of(span).get("traceparent")


def same_trace(a: Context, b: Context) -> bool:
    trace_a = trace.get_current_span(a).get_span_context().trace_id
    return trace_a == trace.get_current_span(b).get_span_context().trace_id


def attributes(
    saga_id: str, order_id: str, *, action: str | None = None, kind: str | None = None,
    attempt: int | None = None,
) -> dict[str, str | int]:  # fmt: skip
    found: dict[str, str | int | None] = {
        "saga.id": saga_id, "saga.order_id": order_id, "saga.action": action,
        "saga.action_class": kind, "saga.attempt": attempt,
    }  # fmt: skip
    return {k: v for k, v in found.items() if v is not None}
