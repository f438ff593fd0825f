"""A seeded generator of hostile messages: valid commands and outcomes, then mutated as a careless
or hostile client would (broken bytes, hostile values in every field, wrong types, deep nesting,
huge numbers, control characters, forged senders, wrong routing keys, odd headers).

Each shot carries its own AMQP message-id (``fz-<run>-<n>``), so the test can find what became of
it: a rejection, a dead letter, or a message the coordinator handled.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from saga_shared.transport.topology import partition_of
from tests.integration.helpers import REFUND

# Values a careless or hostile sender puts anywhere. Sentinels become JSON that json.dumps
# cannot write (NaN, deep nesting, huge numbers) by text substitution.
NAN, INF, DEEP, HUGE_INT = "\x01NaN\x01", "\x01Inf\x01", "\x01Deep\x01", "\x01Huge\x01"
HOSTILE: tuple[Any, ...] = (
    "", " ", "\x00", "a\x00b", "\ud800", "\udfff tail", "\x1b[2J\x1b[H", "\x9b31m", "\x07",
    "'; DROP TABLE sagas; --", "Robert'); DELETE FROM inbox;--", "../../etc/passwd", "%s%s%n",
    "x" * 300, "y" * 70_000, "😀" * 50, "\u202etxt.exe", "café", "line\nbreak",
    0, -1, 1, 2**31, 2**31 - 1, -(2**31) - 1, 2**63, 10**30, -(10**30), 1e308, -0.0, 1e-320,
    True, False, None, [], {}, [1, [2, [3]]], {"a": {"b": {"c": "d"}}},
    NAN, INF, DEEP, HUGE_INT,
)  # fmt: skip
COMMAND_TYPES = ("saga.start", "saga.abort", "saga.resume", "saga.resolve", "saga.approve",
                 "saga.reject", "dlq.replay", "dlq.discard")  # fmt: skip
# What an agent may publish under: other keys are refused by the broker's topic permissions.
AGENT_KEYS = ("saga.start", "saga.abort", "saga.status")
INVENTORY_ACTIONS = ("inventory.reserve_stock", "inventory.release_stock")
OTHER_ACTIONS = ("erp.create_credit_note", "payments.charge_card", "email.send_customer_email")


@dataclass(frozen=True)
class Shot:
    index: int
    target: Literal["commands", "partitions"]
    routing_key: str
    body: bytes
    message_id: str
    headers: dict[str, Any] = field(default_factory=dict)
    mutation: str = "none"


class Fuzzer:
    """``Fuzzer(seed, run, orders).shots(n)``: ``n`` shots, the same for the same seed."""

    def __init__(self, seed: int, run: str, orders: list[str], partitions: int) -> None:
        self.rng = random.Random(seed)
        self.run = run
        self.orders = orders
        self.partitions = partitions
        self.reply_to = ""  # the fuzzer's reply queue, set by the test

    def shots(self, count: int) -> Iterator[Shot]:
        for index in range(count):
            if self.rng.random() < 0.25:
                yield self._outcome(index)
            else:
                yield self._command(index)

    # --- bases ---------------------------------------------------------------------------------
    def _ids(self) -> dict[str, Any]:
        order = self.rng.choice(self.orders)
        return {
            "message_id": f"m{self.rng.randrange(10**12)}",
            "saga_id": f"{order}-s{self.rng.randrange(4)}",
            "order_id": order,
        }

    def _command(self, index: int) -> Shot:
        # (no status queries: an answered query leaves no trace to count it by)
        kind = self.rng.choice(("saga.start",) * 4 + ("saga.abort",) + COMMAND_TYPES)
        body: dict[str, Any] = {"type": kind, **self._ids(), "reply_to": self.reply_to}
        if kind == "saga.start":
            if self.rng.random() < 0.8:
                body |= {"saga": "refund", "params": dict(REFUND)}
            else:
                steps = self.rng.sample(
                    ["inventory.reserve_stock", "erp.create_credit_note", "email.send_confirmation",
                     "erp.validate_address", "payments.charge_card"], k=self.rng.randint(1, 3),
                )  # fmt: skip
                body |= {"plan": {"steps": [{"action": s} for s in steps]}, "params": dict(REFUND)}
        elif kind in ("saga.abort", "saga.reject"):
            body["reason"] = "changed my mind"
        elif kind in ("saga.resolve", "saga.approve", "saga.resume"):
            body["note"] = "done"
        elif kind == "dlq.replay":
            body = {"type": kind, "message_id": body["message_id"], "all": True}
        elif kind == "dlq.discard":
            body = {"type": kind, "message_id": body["message_id"], "dead_letter_id": 1,
                    "reason": "x"}  # fmt: skip
        key = kind if kind in AGENT_KEYS else "saga.start"
        if self.rng.random() < 0.6:  # mostly as the client sends them: to the order's partition
            key = f"{key}.{partition_of(str(body.get('order_id') or ''), self.partitions)}"
        return self._mutate(index, "commands", key, body)

    def _outcome(self, index: int) -> Shot:
        """An adapter's answer, sent from the inventory's account: for its own actions it may be
        believed (about sagas that do not exist); for another service's, it is a forgery."""
        action = self.rng.choice(INVENTORY_ACTIONS + OTHER_ACTIONS)
        ids = self._ids() | {"saga_id": f"fz-nosaga-{self.rng.randrange(10**6)}"}
        body: dict[str, Any] = {
            "type": self.rng.choice(("action.done", "action.failed")), **ids, "action": action,
            "phase": "forward", "step": 0, "idempotency_key": f"{ids['saga_id']}:{action}",
            "attempt": 1,
        }  # fmt: skip
        if body["type"] == "action.done":
            body["result"] = {"reservation_id": f"r-{self.rng.randrange(10**6)}"}
        else:
            body |= {"reason": "no stock", "effect_unknown": False}
        key = str(self.rng.randrange(self.partitions))  # the test reroutes it to its order
        return self._mutate(index, "partitions", key, body)

    # --- mutations -----------------------------------------------------------------------------
    def _mutate(
        self, index: int, target: Literal["commands", "partitions"], key: str,
        body: dict[str, Any],
    ) -> Shot:  # fmt: skip
        mutation = self.rng.choice(MUTATIONS)
        headers: dict[str, Any] = {}
        raw: bytes | None = None
        if mutation == "value":
            self._poke(body, self.rng.choice(HOSTILE))
        elif mutation == "param" and isinstance(body.get("params"), dict):
            body["params"][self.rng.choice([*body["params"], "extra"])] = self.rng.choice(HOSTILE)
        elif mutation == "drop" and len(body) > 1:
            del body[self.rng.choice(list(body))]
        elif mutation == "extra":
            body[self.rng.choice(["by", "by_kind", "sender", "seq", "colour", "\u0000k"])] = (
                {"user": "ana", "role": "person"} if self.rng.random() < 0.3 else "person"
            )
        elif mutation == "retype":
            choices = [t for t in (*COMMAND_TYPES, "action.done", "saga.deadline", "x.y") if t]
            body["type"] = self.rng.choice(choices)
        elif mutation == "ids":
            body[self.rng.choice(["message_id", "saga_id", "order_id"])] = self.rng.choice(HOSTILE)
        elif mutation == "reply_to":
            body["reply_to"] = self.rng.choice(["saga.intake", "r.partition.0", "\x00", "a b", ""])
        elif mutation == "routing_key" and target == "commands":
            # a key the broker refuses, or one that does not match the command's type
            key = self.rng.choice((*AGENT_KEYS, "saga.resolve", "dlq.replay", "#", "x"))
        elif mutation == "headers":
            headers = self.rng.choice([
                {"x-replay-of": self.rng.choice(["1", "999999999", "x", "9" * 40])},
                {"x-order-id": self.rng.choice(self.orders)},
                {"x-delivery-count": 99},
                {"x-death": [{"reason": "forged", "queue": "nowhere", "count": -1}]},
                {"deep": _nested(40)},
                {"big": "h" * 30_000},
            ])  # fmt: skip
        elif mutation == "bytes":
            raw = self._garble(_encode(body))
        elif mutation == "oversized":
            body["padding"] = "p" * 300_000
        if body.get("type") == "saga.status":
            body["type"] = "saga.start"  # an answered status query leaves no trace to count
        message_id = f"fz-{self.run}-{index}"
        data = raw if raw is not None else _encode(body, ascii=self.rng.random() < 0.5)
        return Shot(index, target, key, data, message_id, headers, mutation)

    def _poke(self, body: dict[str, Any], value: Any) -> None:
        """Put ``value`` somewhere in the body, nested objects included."""
        place: Any = body
        while True:
            key = self.rng.choice(list(place))
            if isinstance(place[key], dict) and place[key] and self.rng.random() < 0.6:
                place = place[key]
                continue
            place[key] = value
            return

    def _garble(self, data: bytes) -> bytes:
        how = self.rng.randrange(5)
        if how == 0:
            return data[: self.rng.randrange(max(1, len(data)))]
        if how == 1:
            out = bytearray(data)
            for _ in range(self.rng.randint(1, 5)):
                out[self.rng.randrange(len(out))] = self.rng.randrange(256)
            return bytes(out)
        if how == 2:
            return self.rng.randbytes(self.rng.randint(0, 300))
        if how == 3:
            return b"\xef\xbb\xbf" + data  # a byte-order mark
        return data.replace(b'"type"', b'"type": "x", "type"', 1)  # a duplicate key


MUTATIONS = ("none", "none", "value", "value", "param", "drop", "extra", "retype", "ids",
             "reply_to", "routing_key", "headers", "bytes", "bytes", "oversized")  # fmt: skip


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"n": value}
    return value


def _encode(body: dict[str, Any], *, ascii: bool = True) -> bytes:
    """JSON as a sender would write it: with ``ascii``, lone surrogates travel as \\ud800
    escapes; without, as the invalid UTF-8 bytes a broken encoder writes."""
    text = json.dumps(body, ensure_ascii=ascii, default=str)
    for sentinel, replacement in (
        (NAN, "NaN"), (INF, "1e999"), (HUGE_INT, "9" * 5000),
        (DEEP, "[" * 5000 + "]" * 5000),
    ):  # fmt: skip
        text = text.replace(json.dumps(sentinel, ensure_ascii=False), replacement)
    return text.encode("utf-8", "surrogatepass")


def run_id() -> str:
    return uuid.uuid4().hex[:6]
