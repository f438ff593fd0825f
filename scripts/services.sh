#!/usr/bin/env bash
# Start the machine's RabbitMQ and PostgreSQL when they are down (never stops them).
set -euo pipefail

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
    for _ in $(seq 1 120); do
        if port_open "$1"; then return 0; fi
        sleep 0.5
    done
    echo "service on port $1 did not come up" >&2
    return 1
}

if ! port_open 5432; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
    wait_port 5432
fi
if ! port_open 5672; then
    echo "starting RabbitMQ"
    rabbitmq-server -detached
    # The node answers ping before its AMQP listener is up: wait for the port itself.
    wait_port 5672
fi
