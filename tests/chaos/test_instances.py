"""The disposable servers' ports: a restarted node must find its port still free.

The cluster test's broker node once failed to come back (CI, and under a CPU load here): its
AMQP port, drawn from the kernel's ephemeral range, had been given meanwhile to an outgoing
connection, and the node's listener stopped with eaddrinuse. Ports are now drawn outside that
range, where the kernel never hands one to a connection.
"""

from __future__ import annotations

import socket

from tests.chaos.instances import LOWEST_PORT, _ephemeral_ports, free_port


def test_ports_are_never_from_the_kernels_ephemeral_range() -> None:
    ephemeral = _ephemeral_ports()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == 200, "a port handed out twice"
    assert all(p >= LOWEST_PORT and p not in ephemeral for p in ports), sorted(ports)[:10]


def test_an_outgoing_connection_never_takes_a_handed_out_port() -> None:
    """What the restart needs, said the kernel's way: connections get ephemeral ports only."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        held = [socket.create_connection(server.getsockname()) for _ in range(50)]
        try:
            local = {s.getsockname()[1] for s in held}
            assert local <= set(_ephemeral_ports())
            assert not local & {free_port() for _ in range(100)}
        finally:
            for s in held:
                s.close()
