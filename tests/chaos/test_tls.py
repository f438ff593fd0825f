"""TLS by configuration: a disposable broker and database that accept nothing but TLS, with a
development CA from `saga tls`; every component on its own role, verifying the servers'
certificates and names. A refund and a gated checkout run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import aio_pika
import aiormq
import asyncpg
import pytest

from saga_app.stack import Stack
from saga_coordinator.access import definitions, ensure_passwords, grants
from saga_coordinator.provision import Report, database_passwords, declare_topology, setup_database
from saga_coordinator.tls import make_development_ca
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from tests.chaos.instances import DisposablePostgres, DisposableRabbit
from tests.integration.helpers import REFUND
from tests.integration.test_gates_and_abort import CHECKOUT


async def test_a_refund_and_a_gated_checkout_over_tls_with_every_role(tmp_path: Path) -> None:
    files = make_development_ca(tmp_path / "tls", ["localhost", "127.0.0.1"])
    async with DisposablePostgres(tls=files) as pg, DisposableRabbit(tls=files) as rabbit:
        # nothing but TLS, and only with a certificate the client can verify
        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="no encryption"):
            await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{pg.port}/postgres", ssl=False)
        with pytest.raises(OSError):
            await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{rabbit.port}/", timeout=5)
        with pytest.raises(aiormq.exceptions.AMQPConnectionError, match="CERTIFICATE_VERIFY"):
            await aio_pika.connect(f"amqps://guest:guest@localhost:{rabbit.port}/", timeout=5)

        settings = Settings(
            amqp_url=rabbit.url("saga-tls"), database_url=pg.url("saga"), namespace="tls",
            identity="roles", secrets_dir=str(tmp_path / "secrets"), people="ana",
            partitions=2, relay_poll_s=0.2, watchdog_s=0.3,
        )  # fmt: skip
        users = [g.user for g in grants(settings)]
        document = definitions(settings, ensure_passwords(tmp_path / "secrets", "rabbitmq", users))
        assert rabbit.dir is not None
        (rabbit.dir / "definitions.json").write_text(json.dumps(document))
        (rabbit.dir / "definitions.json").chmod(0o644)
        await rabbit.ctl("import_definitions", str(rabbit.dir / "definitions.json"))
        await declare_topology(settings)
        await setup_database(settings, pg.url("postgres"), database_passwords(settings), Report())

        async with Stack(settings) as stack:
            assert stack.bus.url.startswith("amqps://saga-coordinator:")
            async with Bus(settings, user="saga-agent") as bus, SagaClient(bus) as agent:
                refund = await agent.start("refund", order_id="tls-1", params=REFUND)
                assert (await agent.wait(refund, seconds=60)).type == "saga.completed"
                gated = await agent.start("checkout_approved", order_id="tls-2", params=CHECKOUT)
                stop = await agent.wait(gated, seconds=60, stops=True)
                assert stop.type == "saga.awaiting_approval"
            async with Bus(settings, user="ana") as bus, SagaClient(bus) as ana:
                await ana.approve(gated, order_id="tls-2", note="checked over TLS")
                assert (await ana.wait(gated, seconds=60)).type == "saga.completed"
            state = await stack.store.get(gated)
            assert state is not None and state.decisions[-1].by == "ana"
            conn = await asyncpg.connect(pg.url("saga"))
            try:
                assert await conn.fetchval(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                )
            finally:
                await conn.close()
