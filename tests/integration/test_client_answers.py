"""What an agent and the CLI are told when no answer comes, on the real RabbitMQ: with the
topology declared and no coordinator running (``Bus.declare()`` only), the command is queued and
sent again under one message id until the bound; with no broker, nothing is sent and they say
so at once. And a desk command naming an order reaches the desk."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

import aio_pika
import pytest

from saga_app.cli_support import EXIT_NOT_ANSWERED
from saga_app.stack import Stack
from saga_shared.client import BrokerUnreachable, NotAnswered, SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from saga_shared.transport.topology import partition_of
from tests.integration.helpers import REFUND, saga_env

NO_BROKER = "amqp://guest:hush-secret@127.0.0.1:1/"  # nothing listens on port 1
PARAMS = ("--param", "sku=S-1", "--param", "quantity=3", "--param", "amount_cents=250",
          "--param", "customer_email=c@example.com")  # fmt: skip


async def held(bus: Bus, queue_name: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message a queue holds now, taken off it (by a consumer: a partition is a quorum
    queue with a single active consumer, which refuses basic.get)."""
    channel = await bus.connection.channel()
    try:
        queue = await channel.declare_queue(queue_name, passive=True)
        count = queue.declaration_result.message_count or 0
        taken: list[aio_pika.abc.AbstractIncomingMessage] = []
        enough = asyncio.Event()

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            taken.append(message)
            if len(taken) >= count:
                enough.set()

        if count:
            await queue.consume(take, no_ack=True)
            await asyncio.wait_for(enough.wait(), 5)
        return taken
    finally:
        await channel.close()


async def saga(settings: Settings, *args: str, **env: str) -> tuple[int, str, str, float]:
    """``saga ARGS`` as a process: its exit code, stdout, stderr, and how long it took."""
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_app.cli", *args, env={**saga_env(settings), **env},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - began


async def test_a_start_nobody_answers_is_queued_once_under_one_message_id(
    bus: Bus, settings: Settings, order_id: str
) -> None:
    saga_id, message_id = f"s-{uuid.uuid4().hex[:10]}", f"m-{uuid.uuid4().hex[:10]}"
    async with SagaClient(bus, resend_every_s=0.5, resend_max_s=1.0) as client:
        began = time.monotonic()
        with pytest.raises(NotAnswered) as caught:
            await client.start("refund", order_id=order_id, params=REFUND, saga_id=saga_id,
                               message_id=message_id, answer_within_s=3)  # fmt: skip
        took = time.monotonic() - began
    assert took < 10
    unanswered = caught.value
    assert isinstance(unanswered, TimeoutError)  # what callers caught before
    assert (unanswered.message_id, unanswered.saga_id) == (message_id, saga_id)
    assert unanswered.queued
    # Sent at 0, 0.5, 1.25 and 2.25 s on an idle machine; a loaded one may stall the loop
    # for a second, so what is held to is that it was sent again, each copy counted.
    assert unanswered.sends >= 2
    said = str(unanswered)
    assert "queued" in said and "will be applied when the coordinator runs" in said
    assert f"same message id {message_id}" in said and f"same saga id {saga_id}" in said

    partition = bus.topology.partition_queue(partition_of(order_id, settings.partitions))
    copies = await held(bus, partition)
    assert len(copies) == unanswered.sends
    assert {c.message_id for c in copies} == {message_id}
    assert len({c.body for c in copies}) == 1  # the same body each time
    assert json.loads(copies[0].body)["saga_id"] == saga_id


async def test_no_broker_is_said_at_once_and_nothing_is_sent(settings: Settings) -> None:
    nowhere = settings.with_(amqp_url=NO_BROKER)
    began = time.monotonic()
    with pytest.raises(BrokerUnreachable) as caught:
        async with SagaClient(Bus(nowhere), answer_within_s=60) as client:
            await client.start("refund", order_id="X-1", params=REFUND)
    assert time.monotonic() - began < 30  # it did not wait out answer_within_s
    said = str(caught.value)
    assert "127.0.0.1:1" in said and "hush-secret" not in said
    assert "nothing was sent, so nothing will happen" in said
    assert caught.value.facts()["sent"] is False


