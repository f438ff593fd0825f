"""The published contract: JSON Schema for every message and an AsyncAPI document describing
the exchanges, routing keys and messages, generated from the pydantic models (the single source
of truth). ``saga schema export`` writes them; a test fails when the committed copy is stale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from saga_shared.model.messages import (
    AbortSaga,
    ActionDone,
    ActionFailed,
    ActionRequest,
    ActionSettled,
    Alert,
    ApproveSaga,
    CommandReply,
    DeskReply,
    DiscardDeadLetter,
    QuerySaga,
    RejectSaga,
    ReplayDeadLetters,
    ResolveSaga,
    ResumeSaga,
    SagaEvent,
    SettleRequest,
    SettleSaga,
    StartSaga,
)
from saga_shared.transport.topology import SERVICES, Topology

COMMANDS: dict[str, type[BaseModel]] = {
    "saga.start": StartSaga,
    "saga.abort": AbortSaga,
    "saga.resume": ResumeSaga,
    "saga.resolve": ResolveSaga,
    "saga.approve": ApproveSaga,
    "saga.reject": RejectSaga,
    "saga.settle": SettleSaga,
    "saga.status": QuerySaga,
    "dlq.replay": ReplayDeadLetters,
    "dlq.discard": DiscardDeadLetter,
}
ADAPTER: dict[str, type[BaseModel]] = {
    "action.request": ActionRequest,
    "action.settle": SettleRequest,
    "action.done": ActionDone,
    "action.failed": ActionFailed,
    "action.settled": ActionSettled,
}
OUT: dict[str, type[BaseModel]] = {
    "command.reply": CommandReply,
    "desk.reply": DeskReply,
    "saga.event": SagaEvent,
    "alert": Alert,
}
MESSAGES: dict[str, type[BaseModel]] = {**COMMANDS, **ADAPTER, **OUT}


def _schema(name: str, model: type[BaseModel]) -> dict[str, Any]:
    # What others send us is described as we validate it; what we send, as we serialize it.
    mode: Literal["validation", "serialization"] = (
        "serialization"
        if name in OUT or name in ("action.request", "action.settle")
        else "validation"
    )
    return model.model_json_schema(mode=mode)


def json_schemas() -> dict[str, dict[str, Any]]:
    """One JSON Schema per message, keyed by its file name."""
    return {f"{name}.json": _schema(name, model) for name, model in MESSAGES.items()}


def _message(name: str, summary: str) -> dict[str, Any]:
    return {
        "name": name,
        "contentType": "application/json",
        "summary": summary,
        "payload": {"$ref": f"#/components/schemas/{name}"},
    }


def _command_route(key: str, partitions: int) -> str:
    user = "with the AMQP user_id property set to your broker user"
    if key.startswith("dlq."):
        return f"Publish {key} here (topic exchange, routing key {key}), {user}."
    return (
        f"Publish {key} here (topic exchange), {user}, under the routing key "
        f"{key}.<p> where p = crc32(UTF-8 order_id) % {partitions} (zlib.crc32): it goes "
        f"straight to the order's partition. The bare key {key} also works, one hop slower "
        "(through the intake); use one form per order."
    )


def _components(schemas: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every message's schema with its ``$defs`` moved up beside it, so that each reference
    resolves from the document's root (``#/components/schemas/<name>``). A definition shared
    by several messages must read the same in each; one that does not is an error here, not a
    silently wrong document."""
    hoisted: dict[str, dict[str, Any]] = {}
    for name, schema in schemas.items():
        for def_name, definition in schema.pop("$defs", {}).items():
            if hoisted.setdefault(def_name, definition) != definition:
                raise ValueError(f"{def_name} reads differently in {name} than before it")
    collide = hoisted.keys() & schemas.keys()
    if collide:
        raise ValueError(f"definitions named like messages: {sorted(collide)}")
    rebased: dict[str, dict[str, Any]] = _rebase({**schemas, **hoisted})
    return rebased


def _rebase(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: v.replace("#/$defs/", "#/components/schemas/") if k == "$ref" else _rebase(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rebase(v) for v in node]
    return node


def _parameter(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}}


