"""The published AsyncAPI document as AsyncAPI tools read it: parsed by the AsyncAPI project's
own parser (`tests/contract`, installed by scripts/test.sh), with no error."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from saga_shared.transport.contract import asyncapi

HERE = Path(__file__).parent.parent / "contract"
COMMITTED = Path(__file__).parents[2] / "schemas" / "asyncapi.json"


def parse(path: Path) -> tuple[int, list[dict[str, object]]]:
    node = shutil.which("node")
    assert node is not None, "node is needed to run the AsyncAPI parser (scripts/test.sh)"
    done = subprocess.run(
        [node, str(HERE / "validate.mjs"), str(path)],
        capture_output=True, text=True, timeout=120, check=False, cwd=HERE,
    )  # fmt: skip
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


def test_the_committed_document_parses_without_an_error() -> None:
    code, diagnostics = parse(COMMITTED)
    errors = [d for d in diagnostics if d["severity"] == 0]
    assert (code, errors) == (0, [])


def test_a_dangling_reference_is_an_error_the_parser_reports(tmp_path: Path) -> None:
    broken = asyncapi()
    broken["components"]["schemas"]["saga.start"]["properties"]["plan"] = {"$ref": "#/$defs/Plan"}
    path = tmp_path / "asyncapi.json"
    path.write_text(json.dumps(broken), encoding="utf-8")
    code, diagnostics = parse(path)
    assert code == 1
    assert any(d["code"] == "invalid-ref" for d in diagnostics)
