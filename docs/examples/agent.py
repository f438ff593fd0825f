"""An agent's refund, end to end: start it, wait for its outcome, print the register's steps.

    pip install reversible-sagas     # the client alone
    SAGA_AMQP_URL=amqp://saga-agent:PASSWORD@127.0.0.1:5672/ python agent.py A-300

tests/packaging runs this file, from a virtualenv holding only the client, against a stack.
"""

from __future__ import annotations

import asyncio
import sys

from saga_shared.client import CommandRejected, SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus


async def main(order_id: str) -> int:
    settings = Settings.from_env()  # SAGA_AMQP_URL (the agent's broker user), SAGA_NAMESPACE...
    async with Bus(settings) as bus, SagaClient(bus) as client:
        try:
            saga_id = await client.start(
                "refund",
                order_id=order_id,
                params={
                    "sku": "SKU-1",
                    "quantity": 1,
                    "amount_cents": 4999,
                    "customer_email": "ada@example.com",
                },
            )
        except CommandRejected as refused:  # the gateway's reason, e.g. a bad parameter
            print("refused:", refused.reason)
            return 1
        outcome = await client.wait(saga_id, seconds=30)
        print(outcome.type, outcome.status)  # saga.completed completed
        register = await client.status(saga_id, order_id=order_id)
        for step in register["steps"]:
            print(f"  {step['action']}: {step['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "A-300")))
