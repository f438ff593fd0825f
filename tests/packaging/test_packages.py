"""The packages as a user gets them: the wheel and the sdist build and pass ``twine check``; the
bare wheel is the agents' client alone, installs without the server's dependencies, and runs the
documentation's agent (docs/examples/agent.py) against a running stack."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from saga_app.stack import Stack
from saga_shared.config import Settings
from tests.integration.conftest import stack  # noqa: F401 - the running stack, as a fixture
from tests.integration.helpers import saga_env

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# What the server needs and an agent does not: none of it may come with the bare install.
SERVER_ONLY = {"asyncpg", "starlette", "uvicorn", "mcp", "jinja2", "cryptography", "rich"}


def run(*args: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT)
    return out


def virtualenv(dist: Path, where: Path, extra: str = "") -> Path:
    """A fresh virtualenv in ``where`` with the built wheel (and ``extra``) installed."""
    run(sys.executable, "-m", "venv", where)
    [wheel] = dist.glob("*.whl")
    pip = (where / "bin/python", "-m", "pip", "--disable-pip-version-check")
    run(*pip, "install", "--quiet", f"{wheel}{extra}")
    return where


@pytest.fixture(scope="module")
def slim(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bare wheel installed, and nothing else of ours."""
    return virtualenv(dist, tmp_path_factory.mktemp("slim"))


@pytest.fixture(scope="module")
def full(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and its server extra."""
    return virtualenv(dist, tmp_path_factory.mktemp("full"), "[server]")


USERS_APP = """
import asyncio
from pathlib import Path

import services, shared  # the user's own packages, beside ours
from saga_app.testkit import SagaKit
from saga_services.sdk import Service
from saga_shared.client import SagaClient
from warehouse.service import SERVICE


async def main() -> None:
    async with SagaKit(Path("warehouse/catalog.toml"), [SERVICE]) as kit:
        saga_id = await kit.start("warehouse_demo", order_id="o-1", params={"label": "crate"})
        ours = SagaClient.__name__, Service.__name__
        print(services.MINE, shared.MINE, *ours, kit.status(saga_id))


asyncio.run(main())
"""


def installed(venv: Path) -> set[str]:
    listed = run(venv / "bin/python", "-m", "pip", "list", "--format", "freeze")
    return {line.split("==")[0].lower().replace("_", "-") for line in listed.splitlines()}


def test_the_wheel_and_the_sdist_pass_twine_check_and_carry_license_and_types(dist: Path) -> None:
    built = sorted(p.name for p in dist.iterdir())
    version = PROJECT["version"]
    assert built == [
        f"reversible_sagas-{version}-py3-none-any.whl",
        f"reversible_sagas-{version}.tar.gz",
    ]
    run(sys.executable, "-m", "twine", "check", "--strict", *sorted(dist.iterdir()))
    [wheel] = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("saga_shared", "saga_services", "saga_coordinator", "saga_app"):
        assert f"{package}/py.typed" in names
    assert "saga_coordinator/queries.sql" in names  # the SQL travels with the code
    assert not any(name.startswith("tests/") for name in names)
    metadata = (
        zipfile.ZipFile(wheel).read(f"reversible_sagas-{version}.dist-info/METADATA").decode()
    )
    assert "License-Expression: Apache-2.0" in metadata


def test_the_bare_install_is_the_client_alone_and_says_what_the_cli_needs(slim: Path) -> None:
    have = installed(slim)
    assert not have & SERVER_ONLY, f"the bare install pulled {sorted(have & SERVER_ONLY)}"
    print(f"\nthe bare install: {len(have - {'pip', 'setuptools'})} distributions")
    assert run(slim / "bin/saga", "--version").strip() == f"saga, version {PROJECT['version']}"
    refused = subprocess.run(
        [slim / "bin/saga", "list"], capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "saga: this install is the agents' client only (asyncpg is missing); "
        "the CLI needs the server extra: pip install 'reversible-sagas[server]'"
    ]


async def test_the_documented_agent_runs_from_the_bare_install(
    slim: Path,
    stack: Stack,  # noqa: F811 - the fixture imported above
    settings: Settings,
    tmp_path: Path,
) -> None:
    # Run from an empty folder: the code must come from the installed wheel, not the checkout.
    env = {k: v for k, v in saga_env(settings).items() if k != "PYTHONPATH"}
    agent = await asyncio.create_subprocess_exec(
        slim / "bin/python", ROOT / "docs/examples/agent.py", "A-300", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await agent.communicate()  # the stack runs on this loop meanwhile
    assert agent.returncode == 0, err.decode()
    # What the first tutorial shows it prints (docs/tutorials/first-saga.md includes the file).
    assert out.decode() == (ROOT / "docs/examples/agent.out").read_text()


def test_a_project_with_its_own_services_and_shared_packages_uses_ours(
    full: Path, tmp_path: Path
) -> None:
    # A user's project: its own `services` and `shared` packages (common names), a system
    # added with `saga new adapter`, and a script that uses the client, the SDK and the kit.
    for own in ("services", "shared"):
        (tmp_path / own).mkdir()
        (tmp_path / own / "__init__.py").write_text(f"MINE = {own!r}\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}  # nothing of the checkout
    run(full / "bin/saga", "new", "adapter", "warehouse", cwd=tmp_path, env=env)
    (tmp_path / "app.py").write_text(USERS_APP)
    said = run(full / "bin/python", "app.py", cwd=tmp_path, env=env)
    assert said.split() == ["services", "shared", "SagaClient", "Service", "completed"]
