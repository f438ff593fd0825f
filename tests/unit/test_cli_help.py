"""Every command says what it does in its --help, and the incident text leaves out a note that
was never given."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click
from click.testing import CliRunner
from pydantic import JsonValue

from saga_app.cli import main
from saga_coordinator.incident import render_markdown, render_summary
from saga_coordinator.machine import start
from saga_coordinator.register import Decision
from saga_shared.model.gateway import admit
from tests.unit.factories import real_catalog, start_named

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
REFUND: dict[str, JsonValue] = {
    "sku": "S", "quantity": 1, "amount_cents": 5, "customer_email": "a@example.com",
}  # fmt: skip


def commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        found.append((*path, name))
        if isinstance(command, click.Group):
            found += commands(command, (*path, name))
    return found


def test_every_command_describes_itself_in_its_help() -> None:
    every = commands(main)
    assert ("faults", "add") in every and len(every) > 20
    for path in every:
        said = CliRunner().invoke(main, [*path, "--help"])
        assert said.exit_code == 0, path
        _usage, _, rest = said.output.partition("\n\n")
        description = rest.split("Options:")[0].strip()
        assert description, f"saga {' '.join(path)} --help says nothing of what it does"


def test_a_decision_without_a_note_shows_no_dangling_colon() -> None:
    command = start_named("refund", REFUND, saga_id="s-1", order_id="o-1")
    state = start(command, admit(real_catalog(), command), NOW).state
    assert state is not None
    by = {"by": "saga-ops", "role": "ops", "at": NOW}
    resumed = Decision(kind="resume", note="", **by)
    resolved = Decision(kind="resolve", note="voided by hand", **by)
    state = state.evolve(decisions=(resumed, resolved))
    summary = render_summary(state)
    assert "resume by saga-ops (ops)\n" in summary + "\n"
    assert "resolve by saga-ops (ops): voided by hand" in summary
    assert "(ops): \n" not in render_markdown(state) + "\n"


def test_a_bad_value_from_a_variable_is_one_line_naming_the_variable() -> None:
    said = CliRunner().invoke(main, ["list"], env={"SAGA_PARTITIONS": "x"})
    assert said.exit_code == 1
    assert said.output == "Error: SAGA_PARTITIONS='x': 'x' is not a valid integer.\n"
    # a subcommand's variable too; the same value as a flag stays a usage error (exit 2)
    said = CliRunner().invoke(main, ["mcp"], env={"SAGA_MCP_TRANSPORT": "carrier-pigeon"})
    assert said.exit_code == 1
    assert said.output.startswith("Error: SAGA_MCP_TRANSPORT='carrier-pigeon': ")
    said = CliRunner().invoke(main, ["list"], env={"SAGA_PARTITIONS": "9" * 10_000})
    assert said.exit_code == 1 and len(said.output) < 200  # the value is not echoed whole
    said = CliRunner().invoke(main, ["--partitions", "x", "list"])

    assert said.exit_code == 2 and "Invalid value for '--partitions'" in said.output


def test_a_fault_on_an_action_nobody_declares_is_refused_naming_those_that_exist() -> None:
    said = CliRunner().invoke(
        main, ["faults", "add", "warehouse.nope", "--order", "O-1", "--mode", "permanent"],
        env={"SAGA_CATALOG_PATH": str(ROOT / "docs/examples/warehouse/catalog.toml")},
    )  # fmt: skip
    assert said.exit_code == 2
    assert "unknown action 'warehouse.nope'" in said.output
    assert "warehouse.create_thing" in said.output  # one's own service's actions are known
    # a bad mode on a simulated system's action is still named as the mode
    said = CliRunner().invoke(
        main, ["faults", "add", "erp.create_credit_note", "--order", "O-1", "--mode", "sometimes"]
    )
    assert said.exit_code == 2
    assert "Invalid value for --mode: fault mode 'sometimes'" in said.output
