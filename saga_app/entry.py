"""The ``saga`` command's entry point. The bare install is the agents' client alone: a command
that needs the ``server`` extra says which install it needs instead of a traceback."""

from __future__ import annotations

import sys
from importlib import metadata

DISTRIBUTION = "reversible-sagas"


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def main() -> None:
    try:
        from saga_app.cli import main as cli
    except ModuleNotFoundError as missing:
        if sys.argv[1:] == ["--version"]:
            print(f"saga, version {version()}")
            return
        sys.exit(
            f"saga: this install is the agents' client only ({missing.name} is missing); "
            f"the CLI needs the server extra: pip install '{DISTRIBUTION}[server]'"
        )
    cli()
