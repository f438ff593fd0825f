"""The `saga` command, run as a process against a live stack, as an operator would."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import aio_pika
import asyncpg
import pytest

from saga_app.stack import Stack
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from tests.integration.helpers import (
    eventually,
    publish_start,
    ran_one_after_another,
    remove_namespace,
    saga_env,
    terminal,
)


async def saga(settings: Settings, *args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    env = saga_env(settings)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "saga_app.cli",
        *args,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def saga_json(settings: Settings, *args: str) -> Any:
    code, out, err = await saga(settings, *args, "--json")
    assert code == 0, err
    return json.loads(out)


PARAMS = ("--param", "sku=S-1", "--param", "quantity=3", "--param", "amount_cents=250",
          "--param", "customer_email=c@example.com")  # fmt: skip


async def test_start_wait_show_list_effects(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    started = await saga_json(
        settings, "start", "refund", "--order", order_id, *PARAMS, "--wait", "30"
    )
    assert started["status"] == "completed"
    assert started["order_id"] == order_id

    shown = await saga_json(settings, "show", started["saga_id"])
    assert shown["saga"] == "refund"
    assert [s["status"] for s in shown["steps"]] == ["done", "done", "done"]
    for key in ("action", "class", "status", "attempts", "result", "compensation",
                "compensation_status", "residue", "error"):  # fmt: skip
        assert key in shown["steps"][0], key
    assert shown["steps"][0]["params"] == {"sku": "S-1", "quantity": 3}

    listed = await saga_json(settings, "list", "--order", order_id)
    assert [r["saga_id"] for r in listed] == [started["saga_id"]]

    effects = await saga_json(settings, "effects", "--order", order_id)
    assert len(effects["emails"]) == 1
    assert [(c["action"], c["outcome"]) for c in effects["calls"]] == [
        ("inventory.reserve_stock", "done"), ("erp.create_credit_note", "done"),
        ("email.send_customer_email", "done"),
    ]  # fmt: skip

    code, table, _ = await saga(settings, "show", "--order", order_id)
    assert code == 0
    assert "inventory.reserve_stock" in table and "completed" in table


async def test_faults_and_resume_from_the_command_line(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    for action in ("erp.create_credit_note", "inventory.release_stock"):
        code, _, err = await saga(settings, "faults", "add", action, "--order", order_id,
                                  "--mode", "permanent")  # fmt: skip
        assert code == 0, err
    faults = await saga_json(settings, "faults", "list")
    assert {f["action"] for f in faults if f["order_id"] == order_id} == {
        "erp.create_credit_note",
        "inventory.release_stock",
    }

    stuck = await saga_json(settings, "start", "refund", "--order", order_id, *PARAMS,
                            "--wait", "30")  # fmt: skip
    assert stuck["status"] == "needs_human"
    assert "inventory.release_stock" in stuck["needs_human_reason"]

    code, out, _ = await saga(settings, "faults", "clear", "--order", order_id)
    assert code == 0 and "cleared 2" in out
    resumed = await saga_json(settings, "resume", stuck["saga_id"], "--wait", "30")
    assert resumed["status"] == "compensated"


async def test_refusals_exit_non_zero_with_the_reason(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    code, _, err = await saga(settings, "start", "refund", "--order", order_id,
                              "--param", "sku=S")  # fmt: skip
    assert code == 2
    assert "params.quantity" in err and "Field required" in err

    code, _, err = await saga(settings, "faults", "add", "erp.create_credit_note",
                              "--order", order_id, "--mode", "sometimes")  # fmt: skip
    assert code == 2
    assert "sometimes" in err

    code, _, err = await saga(settings, "resume", "no-such-saga")
    assert code == 1
    assert "no saga no-such-saga" in err


async def test_operator_finds_understands_and_replays_a_dead_letter(
    stack: Stack, settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """The dead-letters guide's session (docs/how-to/dead-letters.md): a bad deploy renamed
    the e-mail system's table, so its adapter fails on every delivery; the request is
    dead-lettered and the customer's next refund waits
    behind it until the table is back and the operator replays it."""
    await pool.execute("ALTER TABLE sim_email_messages RENAME TO sim_email_messages_gone")
    try:
        async with Bus(settings) as bus:
            first = await publish_start(bus, order_id)
            listed = await eventually(
                lambda: saga_json(settings, "dlq", "list", "--order", order_id),
                lambda rows: len(rows) == 1,
                seconds=60,
            )
            later = await publish_start(bus, order_id)
        assert (listed[0]["reason"], listed[0]["message_type"]) == (
            "delivery_limit", "action.request",
        )  # fmt: skip
        assert listed[0]["blocks_order"] is True
        blocked = await eventually(
            lambda: saga_json(settings, "list", "--status", "blocked"),
            lambda rows: any(r["order_id"] == order_id and r["parked"] == 1 for r in rows),
        )
        assert [r["state"] for r in blocked if r["order_id"] == order_id] == ["dead"]
        shown = await saga_json(settings, "dlq", "show", str(listed[0]["id"]))
        assert "sim_email_messages" in shown["error"]
        assert "the step ends failed with its effect unknown" in shown["discard_means"]
        assert [p["message_type"] for p in shown["parked_behind"]] == ["saga.start"]
        code, out, _ = await saga(settings, "show", "--order", order_id)
        assert code == 0 and "order BLOCKED by" in out
    finally:
        await pool.execute("ALTER TABLE sim_email_messages_gone RENAME TO sim_email_messages")

    # As the guide does it: the order's letters, through the CLI and the broker's routing.
    replayed = await saga_json(settings, "dlq", "replay", "--order", order_id,
                               "--note", "table restored")  # fmt: skip
    assert replayed[0]["done"] is True
    a, b = await terminal(stack, first), await terminal(stack, later)
    assert (a.status, b.status) == ("completed", "completed")
    assert ran_one_after_another(a, b)
    audit = (await saga_json(settings, "dlq", "show", str(listed[0]["id"])))["audit"]
    assert [(x["action"], x["actor"], x["note"]) for x in audit] == [
        ("replay", stack.bus.user, "table restored")
    ]
    code, _, err = await saga(settings, "dlq", "list", "--since", "soon")
    assert code == 2 and "soon" in err


async def test_garbage_is_listed_as_holding_nothing_and_discard_asks_first(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    async with Bus(settings) as bus:
        garbage = aio_pika.Message(b"{oops", message_id="m-cli-poison",
                                   headers={"x-order-id": order_id})  # fmt: skip
        await bus.publish_raw(
            bus.topology.partitions_exchange, bus.topology.partition_key(order_id), garbage
        )
    [dead] = await eventually(
        lambda: saga_json(settings, "dlq", "list", "--order", order_id),
        lambda rows: len(rows) == 1,
    )
    assert (dead["reason"], dead["blocks_order"]) == ("invalid", False)
    shown = await saga_json(settings, "dlq", "show", str(dead["id"]))
    assert shown["body"] == "{oops" and shown["body_undecodable"] is True

    code, out, err = await saga(settings, "dlq", "discard", str(dead["id"]), "--reason", "junk",
                                stdin=b"n\n")  # fmt: skip
    assert code == 1 and "nothing changes for any saga" in out and "not discarded" in err
    code, _, err = await saga(settings, "dlq", "discard", str(dead["id"]), "--reason", " ")
    assert code == 2 and "must not be blank" in err
    code, out, err = await saga(settings, "dlq", "discard", str(dead["id"]),
                                "--reason", "junk", "--yes")  # fmt: skip
    assert code == 0, err
    assert "discarded" in out


async def test_resolve_from_the_command_line(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    for action in ("erp.create_credit_note", "inventory.release_stock"):
        await saga(settings, "faults", "add", action, "--order", order_id, "--mode", "permanent")
    stuck = await saga_json(settings, "start", "refund", "--order", order_id, *PARAMS,
                            "--wait", "30")  # fmt: skip
    code, _, err = await saga(settings, "reject", stuck["saga_id"])
    assert code == 2 and "--reason" in err and "Traceback" not in err
    code, _, err = await saga(settings, "resolve", stuck["saga_id"], "--note", "")
    assert code == 2 and "must not be blank" in err
    resolved = await saga_json(settings, "resolve", stuck["saga_id"], "--note",
                               "stock released by hand")  # fmt: skip
    assert resolved["status"] == "resolved"
    # who decided is the account the command line connects as, never a flag
    assert resolved["decisions"][-1]["by"] == stack.bus.user
    code, _, err = await saga(settings, "resolve", stuck["saga_id"], "--note", "x", "--by", "kim")
    assert code == 2 and "--by" in err


async def test_watch_streams_the_lifecycle_of_an_order(settings: Settings, order_id: str) -> None:
    try:
        async with Stack(settings.with_(events="*")):  # the per-step events too
            await _watch_an_order(settings, order_id)
    finally:
        await remove_namespace(settings)


async def _watch_an_order(settings: Settings, order_id: str) -> None:
    watcher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_app.cli", "watch", "--order", order_id, "--json",
        env=saga_env(settings), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert watcher.stderr is not None and watcher.stdout is not None
    await asyncio.wait_for(watcher.stderr.readline(), 30)  # "watching ..." once subscribed
    other = await saga_json(settings, "start", "refund", "--order", f"{order_id}-x", *PARAMS)
    started = await saga_json(settings, "start", "refund", "--order", order_id, *PARAMS)
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["type"] != "saga.completed":
        line = await asyncio.wait_for(watcher.stdout.readline(), 30)
        seen.append(json.loads(line))
    watcher.terminate()
    await watcher.wait()

    assert {e["saga_id"] for e in seen} == {started["saga_id"]}  # not the other order's
    assert other["saga_id"] != started["saga_id"]
    types = [e["type"] for e in seen]
    assert types[0] == "saga.started" and types.count("step.done") == 3


async def test_in_roles_mode_the_cli_refuses_to_act_as_an_account_without_a_role(
    settings: Settings, order_id: str
) -> None:
    """Its commands would be dead-lettered as forged and never answered: it says so at once."""
    roles = settings.with_(identity="roles")
    code, _, err = await saga(roles, "start", "refund", "--order", order_id, *PARAMS)
    assert code == 1 and "may send no command here" in err and "SAGA_SECRETS_DIR" in err


async def test_start_wait_returns_at_a_gate_with_its_own_exit_code(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    checkout = ("--param", "sku=S-1", "--param", "quantity=1", "--param", "amount_cents=250",
                "--param", "card_token=tok_1", "--param", "customer_email=c@example.com",
                "--param", "address=1 Main Street")  # fmt: skip
    started = time.monotonic()
    code, out, err = await saga(
        settings, "start", "checkout_approved", "--order", order_id, *checkout, "--wait", "30"
    )

    assert code == 4, err
    assert time.monotonic() - started < 20  # it returned at the gate, not after the 30 s
    assert "waits at a gate for a decision" in err
    assert "awaiting_approval" in out


@pytest.mark.parametrize(
    ("env", "args", "said"),
    [
        ({"SAGA_AMQP_URL": "amqp://guest:secret@127.0.0.1:1/"}, ("watch",),
         "cannot reach RabbitMQ (SAGA_AMQP_URL=amqp://guest:******@127.0.0.1:1/)"),
        ({"SAGA_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/saga"}, ("list",),
         "cannot reach Postgres (SAGA_DATABASE_URL="),
        ({"SAGA_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/saga_none_here"}, ("list",),
         "run `saga migrate`, which creates it"),
        ({}, ("faults", "add", "erp.nope", "--order", "X", "--mode", "permanent"),
         "unknown action 'erp.nope'"),
        ({}, ("show",), "give a SAGA_ID, or --order ORDER_ID"),
        ({"SAGA_METRICS_BIND": "127.0.0.1:99999"}, ("run", "coordinator"),
         "SAGA_METRICS_BIND '127.0.0.1:99999': write HOST:PORT"),
        ({"SAGA_PAYMENTS_API_BIND": "nohost", "SAGA_METRICS_BIND": "off"}, ("run", "payments-api"),
         "SAGA_PAYMENTS_API_BIND 'nohost': write HOST:PORT"),
        ({}, ("start", "--order", "X"), "give a saga name, or --step actions"),
    ],
)  # fmt: skip
async def test_what_cannot_work_is_said_in_one_line_without_a_traceback(
    settings: Settings, env: dict[str, str], args: tuple[str, ...], said: str
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_app.cli", *args,
        env={**saga_env(settings), **env}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()

    assert proc.returncode not in (0, None)
    assert said in text
    assert "Traceback" not in text and "Reconnecting" not in text
    assert "secret" not in text
