"""The register as an operator reads it (``saga show``): statuses, identifiers, errors, residue,
what never happened, and who decided what."""

from __future__ import annotations

import re

from saga_coordinator.report import render_register, table
from tests.unit.factories import (
    CHECKOUT_PARAMS,
    REFUND_PARAMS,
    Driver,
    irreversible,
    make_catalog,
    read_only,
    real_catalog,
    start_named,
    start_plan,
    with_residue,
)

CATALOG = real_catalog()
RESIDUE = CATALOG.actions["payments.charge_card"].residue


def checkout() -> Driver:
    d = Driver(CATALOG)
    d.feed(start_named("checkout", CHECKOUT_PARAMS, saga_id="saga-42", order_id="order-7"))
    return d


def row_of(text: str, action: str) -> list[str]:
    """The table row of a step, split into its cells (cells hold no double spaces)."""
    line = next(line for line in text.splitlines() if f"  {action}  " in line)
    return re.split(r"\s{2,}", line.strip())


def section(text: str, title: str) -> list[str]:
    """The indented lines under ``title:``."""
    lines = text.splitlines()
    start = lines.index(f"{title}:")
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        body.append(line.strip())
    return body


def test_completed_saga_shows_header_statuses_and_identifiers() -> None:
    d = Driver(CATALOG)
    d.feed(start_named("refund", REFUND_PARAMS, saga_id="saga-9", order_id="order-3"))
    d.done({"reservation_id": "res-1", "warehouse": "north"})
    d.done({"credit_note_id": "cn-1"}, tries=3)
    d.done({"email_id": "em-1"})

    text = render_register(d.st)

    lines = text.splitlines()
    assert lines[0] == "saga saga-9  (refund)  order order-3"
    assert lines[1] == "status: completed"
    assert row_of(text, "inventory.reserve_stock") == [
        "0",
        "inventory.reserve_stock",
        "compensable",
        "done",
        "1",
        "reservation_id=res-1",  # only what the compensation needs, not "warehouse"
        "inventory.release_stock",
        "-",
    ]
    assert row_of(text, "erp.create_credit_note")[4:6] == ["3", "credit_note_id=cn-1"]
    assert row_of(text, "email.send_customer_email")[2:4] == ["irreversible", "done"]
    for absent in ("reason:", "needs a person", "errors:", "never happened:", "decisions:"):
        assert absent not in text


def test_table_columns_line_up() -> None:
    d = checkout()
    d.done({"reservation_id": "res-1"})
    text = render_register(d.st)

    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("#  action"))
    start = lines.index(header)
    rows = lines[start + 2 : start + 6]
    column = header.index("status")
    assert [r[column:].split()[0] for r in rows] == ["done", "running", "pending", "pending"]
    assert set(lines[start + 1].replace(" ", "")) == {"-"}


def test_failed_saga_shows_the_reason_errors_undo_and_what_never_happened() -> None:
    d = checkout()
    d.done({"reservation_id": "res-1"})
    d.done({"payment_id": "pay-1"})
    d.fail("address unknown", effect_unknown=False)
    d.done()
    d.done()

    text = render_register(d.st)

    assert "status: compensated" in text
    assert "reason: step 2 erp.validate_address failed: address unknown" in text
    assert section(text, "errors") == ["step 2 erp.validate_address: address unknown"]
    assert row_of(text, "payments.charge_card")[3] == "compensated"
    assert row_of(text, "payments.charge_card")[-1] == "compensated"
    assert row_of(text, "erp.validate_address")[3] == "failed"
    assert section(text, "never happened") == ["step 3 email.send_confirmation"]
    assert f"step 1 payments.charge_card: {RESIDUE}" in section(text, "residue")


def test_unknown_effect_is_called_out_in_the_errors() -> None:
    d = checkout()
    d.done()
    d.fail("gateway timed out", effect_unknown=True)

    text = render_register(d.st)

    assert section(text, "errors") == [
        "step 1 payments.charge_card: gateway timed out (effect unknown)"
    ]
    assert row_of(text, "payments.charge_card")[-1] == "running"


def test_needs_human_shows_why_and_the_failed_compensation() -> None:
    d = checkout()
    d.done({"reservation_id": "res-1"})
    d.fail("card declined")
    d.fail("warehouse offline")

    text = render_register(d.st)

    assert "status: needs_human" in text
    assert d.st.needs_human_reason is not None
    assert f"needs a person because: {d.st.needs_human_reason}" in text
    assert "warehouse offline" in text
    assert section(text, "errors") == [
        "step 1 payments.charge_card: card declined",
        "step 0 inventory.release_stock: warehouse offline",
    ]
    row = row_of(text, "inventory.reserve_stock")
    assert (row[3], row[-1]) == ("compensation_failed", "failed")
    assert section(text, "never happened") == [
        "step 1 payments.charge_card (failed, nothing changed: card declined)",
        "step 2 erp.validate_address",
        "step 3 email.send_confirmation",
    ]


def test_irreversible_step_that_landed_is_listed_as_impossible_to_undo() -> None:
    catalog = make_catalog(
        {
            "payments.charge": with_residue("payments.refund", residue="a refund line stays"),
            "email.notify": irreversible(),
            "erp.audit": read_only(),
        },
        ["payments.refund"],
    )
    d = Driver(catalog)
    d.feed(start_plan(["payments.charge", "email.notify", "erp.audit"]))
    d.done({"id": "pay-1"})
    d.done({"id": "em-1"})
    d.fail("audit failed")
    d.done()

    text = render_register(d.st)

    assert section(text, "residue") == [
        "step 0 payments.charge: a refund line stays",
        "step 1 email.notify: irreversible and already done; it cannot be undone",
    ]
    assert row_of(text, "email.notify")[-1] == "impossible"


def test_decisions_are_listed_with_time_kind_and_note() -> None:
    d = checkout()
    d.done()
    d.abort("customer called")
    d.done()
    d.fail("warehouse offline")
    d.resume("warehouse back")
    d.done()

    text = render_register(d.st)

    abort_at, resume_at = (dec.at for dec in d.st.decisions)
    assert section(text, "decisions") == [
        f"{abort_at:%Y-%m-%d %H:%M:%S} abort by ann (person): customer called",
        f"{resume_at:%Y-%m-%d %H:%M:%S} resume by ann (person): warehouse back",
    ]
    assert "reason: aborted: customer called" in text


def test_a_completed_saga_shows_no_residue_since_nothing_was_undone() -> None:
    # The residue is what a compensation leaves behind ("the charge and its refund both stay
    # on the statement"). A completed checkout refunded nothing: listing that sentence tells
    # the operator a refund happened.
    d = checkout()
    d.run_forward(4)
    assert d.status() == "completed"

    text = render_register(d.st)

    assert "residue:" not in text
    assert RESIDUE not in text


def test_table_pads_cells_and_marks_empty_ones() -> None:
    text = table(("a", "bb"), [(1, None), ("long", "")])

    assert text.splitlines() == ["a     bb", "----  --", "1     -", "long  -"]
