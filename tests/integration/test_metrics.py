"""What Prometheus scrapes: the counters move as sagas run, the gauges read the database, and
`saga run` serves /metrics where SAGA_METRICS_BIND says."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from saga_app.stack import Stack
from saga_coordinator.gauges import read_gauges
from saga_services.faults import add_fault
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.observability import metrics
from tests.integration.helpers import remove_namespace, saga_env
from tests.integration.test_sagas import REFUND
from tests.ports import free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def scrape_url() -> str:
    """This process's metrics, served once (the server cannot be stopped)."""
    bind = f"127.0.0.1:{free_port()}"
    assert metrics.serve(bind)
    return f"http://{bind}/metrics"


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient() as client:
        text = (await client.get(url)).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_counters_follow_the_sagas_and_gauges_the_database(
    scrape_url: str, stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    before = await scrape(scrape_url)
    ok = await client.start("refund", order_id=order_id, params=REFUND)
    await add_fault(pool, "erp.create_credit_note", f"{order_id}-2", "permanent")
    undone = await client.start("refund", order_id=f"{order_id}-2", params=REFUND)
    await add_fault(pool, "inventory.reserve_stock", f"{order_id}-3", "transient:2")
    retried = await client.start("refund", order_id=f"{order_id}-3", params=REFUND)
    for saga_id in (ok, undone, retried):
        await client.wait(saga_id, seconds=30)
    await read_gauges(pool)
    after = await scrape(scrape_url)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("saga_started_total", saga="refund") == 3
    assert grew("saga_finished_total", saga="refund", status="completed") == 2
    assert grew("saga_finished_total", saga="refund", status="compensated") == 1
    reserve = {"action": "inventory.reserve_stock", "phase": "forward", "outcome": "done"}
    assert grew("saga_step_duration_seconds_count", **reserve) == 3
    assert grew("saga_step_duration_seconds_sum", **reserve) > 0
    assert grew("saga_compensations_total", action="inventory.release_stock", outcome="done") == 1
    assert grew("saga_retries_total", action="inventory.reserve_stock") == 2
    assert grew("saga_group_commit_batch_size_count") >= 6
    assert ("saga_outbox_depth", ()) in after
    assert ("saga_people_queue", (("status", "needs_human"),)) in after


async def test_saga_run_serves_metrics_and_logs_json_lines(settings: Settings) -> None:
    port = free_port()
    env = {**saga_env(settings), "SAGA_METRICS_BIND": f"127.0.0.1:{port}",
           "SAGA_LOG_FORMAT": "json", "SAGA_LOG_LEVEL": "INFO"}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_app.cli", "run", "coordinator", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        text = ""
        async with httpx.AsyncClient() as client:
            for _ in range(200):
                try:
                    text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
                except httpx.TransportError:
                    text = ""
                if "saga_outbox_depth " in text:  # the coordinator read its gauges
                    break
                await asyncio.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = await asyncio.wait_for(proc.communicate(), 60)
        except TimeoutError:
            proc.kill()
            _, err = await proc.communicate()
            raise AssertionError(f"no exit 60 s after SIGTERM: {err.decode()[-3000:]}") from None
        finally:
            await remove_namespace(settings)  # the queues the coordinator declared

    assert "saga_outbox_depth " in text
    assert "# TYPE saga_started_total counter" in text
    assert proc.returncode == 0
    logged = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    assert any(line["message"].startswith("started coordinator") for line in logged)
    assert all({"ts", "level", "logger", "message"} <= line.keys() for line in logged)
