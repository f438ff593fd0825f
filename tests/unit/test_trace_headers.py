"""What a sender can put in a message's trace headers: a valid traceparent is followed, anything
else is ignored, and a client's tracestate never travels on with the saga's messages."""

from __future__ import annotations

import pytest
from opentelemetry import propagate, trace

from saga_shared.observability import tracing

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_valid_traceparent_is_the_parent_and_only_it_travels_on() -> None:
    context = tracing.extract({"traceparent": VALID.encode(), "tracestate": "evil=" + "x" * 200})
    assert context is not None
    span = trace.get_current_span(context)

    assert format(span.get_span_context().trace_id, "032x") == VALID[3:35]
    assert tracing.headers_of(span) == {"traceparent": VALID}


@pytest.mark.parametrize(
    "value",
    ["", "garbage", VALID.replace("-01", "-zz"), "00-" + "0" * 32 + "-b7ad6b7169203331-01",
     VALID + "-" + "x" * 500, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\x1b[2J", 12],
)  # fmt: skip
def test_anything_else_is_no_parent(value: object) -> None:
    assert tracing.extract({"traceparent": value}) is None
    assert tracing.extract(None) is None


@pytest.mark.parametrize("flags", ["01", "00"])
def test_without_a_provider_the_parent_travels_as_the_api_would_carry_it(
    monkeypatch: pytest.MonkeyPatch, flags: str
) -> None:
    monkeypatch.setattr(tracing, "recording", lambda: False)
    value = VALID[:-2] + flags
    parent = tracing.extract({"traceparent": value})

    def never() -> dict[str, str]:
        raise AssertionError("attributes are built only for a recorded span")

    with tracing.current("x", kind=tracing.SpanKind.CONSUMER, context=parent, attributes=never):
        api: dict[str, str] = {}
        propagate.inject(api)
        assert tracing.headers_of() == api == {"traceparent": value}
        child = tracing.start("y", kind=tracing.SpanKind.CONSUMER, attributes=never)
        assert tracing.headers_of(child) == {"traceparent": value}
    assert tracing.headers_of() == {}  # the block's context is gone after it


@pytest.mark.parametrize(
    "value",
    [VALID, " " + VALID, VALID + " \t", VALID[:-2] + "00", "01" + VALID[2:] + "-future-field",
     "ff" + VALID[2:], VALID + "-extra", VALID.upper(), "00-" + "0" * 32 + "-" + "1" * 16 + "-01",
     "00-" + "1" * 32 + "-" + "0" * 16 + "-01", VALID[:-1], VALID.replace("-", "_")],
)  # fmt: skip
def test_the_parent_read_is_the_one_the_api_propagator_reads(value: str) -> None:
    api = trace.get_current_span(propagate.extract({"traceparent": value})).get_span_context()
    ours = tracing.extract({"traceparent": value})
    if not api.is_valid:
        assert ours is None
        return
    assert ours is not None
    assert trace.get_current_span(ours).get_span_context() == api


def test_a_traceparent_with_a_line_break_is_no_parent() -> None:
    assert tracing.extract({"traceparent": VALID + "\n"}) is None  # the API's regex takes it


def test_recording_is_what_the_public_api_says() -> None:
    """``recording`` reads the API's module state; the public getter must agree with it."""
    installed = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert tracing.recording() is installed
