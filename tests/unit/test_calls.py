"""What the SDK stores after a call (``saga_services.calls``): nothing more when an atomic
service's system stored the outcome in the key's row with its effect (one statement fewer a
step), the outcome otherwise; on the in-memory key record and simulated systems, which
``tests/twins`` and ``tests/integration/test_simulated_contract.py`` hold to Postgres's."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from saga_services.calls import Calls, Outcome
from saga_services.errors import Permanent
from saga_services.keys import Finished, MemoryKeys
from saga_services.outcome import Done
from saga_services.registry import SYSTEMS
from saga_services.sdk import Call, Resources, Result, Service
from saga_services.simulated import Simulated
from saga_services.simulated_memory import MemorySystems
from saga_shared.config import Settings
from saga_shared.model.messages import ActionRequest
from tests.unit.factories import real_catalog

CATALOG = real_catalog()


class Counted(MemoryKeys):
    """The twin's key record, counting the SDK's stores (each a statement in Postgres)."""

    def __init__(self) -> None:
        super().__init__(lambda: datetime.now(UTC), atomic=True)
        self.finished: list[Finished] = []

    async def finish(self, owner: str, finished: Sequence[Finished]) -> None:
        self.finished.extend(finished)
        await super().finish(owner, finished)


def reserve(order_id: str, **params: object) -> ActionRequest:
    action = "inventory.reserve_stock"
    return ActionRequest.model_validate({
        "saga_id": f"s-{order_id}", "order_id": order_id, "action": action, "phase": "forward",
        "step": 0, "idempotency_key": f"s-{order_id}:{action}", "timeout_s": 5,
        "params": params or {"sku": "SKU-1", "quantity": 2},
    })  # fmt: skip


async def built_in(keys: Counted, reqs: Sequence[ActionRequest]) -> list[Outcome]:
    """The built-in inventory service on the twin, its calls of one delivery batch."""
    resources = Resources(Settings(), None, keys, memory=MemorySystems(keys=keys))
    service = SYSTEMS["inventory"]
    async with service.open(resources) as deps:
        return outcomes(await Calls(service, keys, CATALOG, "adapter-1").batch(reqs, deps))


def outcomes(results: Sequence[Outcome | Exception]) -> list[Outcome]:
    assert all(isinstance(r, Outcome) for r in results), results
    return [r for r in results if isinstance(r, Outcome)]


@pytest.mark.parametrize("size", [1, 3])
async def test_a_done_call_of_an_atomic_system_is_stored_by_the_system_alone(size: int) -> None:
    keys = Counted()
    reqs = [reserve(f"A-{i}") for i in range(size)]
    done = await built_in(keys, reqs)
    assert len(done) == size and all(isinstance(o.verdict, Done) for o in done)
    assert keys.finished == []  # no statement after the call
    for req in reqs:  # and the key's row holds the outcome, final, as sim_call wrote it
        state = await keys.settle(req.idempotency_key, "inventory", req.action, req.order_id)
        assert state.found == "done"
        assert state.result is not None and "reservation_id" in state.result


async def test_a_refusal_an_atomic_system_stored_is_still_stored_by_the_sdk() -> None:
    keys = Counted()
    [outcome] = await built_in(keys, [reserve("A-1", sku="SKU-1", quantity=-2)])
    assert isinstance(outcome.verdict, Permanent)
    assert [f.outcome for f in keys.finished] == ["failed"]


async def test_an_answer_the_system_did_not_store_is_stored_by_the_sdk() -> None:
    """An atomic service's function answering without its system (a read, a check in Python)
    leaves the claim unfinished: the SDK stores the answer, so a resend is answered from it."""
    keys = Counted()
    service: Service[Simulated] = Service("inventory", atomic=True)

    @service.action("inventory.reserve_stock")
    async def answer(call: Call[Any, Simulated]) -> Result:
        return {"reservation_id": "from-python"}

    req = reserve("A-1")
    [outcome] = outcomes(await Calls(service, keys, CATALOG, "adapter-1").batch([req], None))
    assert isinstance(outcome.verdict, Done)
    assert outcome.verdict.result == {"reservation_id": "from-python"}
    assert [f.outcome for f in keys.finished] == ["done"]
    state = await keys.settle(req.idempotency_key, "inventory", req.action, req.order_id)
    assert (state.found, state.result) == ("done", {"reservation_id": "from-python"})


@pytest.mark.parametrize("atomic", [True, False])
async def test_a_call_with_retries_stores_what_its_system_did_not(atomic: bool) -> None:
    keys = Counted()
    keys.atomic = atomic  # not atomic: a system of its own, whose row the SDK must finish
    resources = Resources(Settings(), None, keys, memory=MemorySystems(keys=keys))
    service = SYSTEMS["inventory"]
    async with service.open(resources) as deps:
        calls = Calls(service, keys, CATALOG, "adapter-1")
        outcome = await calls.alone(reserve("A-1"), deps, retry=False, landed=False)
    assert isinstance(outcome.verdict, Done)
    assert [f.outcome for f in keys.finished] == ([] if atomic else ["done"])
