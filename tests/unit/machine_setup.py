"""What the tests of ``decide`` (``test_machine_*.py``) share: the catalogs and the runs they
start from."""

from __future__ import annotations

from pydantic import JsonValue

from saga_coordinator.machine import decide
from saga_coordinator.transition import Transition
from tests.unit.factories import (
    REFUND_PARAMS,
    Driver,
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
REPLY_TO = "amq.gen-agent-replies"

# Four compensable actions, two read-only, two irreversible: enough for every ordering question.
ADHOC = make_catalog(
    actions={
        "inventory.hold": compensable(
            "inventory.unhold", result=("hold_id",), params={"sku": "str"}
        ),
        "erp.book": compensable("erp.unbook", result=("booking_id", "ledger")),
        "payments.charge": with_residue("payments.refund"),
        "inventory.tag": compensable("inventory.untag", result=("tag_id",)),
        "erp.check": read_only(),
        "erp.audit": read_only(),
        "email.notify": irreversible(),
        "email.receipt": irreversible(),
    },
    compensations={
        "inventory.unhold": {"timeout_s": 3},
        "erp.unbook": {},
        "payments.refund": {},
        "inventory.untag": {},
    },
)
FOUR = ["inventory.hold", "erp.book", "payments.charge", "inventory.tag"]


def refund(reply_to: str | None = None) -> tuple[Driver, Transition]:
    d = Driver(CATALOG)
    return d, d.feed(start_named("refund", REFUND_PARAMS, reply_to=reply_to))


def adhoc(
    steps: list[str], priority: tuple[str, ...] = (), reply_to: str | None = None
) -> tuple[Driver, Transition]:
    d = Driver(ADHOC)
    params: dict[str, JsonValue] = {"sku": "SKU-9"} if "inventory.hold" in steps else {}
    t = d.feed(start_plan(steps, params, priority=priority, reply_to=reply_to))
    assert d.state is not None, t.note
    return d, t


def reach_needs_human() -> tuple[Driver, Transition]:
    """Four steps landed, the fifth fails; undoing step 3 (the first in order) fails."""
    d, _ = adhoc([*FOUR, "erp.check"])
    d.run_forward(4)
    d.fail("address invalid")
    assert d.last_request.step == 3
    t = d.fail("tag service is down", effect_unknown=True, tries=2)
    return d, t


def waiting_refund(reply_to: str | None = None) -> tuple[Driver, Transition]:
    d = Driver(CATALOG)
    command = start_named("refund", REFUND_PARAMS, saga_id="saga-2", reply_to=reply_to)
    t = decide(None, command, CATALOG, d.now(), order_held_by="saga-1")
    d.state = t.state
    d.transitions.append(t)
    return d, t
