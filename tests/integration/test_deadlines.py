"""Step deadlines: a request without an answer is sent again, then given up and compensated."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from saga_app.stack import Stack
from saga_coordinator.register import SagaState
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from tests.integration.helpers import REFUND, eventually, remove_namespace, terminal
from tests.integration.helpers import quick as quick_catalog


@pytest.fixture
def quick(settings: Settings, tmp_path: Path) -> Settings:
    return quick_catalog(settings, tmp_path)


@pytest.fixture
async def without_erp(quick: Settings) -> AsyncIterator[Stack]:
    """Everything but the ERP adapter: its requests get no answer."""
    running = Stack(quick, ["coordinator", "inventory", "payments", "email"])
    await running.start()
    try:
        yield running
    finally:
        await running.stop()
        await remove_namespace(quick)


async def step_of(stack: Stack, saga_id: str, index: int) -> SagaState:
    state = await stack.store.get(saga_id)
    assert state is not None
    return state


async def test_a_deadline_sends_the_request_again_and_the_late_answer_counts(
    without_erp: Stack, quick: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    async with Bus(quick) as bus, SagaClient(bus) as client:
        saga_id = await client.start("refund", order_id=order_id, params=REFUND)
        await eventually(
            lambda: step_of(without_erp, saga_id, 1), lambda s: s.steps[1].sends == 2, seconds=15
        )
        async with Stack(quick, ["erp"]):
            state = await terminal(without_erp, saga_id)

    assert state.status == "completed"
    assert state.steps[1].sends >= 2
    notes = [r["note"] for r in await without_erp.store.history(saga_id)]
    assert "step 1 forward sent again" in notes
    applied = await pool.fetchval(
        "SELECT count(*) FROM sim_effects WHERE order_id = $1 AND action = $2",
        order_id, "erp.create_credit_note",
    )  # fmt: skip
    assert applied == 1  # two sends, one key: one credit note


async def test_a_deadline_that_runs_out_fails_the_step_and_compensates_it(
    without_erp: Stack, quick: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    async with Bus(quick) as bus, SagaClient(bus) as client:
        saga_id = await client.start("refund", order_id=order_id, params=REFUND)
        gave_up = await eventually(
            lambda: step_of(without_erp, saga_id, 1),
            lambda s: s.steps[1].status == "failed",
            seconds=30,
        )
        assert gave_up.steps[1].effect_unknown is True
        assert gave_up.steps[1].sends == 3
        assert "no answer after 3 send(s)" in (gave_up.steps[1].error or "")
        assert gave_up.steps[2].status == "skipped"  # the e-mail never goes out
        # The ERP comes back: the queued sends land once, and the compensation undoes it.
        async with Stack(quick, ["erp"]):
            state = await terminal(without_erp, saga_id)

    assert state.status == "compensated"
    assert [s.compensation_status for s in state.steps] == ["compensated", "compensated", "none"]
    notes = await pool.fetch(
        "SELECT status FROM sim_erp_credit_notes WHERE order_id = $1", order_id
    )
    assert [r["status"] for r in notes] in ([], ["voided"])
    emails = await pool.fetchval(
        "SELECT count(*) FROM sim_email_messages WHERE order_id = $1", order_id
    )
    assert emails == 0
