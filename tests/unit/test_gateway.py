"""The gateway: every plan rule refused with its name and the step, parameter checks naming the
field (catalog files: ``test_catalog_file.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from saga_shared.errors import PlanRejected
from saga_shared.model.catalog import ActionClass, Catalog
from saga_shared.model.gateway import admit, check_catalog, check_plan, validate_params
from saga_shared.transport.topology import Topology
from tests.unit.factories import (
    REFUND_PARAMS,
    compensable,
    irreversible,
    make_catalog,
    read_only,
    real_catalog,
    start_named,
    start_plan,
    with_residue,
)

CATALOG = real_catalog()

GOOD_ACTIONS: dict[str, dict[str, Any]] = {
    "inventory.hold": compensable("inventory.unhold", params={"sku": "str", "quantity": "int"}),
    "payments.charge": with_residue("payments.refund", params={"amount": "float"}),
    "erp.check": read_only(params={"address": "str", "express": "bool"}),
    "email.notify": irreversible(params={"to": "str"}),
}
GOOD_COMPENSATIONS = ["inventory.unhold", "payments.refund"]


def catalog_with(**actions: dict[str, Any]) -> Catalog:
    """The good catalog plus (or overriding) some actions, keyed with "__" for ".": the gateway
    rules are not checked when building it."""
    extra = {name.replace("__", "."): spec for name, spec in actions.items()}
    return make_catalog({**GOOD_ACTIONS, **extra}, GOOD_COMPENSATIONS)


def refusal(catalog: Catalog, steps: Sequence[str], priority: Sequence[str] = ()) -> PlanRejected:
    with pytest.raises(PlanRejected) as info:
        check_plan(catalog, steps, priority)
    return info.value


def admit_refusal(
    catalog: Catalog,
    steps: Sequence[str],
    params: Mapping[str, JsonValue],
    priority: Sequence[str] = (),
) -> PlanRejected:
    with pytest.raises(PlanRejected) as info:
        admit(catalog, start_plan(steps, params, priority=priority))
    return info.value


# --- plan rules ----------------------------------------------------------------------------------


def test_a_good_plan_passes() -> None:
    catalog = catalog_with()
    check_catalog(catalog)
    check_plan(catalog, ["erp.check", "inventory.hold", "payments.charge", "email.notify"])


def test_read_only_after_an_irreversible_action_is_allowed() -> None:
    check_plan(catalog_with(), ["inventory.hold", "email.notify", "erp.check"])


def test_irreversible_before_compensable_is_refused_at_the_irreversible_step() -> None:
    exc = refusal(catalog_with(), ["erp.check", "email.notify", "inventory.hold"])

    assert exc.rule == "irreversible_not_last"
    assert exc.step == 1
    assert "email.notify" in str(exc)
    assert "inventory.hold" in str(exc)
    assert str(exc).startswith("step 1: ")
    assert str(exc).endswith("[irreversible_not_last]")


def test_irreversible_before_a_later_compensable_is_refused_even_with_one_between() -> None:
    exc = refusal(catalog_with(), ["inventory.hold", "email.notify", "payments.charge"])

    assert (exc.rule, exc.step) == ("irreversible_not_last", 1)


def test_compensable_action_without_compensation_is_refused() -> None:
    catalog = catalog_with(inventory__grab={"class": "compensable"})

    exc = refusal(catalog, ["erp.check", "inventory.grab"])

    assert (exc.rule, exc.step) == ("compensation_missing", 1)
    assert "inventory.grab" in str(exc)


def test_residue_action_without_compensation_is_refused() -> None:
    catalog = catalog_with(payments__bill={"class": "compensable_with_residue", "residue": "x"})

    exc = refusal(catalog, ["payments.bill"])

    assert (exc.rule, exc.step) == ("compensation_missing", 0)


def test_compensation_naming_an_unknown_action_is_refused() -> None:
    catalog = catalog_with(inventory__grab=compensable("inventory.ungrab"))

    exc = refusal(catalog, ["inventory.hold", "inventory.grab"])

    assert (exc.rule, exc.step) == ("compensation_unknown", 1)
    assert "inventory.ungrab" in str(exc)


def test_compensation_served_by_another_service_is_refused() -> None:
    catalog = catalog_with(inventory__grab=compensable("payments.refund"))

    exc = refusal(catalog, ["inventory.grab"])

    assert (exc.rule, exc.step) == ("compensation_service", 0)


def test_residue_action_without_residue_text_is_refused() -> None:
    catalog = catalog_with(payments__bill=with_residue("payments.refund", residue="  "))

    exc = refusal(catalog, ["inventory.hold", "payments.bill"])

    assert (exc.rule, exc.step) == ("residue_missing", 1)
    assert "payments.bill" in str(exc)


@pytest.mark.parametrize("action_class", ["read_only", "irreversible"])
def test_an_action_that_cannot_be_undone_naming_a_compensation_is_refused(
    action_class: str,
) -> None:
    catalog = catalog_with(erp__peek={"class": action_class, "compensation": "erp.unpeek"})

    exc = refusal(catalog, ["erp.peek"])

    assert (exc.rule, exc.step) == ("compensation_unexpected", 0)


def test_a_service_of_ones_own_is_declared_by_the_catalog(tmp_path: Path) -> None:
    catalog = catalog_with(fax__send=irreversible())
    check_plan(catalog, ["inventory.hold", "fax.send"])
    path = tmp_path / "catalog.toml"
    path.write_text('[actions."fax.send"]\nclass = "irreversible"\n', encoding="utf-8")

    assert "fax" in catalog.services
    topology = Topology("t", 2, 5, catalog_file=path)
    assert topology.services == ("fax",)
    assert topology.kind_of(topology.action_queue("fax")) == ("action", "fax")


def test_unknown_action_is_refused() -> None:
    exc = refusal(catalog_with(), ["inventory.hold", "inventory.teleport"])

    assert (exc.rule, exc.step) == ("unknown_action", 1)
    assert "inventory.teleport" in str(exc)


def test_a_compensation_used_as_a_step_is_refused() -> None:
    exc = refusal(catalog_with(), ["inventory.unhold"])

    assert (exc.rule, exc.step) == ("compensation_as_step", 0)


def test_duplicate_action_is_refused_at_its_second_appearance() -> None:
    exc = refusal(catalog_with(), ["inventory.hold", "erp.check", "inventory.hold"])

    assert (exc.rule, exc.step) == ("duplicate_action", 2)
    assert "inventory.hold" in str(exc)


def test_priority_naming_an_action_not_in_the_plan_is_refused() -> None:
    exc = refusal(catalog_with(), ["inventory.hold"], priority=["payments.charge"])

    assert exc.rule == "priority_unknown"
    assert "payments.charge" in str(exc)


def test_priority_naming_an_action_of_the_plan_is_accepted() -> None:
    check_plan(catalog_with(), ["inventory.hold", "payments.charge"], ["payments.charge"])


def test_the_first_broken_rule_is_reported() -> None:
    exc = refusal(catalog_with(), ["inventory.teleport", "inventory.hold", "inventory.hold"])

    assert (exc.rule, exc.step) == ("unknown_action", 0)


# --- admit: named sagas, ad-hoc plans, parameters ------------------------------------------------


def test_admit_a_named_saga_splits_the_params_per_step_and_snapshots_the_catalog() -> None:
    plan = admit(CATALOG, start_named("refund", REFUND_PARAMS))

    assert plan.saga == "refund"
    assert [s.action for s in plan.steps] == [
        "inventory.reserve_stock",
        "erp.create_credit_note",
        "email.send_customer_email",
    ]
    assert [s.index for s in plan.steps] == [0, 1, 2]
    assert [s.params for s in plan.steps] == [
        {"sku": "SKU-1", "quantity": 2},
        {"amount_cents": 1500},
        {"customer_email": "ada@example.com"},
    ]
    assert plan.steps[0].spec == CATALOG.actions["inventory.reserve_stock"]
    assert plan.steps[2].spec.action_class is ActionClass.IRREVERSIBLE
    assert plan.compensation_priority == ()


def test_admit_an_adhoc_plan_with_priority() -> None:
    plan = admit(
        catalog_with(),
        start_plan(
            ["inventory.hold", "payments.charge"],
            {"sku": "A", "quantity": 1, "amount": 9.5},
            priority=["payments.charge"],
        ),
    )

    assert plan.saga == "adhoc"
    assert plan.compensation_priority == ("payments.charge",)
    assert [s.params for s in plan.steps] == [{"sku": "A", "quantity": 1}, {"amount": 9.5}]


def test_a_param_shared_by_two_steps_goes_to_both() -> None:
    plan = admit(
        CATALOG,
        start_plan(
            ["erp.create_credit_note", "payments.charge_card"],
            {"amount_cents": 700, "card_token": "tok"},
        ),
    )

    assert [s.params for s in plan.steps] == [
        {"amount_cents": 700},
        {"amount_cents": 700, "card_token": "tok"},
    ]


def test_unknown_saga_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(PlanRejected) as info:
        admit(CATALOG, start_named("refnud", REFUND_PARAMS))

    assert info.value.rule == "unknown_saga"
    assert "refnud" in str(info.value)
    assert "checkout, checkout_approved, refund" in str(info.value)


def test_admit_runs_the_plan_rules_on_adhoc_plans() -> None:
    exc = admit_refusal(
        CATALOG,
        ["email.send_confirmation", "inventory.reserve_stock"],
        {"customer_email": "a@b.c", "sku": "A", "quantity": 1},
    )

    assert (exc.rule, exc.step) == ("irreversible_not_last", 0)


def test_missing_params_are_refused_naming_each_field() -> None:
    with pytest.raises(PlanRejected) as info:
        admit(CATALOG, start_named("refund", {"sku": "A"}))

    exc = info.value
    assert exc.rule == "params_invalid"
    assert "params.quantity: Field required" in str(exc)
    assert "params.amount_cents: Field required" in str(exc)
    assert "params.customer_email: Field required" in str(exc)
    assert "params.sku" not in str(exc)


@pytest.mark.parametrize(
    ("field", "value"),
    [("quantity", "two"), ("quantity", 1.5), ("sku", 12), ("quantity", None), ("sku", ["A"])],
)
def test_ill_typed_params_are_refused_naming_the_field(field: str, value: JsonValue) -> None:
    with pytest.raises(PlanRejected) as info:
        admit(CATALOG, start_named("refund", {**REFUND_PARAMS, field: value}))

    assert info.value.rule == "params_invalid"
    assert f"params.{field}:" in str(info.value)


@pytest.mark.parametrize(
    ("steps", "params", "field"),
    [
        (["inventory.reserve_stock"], {"sku": "A", "quantity": True}, "quantity"),
        (["erp.create_credit_note"], {"amount_cents": False}, "amount_cents"),
    ],
    ids=["true-as-quantity", "false-as-amount"],
)
def test_a_boolean_is_not_accepted_for_an_int_param(
    steps: list[str], params: dict[str, JsonValue], field: str
) -> None:
    # JSON true is not a number: reserving "true" items must be refused, not read as 1
    with pytest.raises(PlanRejected) as info:
        validate_params(CATALOG, steps, params)

    assert f"params.{field}:" in str(info.value)


def test_unexpected_param_is_refused_naming_it() -> None:
    with pytest.raises(PlanRejected) as info:
        admit(CATALOG, start_named("refund", {**REFUND_PARAMS, "coupon": "X"}))

    assert info.value.rule == "params_invalid"
    assert "params.coupon: Extra inputs are not permitted" in str(info.value)


def test_param_for_a_step_not_in_the_plan_is_unexpected() -> None:
    with pytest.raises(PlanRejected) as info:
        validate_params(CATALOG, ["erp.create_credit_note"], {"amount_cents": 1, "sku": "A"})

    assert "params.sku" in str(info.value)


def test_bool_and_float_params_are_checked() -> None:
    catalog = catalog_with()
    assert validate_params(
        catalog, ["erp.check", "payments.charge"], {"address": "x", "express": True, "amount": 2}
    ) == ({"address": "x", "express": True}, {"amount": 2.0})
    with pytest.raises(PlanRejected, match=r"params\.express"):
        validate_params(catalog, ["erp.check"], {"address": "x", "express": "maybe"})


# --- catalog checks and loading ------------------------------------------------------------------


def test_a_gate_before_an_action_not_in_the_plan_is_refused() -> None:
    with pytest.raises(PlanRejected) as info:
        check_plan(CATALOG, ["inventory.reserve_stock"], (), {"email.send_confirmation"})

    assert info.value.rule == "gate_unknown"
    assert "email.send_confirmation" in str(info.value)


def test_a_gate_lets_an_irreversible_action_come_before_a_compensable_one() -> None:
    steps = ["email.send_confirmation", "inventory.reserve_stock"]
    with pytest.raises(PlanRejected, match="irreversible_not_last"):
        check_plan(CATALOG, steps)

    check_plan(CATALOG, steps, (), {"email.send_confirmation"})  # no error
