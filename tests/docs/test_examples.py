"""The tutorials' code is files, and those files run: docs/examples/warehouse is what
``saga new adapter warehouse`` writes today (byte for byte), its own test passes, and the
tutorial's tests of its saga (in memory and in the simulation) pass as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from saga_app.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs/examples"


def test_the_tutorials_package_is_what_saga_new_adapter_writes(tmp_path: Path) -> None:
    said = CliRunner().invoke(main, ["new", "adapter", "warehouse", "--dir", str(tmp_path)])
    assert said.exit_code == 0, said.output
    written = {p.name: p.read_bytes() for p in (tmp_path / "warehouse").iterdir()}
    shown = {p.name: p.read_bytes() for p in (EXAMPLES / "warehouse").iterdir() if p.is_file()}
    assert written.keys() == shown.keys()
    for name, content in written.items():
        assert shown[name] == content, f"docs/examples/warehouse/{name} differs: run " + (
            "saga new adapter warehouse --dir docs/examples again (after removing it)"
        )


def test_the_tutorials_tests_pass_as_written(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "docs/examples/warehouse", "docs/examples/warehouse_tests"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(EXAMPLES), "SAGA_TEST_STACK": "memory"},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "\n5 passed" in ran.stdout
