"""Console accounts: hashed passwords, a file that is either understood or refused, and where
a person may be sent after signing in."""

from __future__ import annotations

from pathlib import Path

import pytest

from saga_app.console.accounts import Accounts, hash_password, with_account
from saga_app.console.web import local_path
from saga_shared.errors import ConfigError


def test_a_password_is_kept_only_as_a_salted_hash(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    with_account(path, "ana", "operator", "correct horse")
    text = path.read_text()
    assert "correct horse" not in text and "scrypt$" in text
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner only
    accounts = Accounts.read(str(path))
    assert accounts.check("ana", "correct horse") == accounts.by_name["ana"]
    assert accounts.check("ana", "correct horsE") is None
    assert accounts.check("bob", "correct horse") is None
    assert accounts.check("ana", "x" * 5000) is None
    assert hash_password("same") != hash_password("same")  # a salt of its own each time


def test_changing_one_account_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    with_account(path, "ana", "operator", "one")
    with_account(path, "vic", "viewer", "two")
    with_account(path, "ana", "viewer", "three")
    accounts = Accounts.read(str(path))
    assert {n: a.role for n, a in accounts.by_name.items()} == {"ana": "viewer", "vic": "viewer"}
    assert accounts.check("ana", "three") and accounts.check("vic", "two")
    assert accounts.check("ana", "one") is None


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("not toml [", "cannot read"),
        ("", "no [users.NAME] tables"),
        ('[users.ana]\nrole = "admin"\npassword = "scrypt$1"', "role must be one of"),
        ('[users.ana]\nrole = "viewer"\npassword = "hunter2"', "a hash from `saga console-user`"),
        ('[users."a b"]\nrole = "viewer"\npassword = "scrypt$1"', "a name is"),
        ("users = 3", "no [users.NAME] tables"),
        ("[users]\nana = 3", "expected a table"),
    ],
)
def test_an_accounts_file_it_does_not_understand_stops_the_console(
    tmp_path: Path, content: str, said: str
) -> None:
    path = tmp_path / "users.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match="SAGA_CONSOLE_USERS") as raised:
        Accounts.read(str(path))
    assert said in str(raised.value)


def test_no_accounts_file_is_an_error_that_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="saga console-user"):
        Accounts.read("")
    with pytest.raises(ConfigError, match="does not exist"):
        Accounts.read(str(tmp_path / "missing.toml"))


def test_a_malformed_stored_hash_never_signs_anyone_in(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text('[users.ana]\nrole = "operator"\npassword = "scrypt$x$y$z$%%$%%"\n')
    assert Accounts.read(str(path)).check("ana", "") is None


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/people", "/people"),
        ("/sagas?status=needs_human", "/sagas?status=needs_human"),
        ("//evil.example/x", "/sagas"),
        ("https://evil.example/", "/sagas"),
        ("/\\evil.example", "/sagas"),
        ("javascript:alert(1)", "/sagas"),
        ("", "/sagas"),
        (None, "/sagas"),
    ],
)
def test_after_sign_in_only_a_path_of_the_console(target: str | None, expected: str) -> None:
    assert local_path(target) == expected
