"""A service of one's own, as a user adds it: `saga new adapter`, its generated test, and the
generated package run beside the coordinator on the real broker and database."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from saga_app.stack import Stack
from saga_coordinator.access import grants
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from saga_shared.security.identity import db_role
from saga_shared.transport.bus import Bus
from tests.conftest import AMQP_URL
from tests.integration.deployment import Deployment
from tests.integration.helpers import eventually, remove_namespace
from tests.integration.test_cli import saga, saga_json


@pytest.fixture
def scaffolded(tmp_path: Path, settings: Settings) -> Iterator[Path]:
    code, out, err = asyncio.run(_new(settings, tmp_path))
    assert code == 0, err
    assert json.loads(out)["files"][1].endswith("warehouse/service.py")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path / "warehouse"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "warehouse" or m.startswith("warehouse.")]:
            del sys.modules[name]


async def _new(settings: Settings, into: Path) -> tuple[int, str, str]:
    return await saga(settings, "new", "adapter", "warehouse", "--dir", str(into), "--json")


def test_the_generated_test_passes_and_the_code_is_lint_clean(scaffolded: Path) -> None:
    env = {"PYTHONPATH": str(scaffolded.parent), "PATH": str(Path(sys.executable).parent)}
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(scaffolded)],
        capture_output=True, text=True, env=env, cwd=scaffolded.parent, check=False,
    )  # fmt: skip
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(scaffolded)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "3 passed" in ran.stdout
    assert lint.returncode == 0, lint.stdout


async def test_scaffolding_twice_refuses_to_overwrite(settings: Settings, tmp_path: Path) -> None:
    assert (await _new(settings, tmp_path))[0] == 0
    code, _, err = await _new(settings, tmp_path)

    assert code != 0
    assert "already exists" in err and "Traceback" not in err


async def test_the_new_service_runs_a_saga_beside_the_coordinator(
    scaffolded: Path, settings: Settings
) -> None:
    own = settings.with_(catalog_path=str(scaffolded / "catalog.toml"))
    try:
        async with Stack(own, ["coordinator", "warehouse.service:SERVICE"]) as stack:
            assert own.namespace + ".action.warehouse" in stack.bus.topology.all_queues()
            async with Bus(own) as bus, SagaClient(bus, answer_within_s=20) as agent:
                saga_id = await agent.start(
                    "warehouse_demo", order_id="o-wh-1", params={"label": "crate"}
                )
                outcome = await agent.wait(saga_id, seconds=30)
            state = await stack.store.get(saga_id)
    finally:
        await remove_namespace(own)

    assert outcome.status == "completed"
    assert state is not None
    assert str(state.steps[0].result["thing_id"]).startswith("thing-")  # type: ignore[index]


async def test_faults_rehearse_ones_own_service_when_its_adapter_takes_them(
    scaffolded: Path, settings: Settings
) -> None:
    """`saga faults add` on the service's action: its adapter, run with SAGA_INJECT_FAULTS,
    fails the next call (then it works: attempt 2), or every call (the saga compensates); the
    service's function is never called for a faulted try. Without the setting, nothing."""
    own = settings.with_(catalog_path=str(scaffolded / "catalog.toml"))
    action = "warehouse.create_thing"
    for order, mode in (
        ("o-wh-t", "transient:1"),
        ("o-wh-p", "permanent"),
        ("o-wh-off", "permanent"),
    ):
        code, out, err = await saga(own, "faults", "add", action, "--order", order, "--mode", mode)
        assert code == 0 and "SAGA_INJECT_FAULTS=true" in out, (code, out, err)
    ends = {}
    try:
        for inject, orders in ((True, ("o-wh-t", "o-wh-p")), (False, ("o-wh-off",))):
            parts = ["coordinator", "warehouse.service:SERVICE"]
            async with (
                Stack(own.with_(inject_faults=inject), parts) as stack,
                Bus(own) as bus,
                SagaClient(bus, answer_within_s=20) as agent,
            ):
                for order in orders:
                    saga_id = await agent.start("warehouse_demo", order_id=order,
                                                params={"label": "crate"})  # fmt: skip
                    await agent.wait(saga_id, seconds=30)
                    state = await stack.store.get(saga_id)
                    assert state is not None
                    ends[order] = (state.status, state.steps[0].attempts, state.steps[0].error)
    finally:
        await saga(own, "faults", "clear")
        await remove_namespace(own)

    assert ends["o-wh-t"][:2] == ("completed", 2)
    assert ends["o-wh-p"][0] == "compensated"
    assert "injected permanent fault on warehouse.create_thing" in str(ends["o-wh-p"][2])
    assert ends["o-wh-off"][:2] == ("completed", 1)  # an adapter not asked applies none


