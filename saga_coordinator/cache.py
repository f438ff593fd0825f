"""The registers this process wrote last, so that reading one back costs neither its text nor
its parse.

A saga's messages come back to the coordinator that wrote its register (its partition's
single consumer), so most claims read a register this process wrote a moment ago: 2.5 kB
turned to text by the database, sent, and parsed again. Each entry is kept with its row
version (Postgres's ``xmin``, the transaction that wrote the row); the claim sends the version
it holds, and the database sends the register only when the row has another. Any other writer
(another coordinator after a takeover, an operator's SQL) makes a new row version, so a stale
entry is never served; the only writer that could leave the version as it was is a second
statement of the same transaction, and a transaction that runs one (``waiting_for``) caches
nothing of that order.

Entries are filled at commit only (a rolled-back write never shows), bounded (least recently
used go first), and dropped when their saga ends: few messages come after that.

Orders are kept alike, with their row's version and the view the processor left them in: with
both an order and its saga held, a group is decided without reading anything and written in
one statement that holds the database to those versions (``saga_coordinator.guarded``)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

from saga_coordinator.convoy import OrderView
from saga_coordinator.register import TERMINAL, SagaState

CAPACITY = 4096  # at a few kB each in Python objects: a few tens of MB at most
V = TypeVar("V")


class _Recent(Generic[V]):
    """Entries by key, at most ``capacity``: the least recently used go first."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, tuple[str, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> tuple[str, V] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, version: str, value: V) -> None:
        self._entries[key] = (version, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)


class RegisterCache:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._sagas: _Recent[SagaState] = _Recent(capacity)
        self._orders: _Recent[OrderView] = _Recent(capacity)

    def __len__(self) -> int:
        return len(self._sagas)

    def get(self, saga_id: str) -> tuple[str, SagaState] | None:
        """The version and register held for ``saga_id``, or None."""
        return self._sagas.get(saga_id)

    def put(self, version: str, state: SagaState) -> None:
        """``state`` as the database holds it at ``version``, once its transaction committed."""
        if state.status in TERMINAL:
            self._sagas.forget(state.saga_id)
        else:
            self._sagas.put(state.saga_id, version, state)

    def forget(self, saga_id: str) -> None:
        self._sagas.forget(saga_id)

    def order(self, order_id: str) -> tuple[str, OrderView] | None:
        """The version of the order's row and the view held for it, or None."""
        return self._orders.get(order_id)

    def put_order(self, version: str, order: OrderView) -> None:
        self._orders.put(order.order_id, version, order)

    def forget_order(self, order_id: str) -> None:
        self._orders.forget(order_id)
