"""The documentation cannot drift from the code: the site builds strictly (every link and
anchor resolves, the reference tables are generated from the code), every Python block compiles
and imports only names that exist, and every ``saga`` command shown parses with the CLI as it is
(its command path and its options). The shell examples that change things run against the real
stack in tests/integration/test_cheat_sheet.py, and docs/examples/agent.py runs from the bare
install in tests/packaging."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from saga_app.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```([a-z]*)[^\n]*\n(.*?)^```", re.M | re.S)
OURS = {"saga_shared", "saga_services", "saga_app", "saga_coordinator"}
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def blocks(*languages: str) -> list[tuple[str, str]]:
    """(where, text) of every fenced block in these languages, snippet includes left out."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match.group(1) in languages and "--8<--" not in match.group(2):
                line = text[: match.start()].count("\n") + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", match.group(2)))
    return found


def saga_commands() -> list[tuple[str, list[str]]]:
    """Each ``saga ...`` command of the shell blocks, its arguments as the shell splits them."""
    found = []
    shell = [(w, t, False) for w, t in blocks("sh", "bash", "shell")]
    session = [(w, t, True) for w, t in blocks("", "console")]  # commands after "$ "
    for where, text, prompted in shell + session:
        for line in re.sub(r"\\\n\s*", " ", text).splitlines():
            if prompted and not line.startswith("$ "):
                continue  # what a command printed
            command = line.removeprefix("$ ").split(" | ")[0]
            if not command.startswith(("saga ", "SAGA_")):
                continue
            words = shlex.split(command, comments=True)
            while words and ASSIGNMENT.match(words[0]):
                words.pop(0)
            if words[:1] == ["saga"]:
                found.append((where, words[1:]))
    return found


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", tmp_path],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "reference/cli/index.html").read_text().count("saga dlq replay") >= 1


@pytest.mark.parametrize(("where", "code"), blocks("python", "py"))
def test_every_python_block_compiles_and_imports_what_exists(where: str, code: str) -> None:
    source = code.replace("{...}", "{}").replace("(...)", "()")
    tree = compile(source, where, "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in OURS:
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"
                ), f"{where}: {node.module} has no {alias.name}"


@pytest.mark.parametrize(("where", "args"), saga_commands())
def test_every_saga_command_shown_parses(where: str, args: list[str]) -> None:
    # --help after the arguments: click parses them all (an unknown command or option is a
    # usage error, exit 2) and shows the help instead of running the command.
    if "--help" in args or "-h" in args or "--version" in args:
        args = [a for a in args if a not in ("--help", "-h")]
    said = CliRunner().invoke(main, [*args, "--help"], catch_exceptions=False)
    assert said.exit_code == 0, f"{where}: saga {shlex.join(args)}\n{said.output}"


def test_the_docs_show_many_commands_and_blocks() -> None:
    # The tests above must not pass by finding nothing.
    assert len(saga_commands()) >= 40
    assert len(blocks("python", "py")) >= 1
