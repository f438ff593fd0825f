"""What a command sent to the stack can come to, each its own type, with the texts that tell a
person or an agent what happened and what to do: answered and refused (``CommandRejected``),
sent but not answered in time (``NotAnswered``: queued, or maybe lost, and safe to send again
under the same message id), nothing sent (``BrokerUnreachable``), an id reused for another
command (``MessageIdReused``); and the schedule a client resends an unanswered command on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import JsonValue

from saga_shared.config import masked
from saga_shared.errors import SagaError
from saga_shared.model.messages import Command, CommandReply, DeskReply, SagaEvent
from saga_shared.model.text import clean


class DeskRefused(SagaError):
    """The desk could not do what was asked (no such dead letter)."""


class CommandRejected(SagaError):
    def __init__(self, reply: CommandReply) -> None:
        super().__init__(reply.reason)
        self.reply = reply
        self.reason = reply.reason


def what_of(command_type: str, saga_id: str | None, order_id: str | None) -> str:
    """``saga.start of saga s-1 (order A-17)``: the command, as the texts name it."""
    said = command_type
    if saga_id:
        said += f" of saga {saga_id}"
    if order_id:
        said += f" (order {order_id})" if saga_id else f" of order {order_id}"
    return said


def times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def seconds_text(seconds: float) -> str:
    """``3``, ``2.5``: a bound as a person wrote it."""
    return f"{seconds:.1f}".removesuffix(".0")


class NotAnswered(SagaError, TimeoutError):
    """Sent, but no answer came within the bound. ``queued``: the broker confirmed it holds a
    copy, which the coordinator applies when it runs; otherwise the broker confirmed none in
    time, and the command may be queued or may be lost. Either way sending it again with the
    same message id (a start: the same saga id) is safe: it is applied once.

    A ``TimeoutError`` too, as the single wait for a reply used to raise."""

    def __init__(
        self,
        *,
        command_type: str,
        message_id: str,
        saga_id: str | None,
        order_id: str | None,
        sends: int,
        queued: bool,
        within_s: float,
    ) -> None:
        self.command_type = command_type
        self.message_id = message_id
        self.saga_id = saga_id
        self.order_id = order_id
        self.sends = sends
        self.queued = queued
        self.within_s = within_s
        super().__init__(self._text())

    def _text(self) -> str:
        what = clean(what_of(self.command_type, self.saga_id, self.order_id), 400)
        within = seconds_text(self.within_s)
        sent = f"sent {times(self.sends)} as message {clean(self.message_id, 128)}"
        if self.command_type == "saga.status":
            return (
                f"no answer to {what} within {within} s ({sent}): is the coordinator "
                "running? A query changes nothing; asking again is safe"
            )
        again = f"the same message id {clean(self.message_id, 128)}"
        if self.command_type == "saga.start" and self.saga_id:
            again += f" (or the same saga id {clean(self.saga_id, 128)})"
        if self.queued:
            return (
                f"no answer to {what} within {within} s, but it is queued: it was "
                f"{sent} and RabbitMQ confirmed it holds it, so it will be applied when the "
                f"coordinator runs, unless the coordinator refuses it (then it answers why). "
                f"Sending it again with {again} is safe: it is applied once"
            )
        return (
            f"no answer to {what} within {within} s, and RabbitMQ did not confirm it: "
            f"it was {sent}, so it may be queued (then it will be applied when the coordinator "
            f"runs) or it may have been lost. Sending it again with {again} is safe: it is "
            "applied once at most"
        )

    def facts(self) -> dict[str, JsonValue]:
        return {
            "answered": False,
            "queued": self.queued,
            "may_be_queued": True,
            "command_type": self.command_type,
            "message_id": self.message_id,
            "saga_id": self.saga_id,
            "order_id": self.order_id,
            "sends": self.sends,
            "within_s": round(self.within_s, 3),
            "detail": str(self),
        }


class BrokerUnreachable(SagaError, ConnectionError):
    """Nothing was sent: no connection to the broker within the bound, or it took no copy of
    the command. Nothing will happen. ``url`` has no password."""

    def __init__(
        self,
        *,
        url: str,
        cause: str,
        within_s: float,
        reached: bool = False,
        command_type: str | None = None,
        message_id: str | None = None,
        saga_id: str | None = None,
        order_id: str | None = None,
    ) -> None:
        self.url = masked(url)
        self.cause = cause
        self.within_s = within_s
        self.reached = reached
        self.command_type = command_type
        self.message_id = message_id
        self.saga_id = saga_id
        self.order_id = order_id
        super().__init__(self._text())

    def _text(self) -> str:
        what = "the command" if self.command_type is None else clean(
            what_of(self.command_type, self.saga_id, self.order_id), 400
        )  # fmt: skip
        lead = (
            f"RabbitMQ at {self.url} did not take {what} within {seconds_text(self.within_s)} s"
            if self.reached
            else f"cannot reach RabbitMQ at {self.url}"
        )
        return f"{lead} ({self.cause}): nothing was sent, so nothing will happen"

    def facts(self) -> dict[str, JsonValue]:
        return {
            "sent": False,
            "url": self.url,
            "cause": self.cause,
            "command_type": self.command_type,
            "message_id": self.message_id,
            "saga_id": self.saga_id,
            "order_id": self.order_id,
            "within_s": round(self.within_s, 3),
            "detail": str(self),
        }


class MessageIdReused(SagaError):
    """The answer to a message id was the answer to another command: the id was used before
    for something else (a start, or another saga), so this command was not applied."""

    def __init__(self, command: Command, reply: CommandReply | DeskReply) -> None:
        said = getattr(reply, "saga_id", None)
        first = clean(what_of(reply.command_type, said, None), 400)
        super().__init__(
            f"message id {clean(command.message_id, 128)} was used before, for {first}: "
            f"{command.type} was not applied; send it under a new message id"
        )
        self.reply = reply


def reached(reply: CommandReply | DeskReply, wanted: tuple[str, ...]) -> SagaEvent | None:
    """The outcome a register (the answer to ``saga.status``) says its saga has reached, if it
    is one of ``wanted``, as the event that said so would carry it."""
    if not isinstance(reply, CommandReply) or reply.type != "command.accepted":
        return None  # no such saga (yet): a parked start, say
    register = reply.saga_register or {}
    kind = f"saga.{register.get('status')}"
    if kind not in wanted:
        return None
    return SagaEvent.model_validate({
        "type": kind, "saga_id": reply.saga_id, "order_id": reply.order_id,
        "saga": register.get("saga", ""), "status": register["status"], "saga_register": register,
    })  # fmt: skip


def cause_of(exc: BaseException) -> str:
    said = " ".join(str(exc).split())
    return clean(f"{type(exc).__name__}: {said}" if said else type(exc).__name__, 300)


@dataclass(frozen=True)
class ResendSchedule:
    """When an unanswered command is sent again: ``every_s`` after the first send, then each
    pause ``backoff`` times the one before, at most ``max_s``."""

    every_s: float = 2.0
    backoff: float = 1.5
    max_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.every_s > 0:
            raise ValueError(f"resend_every_s must be more than 0, not {self.every_s!r}")
        if not self.backoff >= 1:
            raise ValueError(f"resend_backoff must be at least 1, not {self.backoff!r}")
        if not self.max_s >= self.every_s:
            raise ValueError(f"resend_max_s must be at least resend_every_s ({self.every_s!r})")

    def pauses(self) -> Iterator[float]:
        """The pauses between one send and the next, for ever."""
        pause = self.every_s
        while True:
            yield pause
            pause = min(pause * self.backoff, self.max_s)

    def send_times(self, within_s: float) -> list[float]:
        """When each send starts, in seconds from the first, for sends that take no time and
        no answer within ``within_s``."""
        times, at = [0.0], 0.0
        for pause in self.pauses():
            at += pause
            if at >= within_s:
                return times
            times.append(at)
        raise AssertionError("unreachable")  # pragma: no cover


@dataclass
class Tally:
    """What became of the sends of one command."""

    sends: int = 0  # publishes that may have reached the broker
    confirmed: int = 0  # of those, the broker confirmed holding
    refused: int = 0  # nacked: the broker took no copy
    trouble: BaseException | None = field(default=None)
