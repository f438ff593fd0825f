"""What a sender can put in a message's trace headers: a valid traceparent is followed, anything
else is ignored, and a client's tracestate never travels on with the saga's messages."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from shared import tracing

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