def test_two_components_serving_one_service_are_refused(settings: Settings) -> None:
    with pytest.raises(ConfigError, match="both serve 'payments'"):
        Stack(settings, ["coordinator", "payments", "payments-http"])
    with pytest.raises(ConfigError, match="unknown service 'warehouse'"):
        Stack(settings, ["warehouse"])


async def test_the_new_service_runs_on_its_own_accounts_in_roles_mode(
    scaffolded: Path, database_url: str, run_id: str
) -> None:
    """`saga setup` gives a service of one's own a broker user reading only its queue and a
    Postgres role writing only its failed attempts; the saga runs with every part on its own."""
    own_db = urlunsplit(urlsplit(database_url)._replace(path=f"/saga_test_{run_id}_own"))
    base = Settings(
        amqp_url=AMQP_URL, database_url=own_db, partitions=2, watchdog_s=0.3,
        catalog_path=str(scaffolded / "catalog.toml"),
    )  # fmt: skip
    made = Deployment(base, f"{run_id}w")
    await made.create()
    try:
        settings = made.settings.with_(relay_poll_s=0.2)
        parts = ["coordinator", "warehouse.service:SERVICE"]
        agent_bus = Bus(settings, user=made.user("agent"))
        async with (
            Stack(settings, parts),
            agent_bus,
            SagaClient(agent_bus, answer_within_s=20) as agent,
        ):
            saga_id = await agent.start(
                "warehouse_demo", order_id="o-wh-2", params={"label": "crate"}
            )
            outcome = await agent.wait(saga_id, seconds=30)
            # its heartbeat is written on its own account, and its calls show in `saga effects`
            beats = await eventually(lambda: _beats(own_db, settings.namespace),
                                     lambda names: "warehouse" in names)  # fmt: skip
            effects = await saga_json(settings, "effects", "--order", "o-wh-2")
        permitted = {g.user: g for g in grants(settings)}[made.user("warehouse")]
        admin = await asyncpg.connect(own_db)
        try:
            role = db_role(settings, "warehouse")
            may_write = await admin.fetchval(
                "SELECT has_table_privilege($1, 'delivery_failures', 'INSERT')", role
            )
            may_touch_sagas = await admin.fetchval(
                "SELECT has_table_privilege($1, 'sagas', 'SELECT')", role
            )
            may_take_faults = await admin.fetchval(
                "SELECT has_table_privilege($1, 'sim_faults', 'UPDATE')", role
            )
        finally:
            await admin.close()
    finally:
        await _drop(made, own_db)

    assert outcome.status == "completed"
    assert {"coordinator", "warehouse"} <= beats
    assert [(c["system"], c["outcome"]) for c in effects["calls"]] == [("warehouse", "done")]
    assert permitted.read == rf"^{settings.namespace}\.(action|request)\.warehouse$"
    assert (may_write, may_touch_sagas, may_take_faults) == (True, False, True)


async def _beats(database_url: str, namespace: str) -> set[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT name FROM processes WHERE namespace = $1", namespace)
        return {r["name"] for r in rows}
    finally:
        await conn.close()


async def _drop(made: Deployment, database_url: str) -> None:
    name = urlsplit(database_url).path.lstrip("/")
    server = urlunsplit(urlsplit(database_url)._replace(path="/postgres"))
    conn = await asyncpg.connect(server)
    try:  # the deployment's owner role owns the database: hand it back before the roles go
        await conn.execute(f'ALTER DATABASE "{name}" OWNER TO CURRENT_USER')
        await made.remove()
        await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await conn.close()
