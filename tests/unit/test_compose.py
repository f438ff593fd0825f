"""The docker compose file keeps the promises of the threat model: every component connects as
its own broker user and Postgres role with its own password, and only the one-shot set-up sees
an administrator's password. (No Docker engine runs here; this reads the file as compose would.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

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
