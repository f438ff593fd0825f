"""One trace per saga: the spans of a refund, collected in memory from the agent's publish
through the coordinator and every adapter call and back, form one trace whose parent chain
follows the messages."""

from __future__ import annotations

from collections.abc import Iterator

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from saga_app.stack import Stack
from saga_services.faults import add_fault
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from tests.integration.helpers import forget_outbox
from tests.integration.test_guarded_apply import Coordinator, start
from tests.integration.test_sagas import REFUND

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """This process's spans, kept in memory (a provider can be set once per process)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    yield _EXPORTER
    _EXPORTER.clear()
    _EXPORTER.shutdown()  # later tests' spans are dropped, not kept for the rest of the run


def of_saga(exporter: InMemorySpanExporter, saga_id: str) -> list[ReadableSpan]:
    return [
        s for s in exporter.get_finished_spans() if (s.attributes or {}).get("saga.id") == saga_id
    ]


async def test_a_refund_is_one_trace_from_the_agent_to_each_adapter_and_back(
    spans: InMemorySpanExporter, stack: Stack, client: SagaClient, order_id: str
) -> None:
    saga_id = await client.start("refund", order_id=order_id, params=REFUND)
    await client.wait(saga_id, seconds=30)
    mine = of_saga(spans, saga_id)
    by_id = {s.context.span_id: s for s in mine if s.context is not None}

    def parent(span: ReadableSpan) -> str | None:
        found = by_id.get(span.parent.span_id) if span.parent is not None else None
        return found.name if found is not None else None

    assert len({s.context.trace_id for s in mine if s.context is not None}) == 1
    chain = sorted(((s.start_time or 0), s.name, parent(s)) for s in mine)
    assert [(name, up) for _, name, up in chain] == [
        ("send saga.start", None),
        ("coordinator saga.start", "send saga.start"),
        ("adapter inventory.reserve_stock", "coordinator saga.start"),
        ("coordinator action.done", "adapter inventory.reserve_stock"),
        ("adapter erp.create_credit_note", "coordinator action.done"),
        ("coordinator action.done", "adapter erp.create_credit_note"),
        ("adapter email.send_customer_email", "coordinator action.done"),
        ("coordinator action.done", "adapter email.send_customer_email"),
    ]
    reserve = next(s for s in mine if s.name == "adapter inventory.reserve_stock")
    assert dict(reserve.attributes or {}) == {
        "saga.id": saga_id, "saga.order_id": order_id, "saga.action": "inventory.reserve_stock",
        "saga.action_class": "compensable", "saga.attempt": 1,
    }  # fmt: skip


async def test_a_compensation_joins_the_sagas_trace(
    spans: InMemorySpanExporter, stack: Stack, client: SagaClient, order_id: str
) -> None:
    await add_fault(stack.pool, "erp.create_credit_note", order_id, "permanent")
    saga_id = await client.start("refund", order_id=order_id, params=REFUND)
    await client.wait(saga_id, seconds=30)
    mine = of_saga(spans, saga_id)

    assert len({s.context.trace_id for s in mine if s.context is not None}) == 1
    names = [s.name for s in sorted(mine, key=lambda s: s.start_time or 0)]
    assert "adapter inventory.release_stock" in names
    assert names[-1] == "coordinator action.done"  # the release's outcome, handled


async def test_a_decision_taken_again_after_its_try_rolled_back_is_traced_once(
    spans: InMemorySpanExporter, pool: asyncpg.Pool, settings: Settings, order_id: str
) -> None:
    """Decided on a stale cache, refused by the guard, decided again on the database: one
    span for the one decision that committed (this try's extra span once failed CI)."""
    mine, theirs = Coordinator(pool, settings), Coordinator(pool, settings)
    try:
        _, rows, _ = await mine.handle(start(order_id, f"{order_id}-s"))
        await theirs.handle(mine.done(rows))  # another process advanced the saga meanwhile
        before = len(of_saga(spans, f"{order_id}-s"))
        note, _, path = await mine.handle(mine.done(rows))
    finally:
        await forget_outbox(settings)  # driven without a broker: what it wrote goes nowhere

    assert (note, path) == ("stale action.done for step 0", "stale")
    names = [s.name for s in of_saga(spans, f"{order_id}-s")[before:]]
    assert names == ["coordinator action.done"]
