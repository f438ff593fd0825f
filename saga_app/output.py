"""What the ``saga`` commands print: JSON for scripts (``--json``), tables for people.

One module decides how output looks, so that no command looks different and none surprises a
script. On a terminal a table is drawn by rich, in colour, folded to the terminal's width. Into
a pipe or a file it is plain text: no colour, no box-drawing characters, columns two spaces apart
under a line of dashes, one line per row, every cell whole (an ID is never cut to fit a width).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from saga_shared.model.text import clean

# Only a line of dashes under the head: what `awk`, `cut` and `column` read without surprise.
PLAIN = box.Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)
EMPTY = "-"
_GOOD, _UNDONE, _BAD, _MOVING = "green", "yellow", "bold red", "cyan"
_STYLES = {
    **dict.fromkeys(("completed", "resolved", "done", "replayed"), _GOOD),
    **dict.fromkeys(("compensated", "discarded"), _UNDONE),
    **dict.fromkeys(("needs_human", "dead", "failed", "compensation_failed", "blocked"), _BAD),
    **dict.fromkeys(("running", "compensating", "waiting", "awaiting_approval"), _MOVING),
}
Rows = Sequence[Sequence[Any]]


def dump(value: Any) -> None:
    """``--json``: the value as indented JSON (dates and the like as their text)."""
    click.echo(json.dumps(value, indent=2, default=str))


def json_line(value: Any) -> str:
    """One JSON value on one line, for a stream of them (``saga watch --json``)."""
    return json.dumps(value, default=str)


def table(headers: Sequence[str], rows: Rows, *, title: str | None = None) -> None:
    """Print a table; under a ``title`` (then indented), an empty one says ``(none)``."""
    console = Console(highlight=False)
    if console.is_terminal:
        console.print(_terminal_table(headers, rows, title))
    else:
        click.echo(plain_table(headers, rows, title=title))


def warning(text: str) -> None:
    """A line a person must not miss (on stdout, with the output it is about)."""
    console = Console(highlight=False)
    if console.is_terminal:
        console.print(Text(clean(text, 100_000), style=_BAD))
    else:
        click.echo(clean(text, 100_000))


def plain_table(headers: Sequence[str], rows: Rows, *, title: str | None = None) -> str:
    """The table as a pipe or a file gets it."""
    if title is not None and not rows:
        return f"{title}\n  (none)"
    drawn = Table(box=PLAIN, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for header in headers:
        drawn.add_column(Text(_one_line(header)), no_wrap=True)
    for row in rows:
        drawn.add_row(*(Text(_one_line(_cell(v))) for v in row))
    # As wide as the widest row, so that rich never has a reason to wrap or cut a cell.
    width = 2 * len(headers) + sum(
        max([len(_one_line(h)), *(len(_one_line(_cell(r[i]))) for r in rows)])
        for i, h in enumerate(headers)
    )
    buffer = io.StringIO()
    Console(file=buffer, width=max(width, 80), color_system=None, highlight=False).print(drawn)
    lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
    if title is None:
        return "\n".join(lines)
    return "\n".join([title, *("  " + line for line in lines)])


def _terminal_table(headers: Sequence[str], rows: Rows, title: str | None) -> Table | Text:
    if title is not None and not rows:
        return Text(f"{title}\n  (none)")
    drawn = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        header_style="bold",
        title=title,
        title_justify="left",
        title_style="bold",
    )
    for header in headers:
        drawn.add_column(Text(clean(header)), overflow="fold")
    for row in rows:
        drawn.add_row(*(_styled(_cell(v)) for v in row))
    return drawn


def _cell(value: Any) -> str:
    """A value as a cell: nothing is ``-``; control characters a sender chose are escaped (a
    string printed on a terminal must not be able to rewrite what an operator sees)."""
    return EMPTY if value is None or value == "" else clean(str(value), 100_000)


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def _styled(text: str) -> Text:
    if text == EMPTY:
        return Text(text, style="dim")
    return Text(text, style=_STYLES.get(text, ""))
