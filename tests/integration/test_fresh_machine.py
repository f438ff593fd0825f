"""A machine where the configured RabbitMQ and Postgres do not answer: scripts/services.sh
starts private instances from the installed servers on free ports, says so with how to stop
them, finds them again on the next run, and `stop` stops them and nothing else."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import aiormq
import asyncpg
import pytest

from tests.conftest import AMQP_URL, DATABASE_SERVER
from tests.ports import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"


@pytest.fixture
def services_dir() -> Iterator[Path]:
    # Not pytest's tmp_path: its parents are closed to the postgres and rabbitmq accounts.
    base = Path(tempfile.mkdtemp(prefix="saga-fresh-"))
    base.chmod(0o755)
    yield base / "services"
    subprocess.run(["bash", SCRIPT, "stop"], env=clean_env(base / "services"), check=False,
                   capture_output=True, timeout=120)  # fmt: skip
    shutil.rmtree(base, ignore_errors=True)


def clean_env(services: Path, **urls: str) -> dict[str, str]:
    """This process's environment without the suite's own broker, database and node."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGA_", "RABBITMQ_"))}
    return {**env, "SAGA_SERVICES_DIR": str(services), **urls}


async def services(env: dict[str, str], *args: str) -> tuple[int, list[str], list[str]]:
    # Asynchronous, so that the connections this test holds to the suite's services keep up
    # their heartbeats while it waits.
    proc = await asyncio.create_subprocess_exec(
        "bash", str(SCRIPT), *args, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 150)
    return proc.returncode or 0, out.decode().splitlines(), err.decode().splitlines()


def exported(path: Path) -> dict[str, str]:
    pairs = [shlex.split(line)[1] for line in path.read_text().splitlines()
             if line.startswith("export ")]  # fmt: skip
    return dict(pair.split("=", 1) for pair in pairs)


async def answers(env: dict[str, str]) -> tuple[str, int]:
    """The private broker takes an AMQP connection and the private database a query. Returns
    the node rabbitmqctl reaches with the file's RABBITMQ_NODENAME (as `saga setup` will), and
    the rows of a mark table, one more each call (the table is made when missing)."""
    broker = await aio_pika.connect(env["SAGA_TEST_AMQP_URL"], timeout=10)
    await broker.close()
    conn = await asyncpg.connect(env["SAGA_TEST_DATABASE_URL"] + "postgres", timeout=10)
    try:
        assert await conn.fetchval("SELECT 1") == 1
        await conn.execute("CREATE TABLE IF NOT EXISTS fresh_mark (at timestamptz DEFAULT now())")
        await conn.execute("INSERT INTO fresh_mark DEFAULT VALUES")
        rows: int = await conn.fetchval("SELECT count(*) FROM fresh_mark")
    finally:
        await conn.close()
    listed = await asyncio.to_thread(
        subprocess.run, ["rabbitmqctl", "-q", "eval", "node()."], capture_output=True, text=True,
        timeout=60, env={**os.environ, "RABBITMQ_NODENAME": env["RABBITMQ_NODENAME"]},
    )  # fmt: skip
    return listed.stdout.strip().strip("'"), rows


async def largest_taken(env: dict[str, str]) -> int:
    """Of a publish of 1 MiB and one a byte longer, the larger the private broker confirms."""
    broker = await aio_pika.connect(env["SAGA_TEST_AMQP_URL"], timeout=10)
    taken = 0
    try:
        for size in (1024 * 1024, 1024 * 1024 + 1):
            channel = await broker.channel(publisher_confirms=True)
            queue = await channel.declare_queue("", exclusive=True)
            try:
                await channel.default_exchange.publish(aio_pika.Message(b"x" * size), queue.name)
                taken = size
            except aiormq.exceptions.ChannelPreconditionFailed:
                break
    finally:
        await broker.close()
    return taken


async def refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return False


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.mark.timeout(300)
async def test_private_instances_are_started_reused_and_stopped(services_dir: Path) -> None:
    # The suite's own broker and database, held open throughout: they must live through it all.
    suite_broker = await aio_pika.connect(AMQP_URL)
    suite_db = await asyncpg.connect(DATABASE_SERVER + "postgres")
    suite_db_started = await suite_db.fetchval("SELECT pg_postmaster_start_time()")
    nothing_there = (free_port(), free_port())
    env = clean_env(
        services_dir,
        SAGA_AMQP_URL=f"amqp://guest:guest@127.0.0.1:{nothing_there[0]}/",
        SAGA_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{nothing_there[1]}/saga",
    )
    env_file = services_dir.with_name("services.env")
    try:
        code, out, err = await services(env)
        assert code == 0, err
        assert [line.split(":")[0] for line in out] == ["RabbitMQ", "PostgreSQL"]
        assert out[0].startswith("RabbitMQ: started a private node saga-"), out
        assert out[1].startswith("PostgreSQL: started a private instance on 127.0.0.1:"), out
        assert all(line.endswith("stop it with: scripts/services.sh stop") for line in out)
        first = exported(env_file)
        ports = port_of(first["SAGA_AMQP_URL"]), port_of(first["SAGA_DATABASE_URL"])
        assert not {*ports} & {5672, 5432, *nothing_there}
        assert first["SAGA_DATABASE_URL"].endswith("/saga")  # the database name configured
        node, rows = await answers(first)
        assert (node, rows) == (first["RABBITMQ_NODENAME"], 1)
        assert await largest_taken(first) == 1024 * 1024  # deploy/compose/rabbitmq.conf

        code, out, err = await services(env)
        assert code == 0, err
        assert out[0].startswith("RabbitMQ: reused the private node"), out
        assert out[1].startswith("PostgreSQL: reused the private instance"), out
        assert exported(env_file) == first

        code, out, err = await services(env, "stop")
        assert code == 0, err
        assert out[0].startswith("RabbitMQ: stopped the private node"), out
        assert out[1].startswith("PostgreSQL: stopped the private instance"), out
        assert [await refused(port) for port in ports] == [True, True]

        code, out, err = await services(env)
        assert code == 0, err
        assert all("started again, from its data" in line for line in out), out
        assert exported(env_file) == first
        assert await answers(first) == (first["RABBITMQ_NODENAME"], 2)  # the same data

        code, out, err = await services(env, "stop")
        assert code == 0, err
        assert [await refused(port) for port in ports] == [True, True]
    finally:
        channel = await suite_broker.channel()  # fails if the suite's broker went away
        await channel.close()
        await suite_broker.close()
        assert await suite_db.fetchval("SELECT pg_postmaster_start_time()") == suite_db_started
        await suite_db.close()


async def test_nothing_is_started_for_a_service_on_another_machine(services_dir: Path) -> None:
    host = f"saga-{uuid.uuid4().hex[:8]}.invalid"
    env = clean_env(services_dir, SAGA_AMQP_URL=f"amqp://guest:guest@{host}:5672/",
                    SAGA_DATABASE_URL=f"postgresql://postgres@{host}:5432/saga")  # fmt: skip

    code, out, err = await services(env)

    assert code == 1
    assert out == []
    assert err == [
        f"RabbitMQ: nothing answers at {host}:5672 (SAGA_AMQP_URL), another machine: start it "
        "there, or unset SAGA_AMQP_URL for one here",
        f"PostgreSQL: nothing answers at {host}:5432 (SAGA_DATABASE_URL), another machine: start "
        "it there, or unset SAGA_DATABASE_URL for one here",
    ]
    assert not await asyncio.to_thread(services_dir.exists)  # nothing made for them
    assert exported(services_dir.with_name("services.env")) == {}
