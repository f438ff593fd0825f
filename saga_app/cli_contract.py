"""``saga schema export`` and ``saga watch``: the contract, and the events as they happen."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated

import click
from aio_pika.abc import AbstractIncomingMessage
from pydantic import Field, TypeAdapter

from saga_app.cli_support import cli_bus, run_async, settings_of
from saga_app.output import json_line
from saga_shared.config import Settings
from saga_shared.errors import InvalidMessage
from saga_shared.model.messages import Alert, SagaEvent
from saga_shared.model.text import clean
from saga_shared.transport.codec import decode
from saga_shared.transport.contract import export

_EVENT: TypeAdapter[SagaEvent | Alert] = TypeAdapter(
    Annotated[SagaEvent | Alert, Field(discriminator="type")]
)


@click.group()
def schema() -> None:
    """The published message contract."""


@schema.command("export")
@click.option("--out", "out_dir", default="schemas", show_default=True, type=click.Path(),
              envvar="SAGA_SCHEMA_DIR", help="Where to write [SAGA_SCHEMA_DIR]")  # fmt: skip
def schema_export(out_dir: str) -> None:
    """Write JSON Schema for every command and event, and an AsyncAPI document."""
    for path in export(Path(out_dir)):
        click.echo(f"wrote {path}")


@click.command()
@click.option("--order", "order_id", help="Only this order's events")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line")
@click.pass_context
def watch(ctx: click.Context, order_id: str | None, as_json: bool) -> None:
    """Stream lifecycle events live until Ctrl-C."""
    run_async(_watch(settings_of(ctx), order_id, as_json))


async def _watch(settings: Settings, order_id: str | None, as_json: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with cli_bus(settings) as bus:
        channel = await bus.connection.channel()
        exchange = await channel.get_exchange(bus.topology.events_exchange, ensure=True)
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(exchange, routing_key="#")

        async def show(message: AbstractIncomingMessage) -> None:
            try:
                event = decode(message.body, _EVENT, max_bytes=settings.max_message_bytes)
            except InvalidMessage as exc:
                click.echo(f"(undecodable event: {exc.reason})", err=True)
                return
            if isinstance(event, Alert):
                if order_id is None or event.order_id == order_id:
                    click.echo(_alert_line(event, as_json))
            elif order_id is None or event.order_id == order_id:
                click.echo(_line(event, as_json))

        await queue.consume(show, no_ack=True)
        click.echo(f"watching {bus.topology.events_exchange} (Ctrl-C to stop)", err=True)
        await stop.wait()


def _alert_line(alert: Alert, as_json: bool) -> str:
    if as_json:
        return json_line(alert.model_dump(mode="json", exclude_none=True))
    return clean(f"{alert.timestamp:%H:%M:%S}  {alert.type:<24} {alert.detail}", 2000)


def _line(event: SagaEvent, as_json: bool) -> str:
    if as_json:
        return json_line(event.model_dump(mode="json", exclude_none=True))
    where = f" step {event.step} {event.action}" if event.action else ""
    detail = f"  {event.detail}" if event.detail else ""
    return clean(
        f"{event.timestamp:%H:%M:%S.%f}"[:-3]
        + f"  {event.type:<24} {event.order_id}  {event.saga_id}{where}  [{event.status}]{detail}",
        4000,
    )
