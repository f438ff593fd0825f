"""`saga run` checks what it was asked to run before it serves or connects anything: a
mistyped component is one error line, with no metrics warning before it (nor a connection)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def test_an_unknown_component_is_one_line_even_when_the_metrics_port_is_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            **os.environ, "SAGA_METRICS_BIND": f"127.0.0.1:{port}",
            # nothing listens on port 1: had it tried to connect, it would wait, not fail
            "SAGA_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/",
            "SAGA_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/saga",
        }  # fmt: skip
        ran = subprocess.run(
            [sys.executable, "-m", "saga_app.cli", "run", "nosuch"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert ran.returncode == 1
    assert ran.stderr.strip().splitlines() == [
        "Error: unknown service 'nosuch': give one of inventory, erp, payments, email, "
        "payments-http, or module:attribute"
    ]
