"""The Grafana dashboard's queries against a real scrape: ``saga run all`` serves /metrics, a
real Prometheus scrapes it every second, and every panel's query returns series with the
labels its legend uses. A renamed metric or label would leave a panel empty: this finds it."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import asyncpg
import httpx
import pytest

from saga_services.faults import add_fault
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from tests.integration.helpers import (
    REFUND,
    consumers_of,
    eventually,
    remove_namespace,
    saga_env,
)
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((ROOT / "deploy/grafana/saga-dashboard.json").read_text())
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
assert Path(PROMETHEUS).exists(), "no Prometheus: apt-get install prometheus"
BY = re.compile(r"\bby \(([^)]*)\)")


def queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p.get("targets", [])]


async def query(api: httpx.AsyncClient, expr: str) -> list[dict[str, Any]]:
    answer = (await api.get("/api/v1/query?" + urlencode({"query": expr}))).json()
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def three_or_more(rows: list[dict[str, Any]]) -> bool:
    return bool(rows) and min(int(r["value"][1]) for r in rows) >= 3


@pytest.mark.timeout(240)
async def test_every_panel_of_the_dashboard_finds_its_series_in_a_real_scrape(
    settings: Settings, pool: asyncpg.Pool, order_id: str, tmp_path: Path
) -> None:
    metrics, web = free_port(), free_port()
    env = {
        **saga_env(settings), "SAGA_METRICS_BIND": f"127.0.0.1:{metrics}",
        "SAGA_METRICS_POLL_S": "1", "SAGA_PAYMENTS_API_BIND": f"127.0.0.1:{free_port()}",
    }  # fmt: skip
    target = f"{{targets: ['127.0.0.1:{metrics}']}}"
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: saga, static_configs: [{target}]}}]\n"
    )
    log = (tmp_path / "saga.log").open("wb")
    stack = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_app.cli", "run", "all", env=env, stdout=log, stderr=log
    )
    prometheus = await asyncio.create_subprocess_exec(
        PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}",
        stdout=asyncio.subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"),
    )  # fmt: skip
    try:
        async with Bus(settings) as bus:
            intake, email = bus.topology.intake_queue, bus.topology.action_queue("email")
            for queue in (intake, email):  # the stack has declared and consumes
                await eventually(functools.partial(consumers_of, bus, queue), lambda n: n >= 1)
        async with Bus(settings) as bus, SagaClient(bus, answer_within_s=30) as agent:
            # a saga that completes after a retry, one whose step fails and is compensated
            await add_fault(pool, "inventory.reserve_stock", f"{order_id}-r", "transient:1")
            await add_fault(pool, "email.send_customer_email", f"{order_id}-f", "permanent")
            for suffix in ("r", "f"):
                saga_id = await agent.start("refund", order_id=f"{order_id}-{suffix}",
                                            params=REFUND)  # fmt: skip
                assert (await agent.wait(saga_id, seconds=60)).type in (
                    "saga.completed",
                    "saga.compensated",
                )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{web}") as api:
            # what the sagas did is in at least three scrapes: rates have points to work on
            scrapes = functools.partial(query, api, "count_over_time(saga_finished_total[1m])")
            await eventually(scrapes, three_or_more, seconds=60)
            empty = []
            for title, expr in queries():
                rows = await query(api, expr)
                wanted = {n.strip() for m in BY.finditer(expr) for n in m.group(1).split(",")}
                wanted.discard("le")
                if not rows or any(not wanted <= set(r["metric"]) for r in rows):
                    empty.append(f"{title}: {expr} -> {rows[:2]}")
            assert empty == [], "\n".join(empty)
    finally:
        for proc in (stack, prometheus):
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
        await remove_namespace(settings)
