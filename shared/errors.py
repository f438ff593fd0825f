"""The exception root of the project's shared layer.

Habit: "retry later" is a different type from a real error, so the one place that settles a delivery
(``saga_shared.transport.delivery``) can decide ack, requeue or dead-letter from the type alone."""

from __future__ import annotations


class SagaError(Exception):
    """Root of every error raised on purpose by this project."""


class RetryLater(SagaError):
    """Transient trouble (database down, broker hiccup): the same message may work later."""


class InvalidMessage(SagaError):
    """A message that can never be handled: dead-letter it at once, never retry it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DeliveryLimitReached(SagaError):
    """Delivered more often than its queue's limit allows: dead-lettered, not handled again
    (a classic queue's consumer counts, ``saga_shared.transport.poison``)."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"handled {count} times, over the delivery limit of {limit}")
        self.count = count


class ConfigError(SagaError):
    """A setting from the environment is missing or malformed."""


class CatalogError(SagaError):
    """The catalog file breaks a gateway rule; start-up stops with this message."""


class PlanRejected(SagaError):
    """A plan or a command breaks a gateway rule. ``rule`` is a stable, machine-readable name."""

    def __init__(self, rule: str, detail: str, *, step: int | None = None) -> None:
        where = f"step {step}: " if step is not None else ""
        super().__init__(f"{where}{detail} [{rule}]")
        self.rule = rule
        self.step = step
        self.detail = detail
