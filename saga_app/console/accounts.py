"""Who may sign in to the console: accounts from a TOML file, each a person with a hashed
password and a role (``viewer`` reads, ``operator`` also acts).

    [users.ana]
    role = "operator"
    password = "scrypt$16384$8$1$<salt>$<hash>"   # from `saga console-user ana`

Passwords are hashed with scrypt (the standard library's), each with its own salt, and compared
in constant time; an unknown name costs the same as a wrong password, so timing does not tell
which names exist.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from saga_shared.errors import ConfigError

ConsoleRole = Literal["viewer", "operator"]
ROLES: tuple[ConsoleRole, ...] = ("viewer", "operator")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
# scrypt's cost: about 30-60 ms of one core per sign-in here, 16 MiB of memory.
_N, _R, _P = 2**14, 8, 1
_MAX_PASSWORD = 1024


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    b64 = base64.urlsafe_b64encode
    return f"scrypt${_N}${_R}${_P}${b64(salt).decode()}${b64(digest).decode()}"


def _verify(password: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        expected = base64.urlsafe_b64decode(digest)
        actual = hashlib.scrypt(
            password.encode("utf-8", "surrogatepass"),
            salt=base64.urlsafe_b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
            maxmem=64 * 1024 * 1024,
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


@dataclass(frozen=True)
class Account:
    name: str
    role: ConsoleRole
    password_hash: str

    @property
    def may_act(self) -> bool:
        return self.role == "operator"


_DUMMY = hash_password(secrets.token_urlsafe(16))


@dataclass(frozen=True)
class Accounts:
    by_name: dict[str, Account]

    def check(self, name: str, password: str) -> Account | None:
        """The account when the password is right; None otherwise (slow either way)."""
        account = self.by_name.get(name)
        if len(password) > _MAX_PASSWORD:
            return None
        ok = _verify(password, account.password_hash if account else _DUMMY)
        return account if ok and account is not None else None

    @classmethod
    def read(cls, path: str) -> Accounts:
        """The accounts in ``path`` (``SAGA_CONSOLE_USERS``); a ConfigError names what is
        wrong, so a console never starts with accounts it half understood."""
        if not path:
            raise ConfigError(
                "SAGA_CONSOLE_USERS: no accounts file (create one with "
                "`saga console-user NAME --role operator --file FILE`)"
            )
        try:
            document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"SAGA_CONSOLE_USERS: {path} does not exist") from None
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"SAGA_CONSOLE_USERS: cannot read {path}: {exc}") from None
        users = document.get("users", {})
        if not isinstance(users, dict) or not users:
            raise ConfigError(f"SAGA_CONSOLE_USERS: {path} has no [users.NAME] tables")
        return cls({name: _account(path, name, entry) for name, entry in users.items()})


def _account(path: str, name: str, entry: object) -> Account:
    where = f"SAGA_CONSOLE_USERS: {path}: users.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: a name is 1-64 letters, digits, or _ . @ -")
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a table with role and password")
    role, password = entry.get("role"), entry.get("password")
    if role not in ROLES:
        raise ConfigError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}")
    if not isinstance(password, str) or not password.startswith("scrypt$"):
        raise ConfigError(f"{where}: password must be a hash from `saga console-user`")
    return Account(name, role, password)


def with_account(path: Path, name: str, role: str, password: str) -> None:
    """Add or replace one account in the accounts file (created, readable by its owner only),
    keeping the others as they are."""
    if not _NAME.match(name):
        raise ConfigError("a name is 1-64 letters, digits, or _ . @ -")
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}")
    if not password or len(password) > _MAX_PASSWORD:
        raise ConfigError(f"a password is 1 to {_MAX_PASSWORD} characters")
    accounts = Accounts.read(str(path)).by_name if path.exists() else {}
    accounts = {**accounts, name: Account(name, role, hash_password(password))}
    text = "".join(
        f'[users."{a.name}"]\nrole = "{a.role}"\npassword = "{a.password_hash}"\n\n'
        for a in accounts.values()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(text, encoding="utf-8")