def asyncapi(namespace: str = "saga", partitions: int = 8) -> dict[str, Any]:
    t = Topology(namespace, partitions, delivery_limit=5)
    bindings = {"amqp": {"is": "routingKey", "exchange": {"type": "topic", "durable": True}}}
    schemas = _components({name: _schema(name, model) for name, model in MESSAGES.items()})
    partition = {
        "partition": _parameter(f"crc32(UTF-8 order_id) % {partitions} (zlib.crc32), in decimal")
    }
    outcomes = [
        _message("action.done", "The action succeeded"),
        _message("action.failed", "The action failed"),
    ]
    return {
        "asyncapi": "2.6.0",
        "info": {
            "title": "Reversible sagas",
            "version": "1",
            "description": (
                "Agents publish commands; the coordinator answers on reply_to and publishes "
                "lifecycle events; adapters consume action requests and answer with outcomes."
            ),
        },
        "channels": {
            **{
                f"{t.commands_exchange}/{key}": {
                    "description": _command_route(key, partitions),
                    "publish": {"message": _message(key, model.__doc__ or key)},
                    "bindings": bindings,
                }
                for key, model in COMMANDS.items()
            },
            "reply_to": {
                "description": "The agent's own queue, named in a command's reply_to.",
                "subscribe": {
                    "message": {
                        "oneOf": [
                            _message("command.reply", "accepted, rejected or parked"),
                            _message("desk.reply", "what the desk did with dead letters"),
                        ]
                    }
                },
            },
            f"{t.events_exchange}/alert.{{kind}}": {
                "description": "Alerts that belong to no saga: forged messages, dead letters "
                "that could not be stored, agents over their rate (bind alert.#).",
                "parameters": {"kind": _parameter("what is wrong, e.g. forged")},
                "subscribe": {"message": _message("alert", "Something for an operator")},
                "bindings": bindings,
            },
            f"{t.events_exchange}/{{eventType}}": {
                "description": "Lifecycle events; the routing key is the event type (bind # "
                "for all, saga.* for the sagas' own, step.* for the steps').",
                "parameters": {"eventType": _parameter("the event's type, e.g. saga.completed")},
                "subscribe": {"message": _message("saga.event", "A saga's lifecycle change")},
                "bindings": bindings,
            },
            **{
                f"{t.actions_exchange}/{t.request_key(service)}": {
                    "description": f"Action requests for the {service} adapter (direct "
                    f"exchange; transient, through the classic queue {t.request_queue(service)},"
                    " sent again by the coordinator when lost).",
                    "subscribe": {"message": _message("action.request", "Perform one action")},
                }
                for service in SERVICES
            },
            **{
                f"{t.actions_exchange}/{service}": {
                    "description": f"Settles for the {service} adapter (direct exchange; the "
                    f"quorum queue {t.action_queue(service)}), and action requests published "
                    "by a coordinator older than 0.3.",
                    "subscribe": {
                        "message": {
                            "oneOf": [
                                _message(
                                    "action.settle",
                                    "Say which way a key went; fence it if nobody claimed it",
                                ),
                                _message("action.request", "Perform one action"),
                            ]
                        }
                    },
                }
                for service in SERVICES
            },
            f"{t.outcomes_exchange}/{{partition}}": {
                "description": "Adapters answer a request into the order's partition (direct "
                f"exchange; the classic queue {t.namespace}.outcome.{{partition}}, or, that "
                "queue gone, the partition's quorum queue through the alternate exchange "
                f"{t.partitions_exchange}).",
                "parameters": partition,
                "publish": {"message": {"oneOf": outcomes}},
            },
            f"{t.partitions_exchange}/{{partition}}": {
                "description": "Adapters answer a settle into the order's partition (direct "
                "exchange, its quorum queue), as adapters before the outcome queues answered "
                "every request.",
                "parameters": partition,
                "publish": {
                    "message": {
                        "oneOf": [*outcomes, _message("action.settled", "Which way a key went")]
                    }
                },
            },
        },
        "components": {"schemas": schemas},
    }


def export(directory: Path) -> list[Path]:
    """Write every schema and the AsyncAPI document; return the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    documents = {**json_schemas(), "asyncapi.json": asyncapi()}
    written = []
    for name, document in sorted(documents.items()):
        path = directory / name
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written
