"""The container's health check and the version a user asks for."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import start_http_server

from saga_app.cli import main
from saga_app.health import probe
from saga_shared.observability import metrics
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def metrics_port() -> Iterator[int]:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1")
    yield port
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_process_whose_loop_beats_is_healthy_and_a_frozen_one_is_not(metrics_port: int) -> None:
    bind = f"127.0.0.1:{metrics_port}"
    metrics.HEARTBEAT.set(0)  # the thread serves /metrics, but the loop never beat
    assert probe(bind) == f"http://{bind}/metrics: no heartbeat (is this a saga process?)"
    asyncio.run(beat_once())
    assert probe(bind) is None
    assert probe(f"0.0.0.0:{metrics_port}") is None  # listening everywhere: asked locally
    later = time.time() + 100  # the loop frozen since: /metrics still answers
    assert probe(bind, now=later) == f"http://{bind}/metrics: the event loop has not run for 100 s"


async def beat_once() -> None:
    task = asyncio.create_task(metrics.heartbeat(every_s=60))
    await asyncio.sleep(0)  # its first beat
    task.cancel()


def test_a_bad_bind_is_one_line_naming_the_setting() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "saga_app.health"], env={**os.environ, "SAGA_METRICS_BIND": "x"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 1
    assert len(ran.stderr.strip().splitlines()) == 1 and "SAGA_METRICS_BIND" in ran.stderr


def test_a_process_whose_metrics_do_not_answer_is_not_and_the_reason_names_the_url() -> None:
    port = free_port()  # nothing listens there
    problem = probe(f"127.0.0.1:{port}", timeout_s=2)
    assert problem is not None and problem.startswith(f"http://127.0.0.1:{port}/metrics: ")


def test_saga_version_is_the_distributions() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    said = CliRunner().invoke(main, ["--version"])
    assert said.exit_code == 0
    assert said.output == f"saga, version {version}\n"
