"""The ids derived from names must be exactly the ``uuid`` module's: a command re-sent after an
upgrade has to get the id it got before, or the inbox would take it for a new one."""

from __future__ import annotations

import random
import uuid

from saga_services.outcome import OUTCOME_NAMESPACE, outcome_message_id
from saga_shared.model.ids import name_id, random_id
from saga_shared.model.messages import SagaEvent
from saga_shared.security.trust import FORWARD_NAMESPACE, forwarded_id


def _names(count: int) -> list[str]:
    rng = random.Random(2026)
    alphabet = "aZ09-_.:@|\x00\n\u00e9\u4e2d\U0001f600\ud7ff"
    names = ["", "\x00", "agent\x00m-1", "x" * 10_000]
    names += ["".join(rng.choices(alphabet, k=rng.randrange(60))) for _ in range(count)]
    return names


def test_a_name_gives_the_uuid5_the_uuid_module_gives() -> None:
    for name in _names(3000):
        for namespace in (FORWARD_NAMESPACE, OUTCOME_NAMESPACE, uuid.NAMESPACE_URL):
            assert name_id(namespace, name) == str(uuid.uuid5(namespace, name)), repr(name)


def test_forwarded_and_outcome_ids_are_the_ones_stored_before() -> None:
    # Fixed values, computed with uuid.uuid5 before the change: they must never move.
    assert forwarded_id("agent-1", "m-1") == str(uuid.uuid5(FORWARD_NAMESPACE, "agent-1\x00m-1"))
    assert forwarded_id("agent-1", "m-1") == "de6c1e23-fa1f-5f9f-a1c9-061c837ed7a6"
    assert outcome_message_id("k-1", "done", 2) == str(uuid.uuid5(OUTCOME_NAMESPACE, "k-1|done|2"))


def test_random_ids_are_version_4_uuids_and_differ() -> None:
    made = [
        SagaEvent(
            type="saga.completed", saga_id="s-1", order_id="o-1", saga="refund", status="completed"
        )
        for _ in range(2000)
    ]
    ids = {random_id() for _ in range(2000)} | {event.message_id for event in made}
    assert len(ids) == 4000
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
