"""The test kit's pytest plugin, given the warehouse's catalog and service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from warehouse.service import SERVICE

from saga_services.sdk import Service

pytest_plugins = ["saga_app.pytest_plugin"]


@pytest.fixture
def saga_catalog() -> Path:
    return Path(__file__).parent.parent / "warehouse" / "catalog.toml"


@pytest.fixture
def saga_services() -> list[Service[Any]]:
    return [SERVICE]