async def test_cli_start_with_no_coordinator_exits_5_within_its_wait(
    bus: Bus, settings: Settings, order_id: str
) -> None:
    saga_id, message_id = f"s-{uuid.uuid4().hex[:10]}", f"m-{uuid.uuid4().hex[:10]}"
    code, out, err, took = await saga(
        settings, "start", "refund", "--order", order_id, *PARAMS, "--saga-id", saga_id,
        "--wait", "3", SAGA_MESSAGE_ID=message_id,
    )  # fmt: skip
    assert code == EXIT_NOT_ANSWERED == 5, err
    assert took < 10  # 3 s, and the process's start
    assert "Traceback" not in err
    assert "the start is queued" in err and "when the stack (the coordinator) is back" in err
    assert f"saga show {saga_id}" in err
    assert f"--saga-id {saga_id} --message-id {message_id}" in err
    assert "new saga id" not in err.lower()
    assert out == ""

    # --json: the same facts as fields; sent again with the same ids, it is the same command.
    code, out, err, took = await saga(
        settings, "start", "refund", "--order", order_id, *PARAMS, "--saga-id", saga_id,
        "--message-id", message_id, "--wait", "2", "--json",
    )  # fmt: skip
    assert code == 5, err
    facts = json.loads(out)
    assert facts["answered"] is False and facts["queued"] is True
    assert (facts["saga_id"], facts["message_id"]) == (saga_id, message_id)
    assert facts["sends"] >= 1 and facts["follow"] == f"saga show {saga_id}"
    partition = bus.topology.partition_queue(partition_of(order_id, settings.partitions))
    assert {c.message_id for c in await held(bus, partition)} == {message_id}


async def test_cli_start_with_no_broker_exits_1_naming_the_url(settings: Settings) -> None:
    nowhere = settings.with_(amqp_url=NO_BROKER)
    code, out, err, took = await saga(nowhere, "start", "refund", "--order", "X-1", *PARAMS,
                                      "--wait", "3")  # fmt: skip
    assert code == 1
    assert took < 10
    assert out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "127.0.0.1:1" in lines[0] and "hush-secret" not in err
    assert "nothing was sent" in lines[0]


async def test_cli_start_to_a_virtual_host_the_broker_refuses_says_so_in_one_line(
    settings: Settings,
) -> None:
    # aiormq said only "Expected one of ['Connection.OpenOk'], got <Connection.Close ...>".
    vhost = f"no-such-vhost-{uuid.uuid4().hex[:6]}"
    elsewhere = settings.with_(amqp_url=settings.amqp_url.rstrip("/") + f"/{vhost}")
    code, out, err, _ = await saga(elsewhere, "start", "refund", "--order", "X-2", *PARAMS)
    lines = [line for line in err.splitlines() if line.strip()]
    assert (code, out, len(lines)) == (1, "", 1), err
    assert f"refused to open virtual host {vhost!r}" in lines[0]
    assert "NOT_ALLOWED" in lines[0] and "nothing was sent" in lines[0]


async def test_dlq_replay_of_an_order_reaches_the_desk(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    code, out, err, _ = await saga(settings, "dlq", "replay", "--order", order_id)
    assert code == 0, err
    assert "no dead letters to replay" in out
    assert "PublishError" not in err and "NO_ROUTE" not in err


async def test_a_start_sent_again_after_its_saga_ended_is_told_its_outcome_at_once(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    """An agent that sends its start again, and waits, after the saga ended (its outcome event
    went out before this process was there) is told the outcome, not "no outcome"."""
    ids = ("--saga-id", f"s-{order_id}", "--message-id", f"m-{order_id}")
    first = await saga(settings, "start", "refund", "--order", order_id, *PARAMS, *ids,
                       "--wait", "30", "--json")  # fmt: skip
    assert first[0] == 0, first[2]
    assert json.loads(first[1])["status"] == "completed"

    for repeat in (ids, ids[:2]):  # the same message id, then a new one
        code, out, err, _ = await saga(
            settings, "start", "refund", "--order", order_id, *PARAMS, *repeat,
            "--wait", "20", "--json",
        )  # fmt: skip
        assert code == 0, err  # not 3, "no outcome": its event went out before this process
        assert json.loads(out)["status"] == "completed"


async def test_a_url_naming_no_user_logs_in_as_guest_and_its_commands_are_answered(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    """``SAGA_AMQP_URL=amqp://host/`` logs in as guest (aiormq's default): the CLI's commands
    carry that user, where they carried none and every one was refused as forged, unanswered,
    while `saga start` said it would run."""
    bare = settings.amqp_url.replace("guest:guest@", "", 1)
    assert "@" not in bare, "the test broker's URL is guest:guest's"
    code, out, err, _ = await saga(
        settings, "start", "refund", "--order", order_id, *PARAMS, "--wait", "30", "--json",
        SAGA_AMQP_URL=bare,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["status"] == "completed"
