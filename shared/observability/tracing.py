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

Until a tracer provider is installed (by ``configure`` or by a host application), the API's
no-op spans are only the parent's context passed on; ``start`` and ``current`` then make that
context current without the API's proxies and attribute dictionaries, and ``headers_of``
writes the one ``traceparent`` header that the next hop reads. That was 5.6% of a
coordinator's CPU under load.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from types import TracebackType

from opentelemetry import context as context_api
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import Attributes

TRACER = trace.get_tracer("saga")
__all__ = ["TRACER", "Span", "SpanKind", "attributes", "configure", "current", "extract",
           "headers_of", "recording", "same_trace", "start", "traceparent"]  # fmt: skip
_installed: list[bool] = []  # one True once a provider is installed: it is never taken back
_UNKNOWN = object()


def recording() -> bool:
    """Whether spans are recorded: a tracer provider is installed in this process."""
    if _installed:
        return True
    # What set_tracer_provider sets: the public getter looks up an environment variable on
    # every call while none is set (1.5% of a coordinator's CPU when asked per message).
    installed = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if installed is _UNKNOWN:
        installed = trace.get_tracer_provider()
    if installed is not None and not isinstance(installed, trace.ProxyTracerProvider):
        _installed.append(True)
    return bool(_installed)


def start(
    name: str, *, kind: SpanKind, context: Context | None = None, start_time: int | None = None,
    attributes: Callable[[], Attributes] | None = None,
) -> Span:  # fmt: skip
    """A span, child of ``context`` (default: the current one); the caller ends it."""
    if not recording():
        return trace.get_current_span(context)  # what the API's no-op tracer returns
    return TRACER.start_span(
        name, context=context, kind=kind, start_time=start_time,
        attributes=attributes() if attributes is not None else None,
    )  # fmt: skip


def current(
    name: str, *, kind: SpanKind, context: Context | None = None,
    attributes: Callable[[], Attributes] | None = None, end_on_exit: bool = True,
) -> AbstractContextManager[Span]:  # fmt: skip
    """A span made current for the ``with`` block and ended after it (``end_on_exit``; else
    the caller ends it, or drops it unended and so unexported)."""
    if not recording():
        return _Current(trace.get_current_span(context))
    return TRACER.start_as_current_span(
        name, context=context, kind=kind, end_on_exit=end_on_exit,
        attributes=attributes() if attributes is not None else None,
    )  # fmt: skip


class _Current:
    """The parent's context made current, as the API's no-op span would be, for less."""

    __slots__ = ("_token", "span")

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        self._token = context_api.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        context_api.detach(self._token)


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
    return _parent(value)


# W3C trace context, as the API's propagator reads it (which costs 14 us a message, this 7).
_TRACEPARENT = re.compile(
    r"[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)"
)


def _parent(value: str) -> Context | None:
    found = _TRACEPARENT.fullmatch(value)
    if found is None:
        return None
    version, trace_hex, span_hex, flags, rest = found.groups()
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if version == "ff" or (version == "00" and rest) or trace_id == 0 or span_id == 0:
        return None
    span = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(int(flags, 16))
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(span))


def headers_of(span: Span | None = None) -> dict[str, str]:
    """The headers that carry ``span`` (default: the current one) to the next hop."""
    if not recording():
        found = (span if span is not None else trace.get_current_span()).get_span_context()
        if not found.is_valid:
            return {}
        ids = f"{found.trace_id:032x}-{found.span_id:016x}-{found.trace_flags:02x}"
        return {"traceparent": f"00-{ids}"}
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
