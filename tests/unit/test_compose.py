"""The docker compose file keeps the promises of the threat model: every component connects as
its own broker user and Postgres role with its own password, and only the one-shot set-up sees
an administrator's password. (No Docker engine runs here; this reads the file as compose would.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from saga_shared.config import Settings

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
COMPONENTS = ("coordinator", "inventory", "erp", "payments", "email")


def services() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return dict(loaded["services"])


def test_each_component_connects_as_its_own_role_with_its_own_password() -> None:
    for name in COMPONENTS:
        env = services()[name]["environment"]
        broker, database = urlsplit(env["SAGA_AMQP_URL"]), urlsplit(env["SAGA_DATABASE_URL"])
        own = f"${{SAGA_PASSWORD_SAGA_{name.upper()}}}"
        assert (broker.username, broker.password) == (f"saga-{name}", own), name
        assert (database.username, database.password) == (f"saga_{name}", own), name
        assert env["SAGA_IDENTITY"] == "roles"
        assert services()[name]["command"] == ["run", name]


def test_only_the_setup_sees_an_administrators_password() -> None:
    for name, service in services().items():
        text = str(service.get("environment", {}))
        admin = "ADMIN_PASSWORD" in text
        assert admin == (name in ("setup", "rabbitmq", "postgres")), name
    assert services()["setup"]["command"][0] == "setup"
    for name in COMPONENTS:
        depends = services()[name]["depends_on"]
        assert depends["setup"]["condition"] == "service_completed_successfully"


CLUSTER = COMPOSE.parent / "deploy" / "compose" / "cluster.yml"


def test_the_cluster_file_lists_every_node_to_every_client_and_replicates_the_database() -> None:
    loaded: dict[str, Any] = yaml.safe_load(CLUSTER.read_text())
    cluster = loaded["services"]
    nodes = ["rabbitmq", "rabbitmq-2", "rabbitmq-3"]
    conf = (CLUSTER.parent / "rabbitmq-cluster.conf").read_text()
    for node in nodes:
        assert cluster[node]["hostname"] == node
        assert f"rabbit@{node}" in conf
        assert "RABBITMQ_ERLANG_COOKIE" in cluster[node]["environment"]  # one cookie for all
    for name in (*COMPONENTS, "setup"):
        env = cluster[name]["environment"]
        broker = env["SAGA_AMQP_URL"].removeprefix("amqp://").rpartition("@")[2]
        assert broker.startswith(",".join(f"{n}:5672" for n in nodes)), name
        database = env["SAGA_DATABASE_URL"]
        assert "@postgres:5432,postgres-standby:5432/saga" in database or name == "setup", name
        assert database.endswith("?target_session_attrs=read-write"), name
        assert env["SAGA_QUORUM_SIZE"] == "3"
        if name != "setup":  # the main file's own role and password, on every host
            own = f"${{SAGA_PASSWORD_SAGA_{name.upper()}}}"
            assert f"saga-{name}:{own}@" in env["SAGA_AMQP_URL"], name
            assert f"saga_{name}:{own}@" in database, name
            assert cluster[name]["deploy"]["replicas"] >= 2, name
    primary = cluster["postgres"]["command"]
    assert "synchronous_standby_names=*" in primary
    standby = " ".join(cluster["postgres-standby"]["entrypoint"])
    assert "pg_basebackup -h postgres" in standby and " -R " in standby
    # every service the override names exists in the main file or in the override itself
    assert set(cluster) - set(services()) == {"rabbitmq-2", "rabbitmq-3", "postgres-standby"}


def test_every_broker_refuses_messages_over_a_mebibyte_and_takes_what_the_services_read() -> None:
    """RabbitMQ's default, 128 MiB, times a consumer's prefetch is more memory than a process
    has: the broker refuses a publish over the limit; under it, the services refuse by name."""
    conf = (COMPOSE.parent / "deploy" / "compose" / "rabbitmq.conf").read_text()
    limit = int(conf.split("max_message_size = ")[1].split()[0])
    assert Settings().max_message_bytes < limit <= 1024 * 1024
    mount = "./deploy/compose/rabbitmq.conf:/etc/rabbitmq/conf.d/10-saga.conf:ro"
    assert mount in services()["rabbitmq"]["volumes"]
    cluster = yaml.safe_load(CLUSTER.read_text())["services"]
    for node in ("rabbitmq", "rabbitmq-2", "rabbitmq-3"):
        assert mount in cluster[node]["volumes"], node


def test_every_long_running_process_is_health_checked_by_its_metrics() -> None:
    # The image's HEALTHCHECK probes the process's own /metrics (saga_app.health); every
    # component inherits it and serves /metrics where the probe looks; the one-shot containers
    # turn it off (nothing to probe, and they exit).
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    assert 'CMD ["python", "-m", "saga_app.health"]' in dockerfile
    assert "HEALTHCHECK --interval" in dockerfile
    for name in COMPONENTS:
        service = services()[name]
        assert "healthcheck" not in service, name
        assert service["environment"]["SAGA_METRICS_BIND"] == "0.0.0.0:9464", name
    for name in ("setup", "demo"):
        assert services()[name]["healthcheck"] == {"disable": True}, name
    for name in ("rabbitmq", "postgres"):
        assert services()[name]["healthcheck"]["test"], name
