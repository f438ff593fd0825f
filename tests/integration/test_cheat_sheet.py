"""The first tutorial's cheat sheet (docs/tutorials/first-saga.md), run line by line as
written, against a running stack: every command ends as the comment beside it says, and the
sagas end as the story says."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from saga_app.stack import Stack
from saga_shared.config import Settings
from tests.integration.helpers import saga_env, terminal
from tests.ports import free_port

PAGE = Path(__file__).resolve().parents[2] / "docs/tutorials/first-saga.md"
START = "```sh\n. .venv/bin/activate; export SAGA_SECRETS_DIR"


def cheat_sheet() -> list[str]:
    """The block's commands, continuation lines joined, the set-up line and comments left out
    (the test sets up its own environment)."""
    text = PAGE.read_text(encoding="utf-8")
    block = text[text.index(START) : text.index("```\n", text.index(START) + 5)]
    joined = re.sub(r"\\\n\s*", " ", block).splitlines()[2:]
    return [line for line in joined if line.strip() and not line.lstrip().startswith("#")]


async def run_line(line: str, env: dict[str, str], cwd: Path) -> tuple[int | None, str]:
    forever = "runs until Ctrl-C" in line
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", line, env=env, cwd=cwd, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    if not forever:
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        return proc.returncode, (out + err).decode()
    await asyncio.sleep(4)
    still = proc.returncode is None
    os.killpg(proc.pid, signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return (None if still else proc.returncode), (out + err).decode()


@pytest.mark.timeout(400)
async def test_every_line_of_the_cheat_sheet_works_as_written(
    stack: Stack, settings: Settings, tmp_path: Path
) -> None:
    lines = cheat_sheet()
    assert len(lines) >= 30
    env = {
        **saga_env(settings), "SAGA_PEOPLE": "ana", "SAGA_LOG_LEVEL": "WARNING",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SAGA_PAYMENTS_API_BIND": f"127.0.0.1:{free_port()}", "SAGA_METRICS_BIND": "off",
    }  # fmt: skip
    env.pop("SAGA_SECRETS_DIR", None)
    for line in lines:
        print(line[:60], flush=True)  # which line, when one hangs (pytest shows it on failure)
        code, said = await run_line(line, env, tmp_path)
        expected = None if "runs until Ctrl-C" in line else 4 if "exits 4" in line else 0
        assert code == expected, f"{line}\n-> {code}: {said[-2000:]}"

    ends = {sid: (await terminal(stack, sid)).status for sid in ("s-A17", "s-A18", "s-A19")}
    ends |= {sid: (await terminal(stack, sid)).status for sid in ("s-A20", "s-A21", "s-A22")}
    assert ends == {
        "s-A17": "completed", "s-A18": "compensated", "s-A19": "resolved",
        "s-A20": "completed", "s-A21": "compensated", "s-A22": "compensated",
    }  # fmt: skip
    assert (tmp_path / "warehouse" / "service.py").exists()
    assert (tmp_path / "schemas" / "asyncapi.json").exists()
