"""What the CLI prints (saga_app.output): plain text into a pipe, rich tables on a terminal,
and in neither an ID cut short or a sender's string read as markup or escape codes."""

from __future__ import annotations

import json
import re

import pytest

from saga_app.output import dump, json_line, plain_table, table, warning

SAGA_ID = "a1133885-e36c-4d95-a6c6-03e27679fa51"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_a_plain_table_is_columns_under_a_line_of_dashes() -> None:
    text = plain_table(("a", "bb"), [(1, None), ("long", "")])

    assert text.splitlines() == ["a     bb", "----- --", "1     -", "long  -"]


def test_a_plain_table_has_no_colour_no_box_drawing_and_cuts_nothing() -> None:
    long_id = "order-" + "x" * 400
    text = plain_table(("saga_id", "order_id", "status"), [(SAGA_ID, long_id, "completed")])

    assert text.isascii() and "\x1b" not in text
    assert text.splitlines()[2].split() == [SAGA_ID, long_id, "completed"]
    assert "…" not in text


def test_a_cell_is_one_line_and_what_a_sender_wrote_stays_text() -> None:
    reason = "line one\nline two [bold]loud[/] \x1b[31mred\r"
    text = plain_table(("id", "reason"), [("m-1", reason)])

    assert text.splitlines()[2:] == ["m-1  line one\\nline two [bold]loud[/] \\x1b[31mred\\r"]
    assert "\x1b" not in text and "\r" not in text


def test_a_titled_table_is_indented_under_its_title_and_an_empty_one_says_none() -> None:
    assert plain_table(("k",), [("v",)], title="things (1)").splitlines() == [
        "things (1)", "  k", "  -", "  v",
    ]  # fmt: skip
    assert plain_table([], [], title="things (0)") == "things (0)\n  (none)"
    assert plain_table(("a", "b"), []).splitlines() == ["a  b", "-- -"]


def test_into_a_pipe_a_table_is_the_plain_one(capsys: pytest.CaptureFixture[str]) -> None:
    table(("saga_id", "status"), [(SAGA_ID, "needs_human")])

    assert (
        capsys.readouterr().out
        == plain_table(("saga_id", "status"), [(SAGA_ID, "needs_human")]) + "\n"
    )


def test_on_a_terminal_a_table_is_coloured_and_folds_an_id_rather_than_cut_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: a terminal, whatever stdout is
    monkeypatch.setenv("COLUMNS", "20")
    monkeypatch.delenv("NO_COLOR", raising=False)

    table(("saga_id",), [(SAGA_ID,)])

    out = capsys.readouterr().out
    assert ANSI.search(out)
    head, rule, *cells = [line.strip() for line in ANSI.sub("", out).splitlines()]
    assert head == "saga_id" and set(rule) == {"─"}
    assert "…" not in out and len(cells) > 1
    assert "".join(cells) == SAGA_ID


def test_a_warning_is_plain_into_a_pipe(capsys: pytest.CaptureFixture[str]) -> None:
    warning("WARNING: applied twice\x07")

    assert capsys.readouterr().out == "WARNING: applied twice\\x07\n"


def test_json_is_indented_for_dump_and_one_line_for_a_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    value = {"saga_id": SAGA_ID, "n": [1, 2]}

    dump(value)

    out = capsys.readouterr().out
    assert json.loads(out) == value and "\n  " in out
    assert json.loads(json_line(value)) == value and "\n" not in json_line(value)
