"""The adapter SDK's own rules: typed parameters, the check against the catalog, results, and
several calls of one delivery batch coalesced into one bulk call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from saga_services.errors import Permanent, Transient
from saga_services.registry import load_service
from saga_services.sdk import Call, Coalescer, Result, Service, Undo, batch_scope
from saga_shared.errors import ConfigError
from saga_shared.model.messages import ActionRequest
from tests.unit.factories import real_catalog

CATALOG = real_catalog()


class Reserve(BaseModel):
    sku: str
    quantity: int


def request(action: str = "inventory.reserve_stock", **params: object) -> ActionRequest:
    return ActionRequest.model_validate(
        {
            "saga_id": "s-1", "order_id": "o-1", "action": action, "phase": "forward", "step": 0,
            "idempotency_key": f"s-1:{action}", "timeout_s": 5, "attempt": 2,
            "params": params or {"sku": "A", "quantity": 2},
        }
    )  # fmt: skip


def inventory(**overrides: object) -> Service[None]:
    service: Service[None] = Service("inventory")

    @service.action("inventory.reserve_stock")
    async def reserve(call: Call[Reserve, None]) -> Result:
        return {"reservation_id": f"r-{call.params.sku}-{call.params.quantity}", "key": call.key}

    @service.compensation("inventory.release_stock")
    async def release(call: Call[Undo, None]) -> Result:
        return call.params.target("reservation_id")

    return service


async def test_a_function_gets_typed_parameters_and_the_request_identity() -> None:
    seen: list[Call[Reserve, None]] = []
    service: Service[None] = Service("inventory")

    @service.action("inventory.reserve_stock")
    async def reserve(call: Call[Reserve, None]) -> Result:
        seen.append(call)
        return {"reservation_id": "r-1"}

    assert await service.call(request(), None, attempt=3) == {"reservation_id": "r-1"}
    [call] = seen
    assert call.params == Reserve(sku="A", quantity=2)
    assert (call.key, call.saga_id, call.order_id, call.attempt, call.send) == (
        "s-1:inventory.reserve_stock", "s-1", "o-1", 3, 2
    )  # fmt: skip
    assert 4 < call.remaining_s <= 5


@pytest.mark.parametrize(
    ("params", "named"),
    [({"sku": "A", "quantity": True}, "quantity"), ({"sku": "A", "quantity": "2"}, "quantity"),
     ({"sku": "A"}, "quantity")],
)  # fmt: skip
async def test_parameters_that_do_not_fit_the_model_fail_permanently(
    params: dict[str, Any], named: str
) -> None:
    with pytest.raises(Permanent, match=f"invalid parameters: {named}") as failed:
        await inventory().call(request(**params), None)
    assert failed.value.may_have_landed is False


async def test_a_result_that_is_not_a_dict_may_have_landed() -> None:
    service: Service[None] = Service("inventory")

    @service.action("inventory.reserve_stock")
    async def reserve(call: Call[Reserve, None]) -> Result:
        return "r-1"  # type: ignore[return-value]

    with pytest.raises(Permanent, match="returned str") as failed:
        await service.call(request(), None)
    assert failed.value.may_have_landed is True


async def test_a_model_result_is_sent_as_its_fields() -> None:
    class Reserved(BaseModel):
        reservation_id: str

    service: Service[None] = Service("inventory")

    @service.action("inventory.reserve_stock")
    async def reserve(call: Call[Reserve, None]) -> Reserved:
        return Reserved(reservation_id="r-9")

    assert await service.call(request(), None) == {"reservation_id": "r-9"}


def test_the_service_and_the_catalog_must_agree() -> None:
    inventory().check(CATALOG)  # both inventory entries served: fine
    partial: Service[None] = Service("inventory")

    @partial.action("inventory.reserve_stock")
    async def reserve(call: Call[dict[str, object], None]) -> Result:
        return {}

    @partial.action("inventory.release_stock")
    async def release(call: Call[dict[str, object], None]) -> Result:
        return {}

    @partial.action("inventory.teleport")
    async def teleport(call: Call[dict[str, object], None]) -> Result:
        return {}

    with pytest.raises(ConfigError) as refused:
        partial.check(CATALOG)
    text = str(refused.value)
    assert (
        "inventory.release_stock is a compensation in the catalog, registered as a action" in text
    )
    assert "inventory.teleport is not in the catalog" in text


def test_a_parameter_model_must_have_the_catalogs_parameters() -> None:
    class Wrong(BaseModel):
        sku: int
        colour: str

    async def reserve(call: Call[Wrong, None]) -> Result:
        return {}

    service: Service[None] = Service("inventory")
    with pytest.raises(ConfigError, match="define the model at module level, or pass params="):
        service.action("inventory.reserve_stock")(reserve)  # Wrong is local: not resolvable
    service.action("inventory.reserve_stock", params=Wrong)(reserve)
    with pytest.raises(ConfigError) as refused:
        service.check(CATALOG)
    text = str(refused.value)
    assert "parameter 'quantity' is not in Wrong" in text
    assert "Wrong.colour is required but not a catalog parameter" in text
    assert "'sku' is str in the catalog, int in Wrong" in text


def test_a_service_serves_only_its_own_actions_once() -> None:
    service = inventory()
    with pytest.raises(ConfigError, match="serves only inventory"):
        service.action("erp.create_credit_note")
    with pytest.raises(ConfigError, match="registered twice"):
        service.action("inventory.reserve_stock")


def test_undo_names_the_id_or_the_forward_key() -> None:
    given = Undo(forward_key="k", reservation_id="r-1")
    assert given.target("reservation_id") == {"reservation_id": "r-1"}
    assert Undo(forward_key="k").target("reservation_id") == {"forward_key": "k"}
    with pytest.raises(Permanent, match="give 'reservation_id' or 'forward_key'"):
        Undo().target("reservation_id")


def test_services_load_by_name_or_reference_with_clear_errors() -> None:
    assert load_service("inventory").name == "inventory"
    assert load_service("payments-http").name == "payments"
    for ref, error in [
        ("warehouse", "unknown service 'warehouse'"),
        ("no_such_module:SERVICE", "cannot load the service"),
        ("saga_services.sdk:Call", "not a saga_services.sdk.Service"),
    ]:
        with pytest.raises(ConfigError, match=error):
            load_service(ref)


async def test_calls_of_one_batch_reach_the_bulk_call_together() -> None:
    lists: list[list[int]] = []

    async def run_many(items: list[int]) -> list[int | Exception]:
        lists.append(items)
        return [i * 10 if i != 3 else Transient("three") for i in items]

    bulk: Coalescer[int, int] = Coalescer(run_many)
    alone = await bulk.submit(1)
    async with batch_scope():
        calls = (bulk.submit(i) for i in (2, 3, 4))
        together = await asyncio.gather(*calls, return_exceptions=True)

    assert alone == 10
    assert together[0] == 20 and together[2] == 40
    assert isinstance(together[1], Transient)
    assert lists == [[1], [2, 3, 4]]


async def test_a_bulk_call_answering_the_wrong_count_is_transient_in_a_batch_or_alone() -> None:
    async def run_many(items: list[int]) -> list[int | Exception]:
        return [*items, 99]  # one answer too many: whose is which is unknown

    bulk: Coalescer[int, int] = Coalescer(run_many)
    with pytest.raises(Transient, match="a bulk call of 1 answered 2 times"):
        await bulk.submit(1)
    async with batch_scope():
        results = await asyncio.gather(bulk.submit(1), bulk.submit(2), return_exceptions=True)
    assert [str(r) for r in results] == ["a bulk call of 2 answered 3 times"] * 2


async def test_a_bulk_call_that_raises_fails_every_call_in_it() -> None:
    async def run_many(items: list[int]) -> list[int | Exception]:
        raise ConnectionResetError("gone")

    bulk: Coalescer[int, int] = Coalescer(run_many)
    async with batch_scope():
        results = await asyncio.gather(bulk.submit(1), bulk.submit(2), return_exceptions=True)

    assert [type(r) for r in results] == [ConnectionResetError, ConnectionResetError]
