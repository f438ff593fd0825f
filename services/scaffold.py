"""``saga new adapter NAME``: a package for a new service, its catalog entries and a test."""

from __future__ import annotations

import keyword
import re
from importlib import resources
from pathlib import Path

from saga_services.registry import SYSTEMS
from saga_shared.errors import ConfigError

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
TEMPLATES = ("__init__.py", "service.py", "catalog.toml", "test_service.py")


def check_name(name: str) -> None:
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise ConfigError(
            f"service name {name!r}: use a lower-case Python identifier ([a-z][a-z0-9_]*, "
            "at most 40), not a keyword"
        )
    if name in SYSTEMS or name in ("saga_services", "saga_shared", "saga_coordinator", "saga_app"):
        raise ConfigError(f"service name {name!r} is taken by the project itself")


def new_adapter(name: str, into: Path) -> list[Path]:
    """Write the package ``into/name``; refuse to overwrite anything."""
    check_name(name)
    package = into / name
    if package.exists():
        raise ConfigError(f"{package} already exists: choose another name or directory")
    templates = resources.files("saga_services") / "templates" / "adapter"
    package.mkdir(parents=True)
    written = []
    for file in TEMPLATES:
        text = (templates / f"{file}.tmpl").read_text(encoding="utf-8")
        target = package / file
        target.write_text(text.replace("{{name}}", name), encoding="utf-8")
        written.append(target)
    return written
