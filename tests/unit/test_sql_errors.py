"""Which database errors hold a message for a retry, and which are the message's own fault."""

from __future__ import annotations

import asyncpg
from asyncpg.exceptions import _base

from saga_shared.storage.sql import is_transient


def test_a_connection_the_server_dropped_is_retried_not_requeued() -> None:
    dropped = _base.InternalClientError(
        "cannot switch to state 15; another operation (2) is in progress"
    )
    assert is_transient(dropped)
    assert is_transient(ConnectionRefusedError(111, "Connection refused"))
    assert is_transient(asyncpg.CannotConnectNowError("the database system is shutting down"))


def test_a_value_the_database_refuses_is_never_transient() -> None:
    assert not is_transient(asyncpg.exceptions.NumericValueOutOfRangeError("out of range"))
    assert not is_transient(asyncpg.exceptions.UndefinedTableError("no such table"))
