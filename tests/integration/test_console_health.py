"""The console's Health page, time zones and trace links, in Chromium against the real stack:
what an operator checks when something seems stuck."""

from __future__ import annotations

import datetime as dt
import signal
from pathlib import Path

import asyncpg
import pytest
from playwright.async_api import Browser, expect
from prometheus_client import REGISTRY

from saga_app.console.settings import ConsoleSettings
from saga_app.stack import Stack
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import StartSaga
from saga_shared.transport.bus import Bus
from tests.integration.browser import shot, sign_in
from tests.integration.console_kit import accounts_file
from tests.integration.helpers import (
    REFUND,
    Processes,
    consumers_of,
    eventually,
    remove_namespace,
    terminal,
)
from tests.integration.sabotage import Sabotage
from tests.ports import free_port

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
async def watched(
    settings: Settings, tmp_path: Path
) -> tuple[Settings, ConsoleSettings, Processes]:
    """Heartbeats every 0.5 s (silent after 1.5 s), the database's gauges read as often."""
    fast = settings.with_(heartbeat_s=0.5, metrics_poll_s=0.5)
    console = ConsoleSettings(
        users=str(accounts_file(tmp_path)), bind=f"127.0.0.1:{free_port()}",
        trace_url="https://traces.example.com/trace/{trace_id}?from=console",
    )  # fmt: skip
    return fast, console, Processes(fast, tmp_path)


async def gauge(name: str, state: str) -> float | None:
    """The coordinator's ``saga_processes`` series (it runs in this process)."""
    return REGISTRY.get_sample_value("saga_processes", {"kind": "adapter", "name": name,
                                                        "state": state})  # fmt: skip


async def test_the_health_page_shows_who_is_alive_and_flags_a_frozen_adapter(
    watched: tuple[Settings, ConsoleSettings, Processes], browser: Browser, pool: asyncpg.Pool,
    order_id: str,
) -> None:  # fmt: skip
    settings, config, procs = watched
    here = ["coordinator", "inventory", "erp", "payments", "console"]
    stack = Stack(settings, here, console=config)
    await stack.start()
    try:
        assert stack.console_runner is not None
        base = stack.console_runner.address
        async with Bus(settings) as bus, SagaClient(bus, answer_within_s=20) as agent:
            email = await procs.start("email")  # the e-mail adapter in a process of its own
            queue = bus.topology.action_queue("email")
            await eventually(lambda: consumers_of(bus, queue), lambda n: n == 1)
            saga_id = await agent.start("refund", order_id=order_id, params=REFUND)
            assert (await terminal(stack, saga_id)).status == "completed"

            page = await browser.new_page(viewport={"width": 1360, "height": 900})
            await sign_in(page, base, "vic", "/health")  # reading is enough
            row = page.locator("#processes tr[data-state]", has_text="adapter email")
            await expect(row).to_have_attribute("data-state", "alive")
            for name in ("coordinator", "inventory", "erp", "payments"):
                alive = page.locator("#processes tr[data-state=alive]", has_text=f" {name}")
                await expect(alive).to_have_count(1)
            # The one coordinator holds every partition's lock, whether it delivered lately or
            # not (nothing has since the saga ended)
            coordinator = page.locator("#processes tr[data-state=alive]", has_text=" coordinator")
            every = " ".join(str(i) for i in range(settings.partitions))
            await expect(coordinator.locator("td").nth(6)).to_have_text(every)
            await expect(page.locator(f"#queues tr[data-queue='{queue}'] td").nth(3)).to_have_text(
                "1"
            )
            received = await pool.fetchval(  # a request comes through the request queue
                "SELECT (queues->>$1)::int FROM processes WHERE namespace = $2 AND name = 'email'",
                bus.topology.request_queue("email"), settings.namespace,
            )  # fmt: skip
            assert received is not None and received >= 1, "its deliveries are counted"

            email.send_signal(signal.SIGSTOP)  # frozen: alive to the kernel, silent to us
            await expect(row).to_have_attribute("data-state", "silent", timeout=15_000)
            await expect(page.locator(".flash.error")).to_contain_text("1 process(es) silent")
            await shot(page, "health")
            await eventually(lambda: gauge("email", "silent"), lambda v: v == 1.0)
            assert await gauge("email", "alive") == 0.0  # SagaComponentDown's series

            email.send_signal(signal.SIGCONT)
            await expect(row).to_have_attribute("data-state", "alive", timeout=15_000)
            email.send_signal(signal.SIGTERM)  # a clean stop says so: stopped, not silent
            await email.wait()
            await expect(row).to_have_attribute("data-state", "stopped", timeout=15_000)
            await expect(page.locator(".flash.error")).to_have_count(0)
    finally:
        await procs.stop_all()
        await stack.stop()
        await remove_namespace(settings)


async def test_times_are_shown_in_the_readers_zone_with_utc_kept(
    console_stack: tuple[Stack, str], browser: Browser, agent: SagaClient, order_id: str
) -> None:
    stack, base = console_stack
    saga_id = await agent.start("refund", order_id=order_id, params=REFUND)
    state = await terminal(stack, saga_id)
    context = await browser.new_context(timezone_id="Asia/Tokyo")
    page = await context.new_page()
    await sign_in(page, base, "vic", f"/sagas/{saga_id}")
    started = page.locator("p.meta time").first
    utc = state.created_at.strftime("%Y-%m-%d %H:%M:%S")
    await expect(started).to_have_attribute("title", f"{utc} UTC")
    tokyo = state.created_at.timestamp() + 9 * 3600
    local = dt.datetime.fromtimestamp(tokyo, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    await expect(started).to_have_text(f"{local} GMT+9")


async def test_a_dead_letter_links_to_its_trace(
    watched: tuple[Settings, ConsoleSettings, Processes], browser: Browser,
    sabotage: Sabotage, order_id: str,
) -> None:  # fmt: skip
    settings, config, _ = watched
    doomed = f"traced-{order_id}"
    sabotage.always(doomed)
    async with Stack(settings, ["all"], console=config) as stack, Bus(settings) as bus:
        command = StartSaga(saga_id=doomed, order_id=order_id, saga="refund", params=REFUND)
        parent = f"00-{TRACE}-00f067aa0ba902b7-01"
        await bus.publish(bus.topology.commands_exchange, command.type, command,
                          {"traceparent": parent})  # fmt: skip
        letters = await eventually(lambda: stack.store.blocks(order_id), lambda r: len(r) == 1)
        assert letters
        page = await browser.new_page()
        assert stack.console_runner is not None
        await sign_in(page, stack.console_runner.address, "ana", f"/dead-letters?order={order_id}")
        await page.locator("#letters tr[data-dead-letter] a").first.click()
        link = page.locator("a.trace")
        await expect(link).to_have_attribute(
            "href", f"https://traces.example.com/trace/{TRACE}?from=console"
        )
    await remove_namespace(settings)
