"""Every `saga` command, started as a person would start it with something wrong: a URL that is
not one, a URL where nothing listens, a URL with a control character; an unknown option, a
missing argument, a number of 10,000 digits, a value with control characters. Each ends within
seconds, says what is wrong in one line on stderr and never shows a traceback.

The commands come from the click group, so a new one is covered without editing this file: its
required parameters get plausible values, and it is assumed to need the broker and the database
(say otherwise in NEEDS)."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import click
import pytest

from saga_app.cli import main
from saga_app.stack import Stack
from saga_shared.config import Settings
from tests.integration.helpers import saga_env

ROOT = Path(__file__).resolve().parents[2]
HUGE = "9" * 10_000
# A NUL cannot be passed at all (execve refuses it in arguments and in the environment): the
# nearest a person gets is a pasted control character.
CONTROL = "x\x01\x1b[2Jy"
NO_BROKER = "amqp://guest:guest@127.0.0.1:1/"
NO_DATABASE = "postgresql://postgres@127.0.0.1:1/saga"
LIMIT_S = 20.0
SETTLE_S = 5.0  # a command that runs until stopped is stopped (SIGTERM) after this long

# Not a URL, and a URL with control characters, in one process: the one line names both.
MALFORMED = (("SAGA_AMQP_URL", "notaurl"), ("SAGA_DATABASE_URL", "postgresql://db/saga\x07\n"))
UNREACHABLE = {"amqp": ("SAGA_AMQP_URL", NO_BROKER), "db": ("SAGA_DATABASE_URL", NO_DATABASE)}
# What a command needs: "settings" alone (it reads them, connects nowhere), or the broker and
# the database it connects to (which imply the settings). Absent: it needs both.
NEEDS: dict[str, set[str]] = {
    "check": {"settings"},
    "console-user": set(),
    "declare": {"amqp"},
    "dlq list": {"db"},
    "dlq replay": {"amqp"},
    "dlq show": {"db"},
    "effects": {"db"},
    "faults add": {"db"},
    "faults clear": {"db"},
    "faults list": {"db"},
    "list": {"db"},
    "mcp": {"amqp"},
    "migrate": {"db"},
    "new adapter": set(),
    "rejections": {"db"},
    "schema export": set(),
    "setup": {"db"},  # pointed below at a database administrator URL where nothing listens
    "show": {"db"},
    "start": {"amqp"},
    "tls": set(),
    "watch": {"amqp"},
}
FOREVER = {"run", "watch", "mcp"}  # they serve until stopped when what they need is there
# Values that take a command as far as its broker or database ("{tmp}": a directory of the
# case's own). Nothing here may change anything outside the test's namespace and database.
VALUES: dict[str, dict[str, str | bool]] = {
    "console-user": {"generate": True},
    "demo": {"wait_s": "5"},
    "dlq discard": {"reason": "x", "yes": True},
    "dlq replay": {"dead_letter_id": "1"},
    "faults add": {"action": "erp.create_credit_note", "order_id": "X-bad", "mode": "permanent"},
    "faults clear": {"order_id": "X-bad"},
    "new adapter": {"name": "shop_x", "into": "{tmp}"},
    "run": {"components": "coordinator"},
    "schema export": {"out_dir": "{tmp}/schemas"},
    "settle": {"happened": True},
    "setup": {
        "method": "file",
        "definitions_out": "{tmp}/definitions.json",
        "secrets_dir": "{tmp}/secrets",
        "database_admin_url": NO_DATABASE,
    },
    "show": {"saga_id": "no-such-saga"},
    "start": {"saga": "refund", "order_id": "X-bad", "params": "sku=S"},
    "tls": {"directory": "{tmp}/tls"},
}


@dataclass(frozen=True)
class Case:
    command: str
    kind: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    # "fails": a non-zero exit; "usage": exit 2 (a usage error); "any": whatever it does, with
    # no traceback; "waits": it waits for what it cannot reach, and says so, until stopped;
    # "help": its help, whatever the environment holds.
    expect: str = "fails"

    def __str__(self) -> str:
        return f"saga {self.command} ({self.kind})"


@dataclass(frozen=True)
class Ended:
    code: int | None
    out: str
    err: str
    seconds: float
    stopped: bool  # it was still running after SETTLE_S and was sent SIGTERM


def commands(group: click.Group = main, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def sample(param: click.Parameter) -> str:
    kind = param.type
    if isinstance(kind, click.Choice):
        return str(kind.choices[0])
    if isinstance(kind, click.types.IntParamType | click.types.FloatParamType):
        return "1"
    if isinstance(kind, click.Path):
        return f"{{tmp}}/{param.name}"
    return "x"


def argv(
    name: str, command: click.Command, changed: dict[str, str | bool] | None = None
) -> tuple[str, ...]:
    """The command line: VALUES, then ``changed``, then a sample for each required parameter
    left; arguments in their order, then the options."""
    values = {**VALUES.get(name, {}), **(changed or {})}
    positional: list[str] = []
    options: list[str] = []
    for param in command.params:
        value = values.get(param.name or "")
        if value is None and param.required:
            value = sample(param)
        if value is None or value is False:
            continue
        if isinstance(param, click.Argument):
            positional.append(str(value))
        elif value is True:
            options.append(param.opts[0])
        else:
            options += [param.opts[0], str(value)]
    return (*name.split(), *positional, *options)


def first(command: click.Command, kinds: tuple[type[object], ...]) -> str | None:
    for param in command.params:
        if isinstance(param.type, kinds) and not isinstance(param.type, click.Choice):
            return param.name
    return None


def cases_of(name: str, command: click.Command) -> Iterator[Case]:
    """Bad URLs: malformed ones, and nothing listening where the command connects (it has no
    reason to touch the others); then the bad arguments that apply to its parameters."""
    needs = NEEDS.get(name, {"amqp", "db"})
    args = argv(name, command)
    yield Case(name, "malformed urls", args, MALFORMED, "fails" if needs else "any")
    for service in sorted(needs & UNREACHABLE.keys()):
        # `saga run` waits by design: a supervisor need not restart it in a loop
        expect = "waits" if name == "run" else "fails"
        yield Case(name, f"nothing listening ({service})", args, (UNREACHABLE[service],), expect)
    text = first(command, (click.types.StringParamType,))
    if text is not None:
        yield Case(name, "control characters", argv(name, command, {text: CONTROL}), (), "any")
    number = first(command, (click.types.IntParamType, click.types.FloatParamType))
    if number is not None:
        huge = argv(name, command, {number: HUGE})
        yield Case(name, "10,000-digit number", huge, (), "usage")
    elif any(p.required for p in command.params):
        yield Case(name, "missing argument", tuple(name.split()), (), "usage")
    else:
        yield Case(name, "unknown option", (*args, "--no-such-option"), (), "usage")


def every_case() -> list[Case]:
    found = [case for name, command in commands() for case in cases_of(name, command)]
    amqp_control = (("SAGA_AMQP_URL", "amqp://h/\x1b[2J"),)
    group = (
        Case("list", "database not a url", ("list",), (("SAGA_DATABASE_URL", "notaurl"),)),
        Case("list", "amqp url with a control character", ("list",), amqp_control),
        Case("list", "--help with a bad url", ("list", "--help"), MALFORMED, "help"),
        Case("dlq list", "--help with a bad url", ("dlq", "list", "--help"), MALFORMED, "help"),
        Case("dlq", "no command", ("dlq",), (), "help"),
        Case("", "unknown option", ("--no-such-option", "list"), (), "usage"),
        Case("dlq", "unknown option", ("dlq", "--no-such-option", "list"), (), "usage"),
        Case("show", "unknown option", ("show", "x", "--no-such-option"), (), "usage"),
        Case("faults add", "unknown option", ("faults", "add", "--no-such-option"), (), "usage"),
        Case("", "bad log level", ("--log-level", "bogus", "list"), (), "usage"),
        Case("", "bad log level from the environment", ("list",),
             (("SAGA_LOG_LEVEL", "bogus"),)),  # a bad setting: one line naming it, exit 1
        Case("", "10,000-digit partitions", ("--partitions", HUGE, "list"), (), "usage"),
        Case("", "10,000-digit partitions from the environment", ("list",),
             (("SAGA_PARTITIONS", HUGE),)),
    )  # fmt: skip
    return [*found, *group]


async def start(case: Case, env: dict[str, str], tmp: Path) -> Ended:
    args = [a.replace("{tmp}", str(tmp)) for a in case.args]
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_app.cli", *args,
        env={**env, **dict(case.env)}, cwd=tmp, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    settle = SETTLE_S if case.command.split(" ")[0] in FOREVER else LIMIT_S
    talk = asyncio.ensure_future(proc.communicate())
    done, _ = await asyncio.wait([talk], timeout=settle)
    stopped = not done
    if stopped:
        proc.send_signal(signal.SIGTERM)
        done, _ = await asyncio.wait([talk], timeout=LIMIT_S - settle)
    if not done:
        proc.kill()
    out, err = await talk
    code = proc.returncode if done else None
    decoded = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    return Ended(code, *decoded, time.monotonic() - began, stopped)


def problems(case: Case, ended: Ended) -> list[str]:
    """What is wrong with how the command ended; nothing when it behaved."""
    said = ended.out + ended.err
    wrong = []
    if ended.code is None:
        wrong.append(f"still running after {LIMIT_S:.0f} s, even after SIGTERM")
    if "Traceback" in said:
        wrong.append("a traceback")
    if "\x1b" in said or "\x01" in said:
        wrong.append("a raw control character in its output")
    errors = [
        line for line in ended.err.splitlines()
        if line.strip() and not line.startswith(("Usage:", "Try '"))
    ]  # fmt: skip
    if ended.stopped:
        if case.expect == "waits":
            if "waiting for the broker and the database" not in ended.err:
                wrong.append("it waits without saying for what")
        elif case.expect == "fails":
            wrong.append(f"still running after {SETTLE_S:.0f} s: it should have given up")
        return wrong
    if case.expect == "waits":
        wrong.append(f"it ended ({ended.code}) instead of waiting")
    if case.expect == "help":
        if "Usage:" not in said or "Options:" not in said:
            wrong.append("no help shown")
        return wrong
    if case.expect == "usage" and ended.code != 2:
        wrong.append(f"exit {ended.code}, not 2 (a usage error)")
    if case.expect == "fails" and ended.code == 0:
        wrong.append("exit 0")
    if ended.code not in (0, None) and len(errors) != 1:
        wrong.append(f"{len(errors)} lines of error, not one")
    if case.env == MALFORMED and ended.code not in (0, None):
        wrong += [f"{name} not named" for name, _ in MALFORMED if name not in ended.err]
    return wrong


@pytest.mark.timeout(300)
async def test_every_command_refuses_bad_input_in_one_line_without_a_traceback(
    stack: Stack, settings: Settings, tmp_path: Path
) -> None:
    # A stack is running, as it is when a person mistypes: a command that needs only the
    # broker gets its answer instead of waiting for a coordinator that is not there.
    env = {
        **saga_env(settings), "SAGA_METRICS_BIND": "off", "SAGA_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT), "NO_COLOR": "1",
    }  # fmt: skip
    env.pop("SAGA_CONSOLE_USERS", None)
    cases = every_case()
    assert {c.command for c in cases} >= {"start", "dlq replay", "faults add", "new adapter"}
    running = asyncio.Semaphore(2)  # two cores, shared with whoever else works here

    async def one(number: int, case: Case) -> tuple[Case, Ended]:
        async with running:
            tmp = tmp_path / str(number)
            tmp.mkdir()
            return case, await start(case, env, tmp)

    began = time.monotonic()
    ended = await asyncio.gather(*(one(n, c) for n, c in enumerate(cases)))
    took = time.monotonic() - began

    report = [
        f"{case}: {'; '.join(wrong)}\n    stderr: {end.err.strip()[-600:]!r}"
        for case, end in ended
        if (wrong := problems(case, end))
    ]
    assert not report, f"{len(report)} of {len(cases)} cases:\n" + "\n".join(report)
    slowest = max(ended, key=lambda pair: pair[1].seconds)
    print(f"{len(cases)} cases in {took:.0f} s; slowest {slowest[0]} {slowest[1].seconds:.1f} s")


async def test_a_database_no_migration_ran_on_says_run_saga_migrate(settings: Settings) -> None:
    """A `SAGA_DATABASE_URL` naming a database that exists but holds no tables (created by
    hand, `saga migrate` never run): each reading command says what to run, where it said
    "UndefinedTableError: relation "sagas" does not exist"."""
    parts = urlsplit(settings.database_url)
    name = f"empty_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(urlunsplit(parts._replace(path="/postgres")))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        empty = urlunsplit(parts._replace(path=f"/{name}"))
        env = {**saga_env(settings), "SAGA_DATABASE_URL": empty, "NO_COLOR": "1"}
        for args in (["list"], ["dlq", "list"], ["show", "s-1"], ["rejections"]):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "saga_app.cli", *args, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, err = await asyncio.wait_for(proc.communicate(), LIMIT_S)
            lines = [line for line in err.decode().splitlines() if line.strip()]
            assert (proc.returncode, len(lines)) == (1, 1), (args, err.decode())
            assert "run `saga migrate`" in lines[0] and name in lines[0], (args, lines)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
