"""An agent's plan refused by the gateway, the same plan behind an approval gate, the agent's
own approval refused by the broker, and a person's approval, each from its own account.

    SAGA_SECRETS_DIR=.secrets python gates.py A-301   # run.sh's stack, roles mode

tests/integration/test_doc_examples.py runs this file against a stack whose every part has an
account of its own, and compares what it prints with gates.out.
"""

from __future__ import annotations

import asyncio
import os
import sys

from aiormq.exceptions import ChannelAccessRefused
from pydantic import JsonValue

from saga_shared.client import CommandRejected, SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import Gate, Plan, PlanStep
from saga_shared.transport.bus import Bus

AGENT = os.environ.get("SAGA_EXAMPLE_AGENT", "saga-agent")  # broker users, as saga setup made
PERSON = os.environ.get("SAGA_EXAMPLE_PERSON", "ana")  # them (SAGA_PEOPLE names the people)
PARAMS: dict[str, JsonValue] = {"sku": "SKU-1", "quantity": 1, "customer_email": "ada@example.com"}


async def main(order_id: str) -> None:
    settings = Settings.from_env()
    async with Bus(settings, user=AGENT) as bus, SagaClient(bus) as agent:
        email_first = (PlanStep(action="email.send_confirmation"),
                       PlanStep(action="inventory.reserve_stock"))  # fmt: skip
        try:  # an e-mail before the stock is held: it could not be taken back
            await agent.start(order_id=order_id, plan=Plan(steps=email_first), params=PARAMS)
        except CommandRejected as refused:
            print("refused:", refused.reason)
        gated = (PlanStep(action="email.send_confirmation", gate=Gate(timeout_s=600)),
                 PlanStep(action="inventory.reserve_stock"))  # fmt: skip
        saga_id = await agent.start(order_id=order_id, plan=Plan(steps=gated), params=PARAMS)
        stop = await agent.wait(saga_id, seconds=30, stops=True)
        print(stop.type, "cannot be undone:", (stop.stakes or {})["cannot_be_undone"])
        try:  # an agent may not approve, not even its own saga: the broker refuses it
            await agent.approve(saga_id, order_id=order_id, note="I approve myself")
        except ChannelAccessRefused:
            print("the agent's approval: refused by the broker")
    async with Bus(settings, user=PERSON) as bus, SagaClient(bus) as person:
        await person.approve(saga_id, order_id=order_id, note="customer asked for it")
        outcome = await person.wait(saga_id, seconds=30)
        register = await person.status(saga_id, order_id=order_id)
    print(outcome.type)
    print("decided:", [(d["kind"], d["role"], d["note"]) for d in register["decisions"]])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "A-301"))
