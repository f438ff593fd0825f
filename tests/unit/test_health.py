"""The container's health check and the version a user asks for."""

from __future__ import annotations

import socket
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import start_http_server

from saga_app.cli import main
from saga_app.health import probe

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def metrics_port() -> Iterator[int]:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1")
    yield port
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_process_whose_metrics_answer_is_healthy(metrics_port: int) -> None:
    assert probe(f"127.0.0.1:{metrics_port}") is None
    assert probe(f"0.0.0.0:{metrics_port}") is None  # listening everywhere: asked locally


def test_a_process_whose_metrics_do_not_answer_is_not_and_the_reason_names_the_url() -> None:
    port = free_port()  # nothing listens there
    problem = probe(f"127.0.0.1:{port}", timeout_s=2)
    assert problem is not None and problem.startswith(f"http://127.0.0.1:{port}/metrics: ")


def test_saga_version_is_the_distributions() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    said = CliRunner().invoke(main, ["--version"])
    assert said.exit_code == 0
    assert said.output == f"saga, version {version}\n"
