"""The adapter SDK: put your own system behind the catalog's actions, one function per action.

    warehouse = Service("warehouse")

    class Pick(BaseModel):
        sku: str
        quantity: int

    @warehouse.action("warehouse.pick")
    async def pick(call: Call[Pick, None]) -> dict[str, JsonValue]:
        return {"pick_id": await my_api.pick(call.params.sku, call.params.quantity, key=call.key)}

The framework (``saga_services.adapter.Adapter``) does the rest: consuming the service's queue,
checking the sender, retrying ``Transient`` errors as the catalog says, the done / failed
events, dead letters and a graceful stop. A function is called at least once per request and
maybe more (a redelivery, a retry): pass ``call.key`` to the system so it applies once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import asyncpg
from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from saga_services.errors import Permanent, Transient
from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from saga_shared.model.catalog import Catalog, service_of
from saga_shared.model.messages import ActionRequest, Phase
from saga_shared.model.text import clean
from saga_shared.transport.codec import describe

__all__ = [
    "Call", "Coalescer", "KeyQuery", "KeyStatus", "Permanent", "Resources", "Service",
    "Transient", "Undo", "batch_scope",
]  # fmt: skip

P = TypeVar("P")
D = TypeVar("D")
T = TypeVar("T")
R = TypeVar("R")
Kind = Literal["action", "compensation"]
Result = dict[str, JsonValue]
Setup = Callable[["Resources"], contextlib.AbstractAsyncContextManager[D]]


@dataclass(frozen=True)
class Resources:
    """What a service's ``setup`` receives: the settings, the saga database's pool, and the
    service's key record (``saga_services.keys``: a system that keeps its effects in the same
    database may write them in the same transaction as the key's row, as the simulated
    systems do)."""

    settings: Settings
    pool: asyncpg.Pool | None = None
    keys: Any = None  # saga_services.keys.KeyStore (kept untyped here: keys imports this module)
    # In-memory stand-ins for the systems' databases, for the test kit and the simulation
    # (saga_services.simulated_memory.MemorySystems for the built-in systems).
    memory: Any = None


@dataclass(frozen=True)
class KeyQuery:
    """What a service's ``status`` hook is asked about: one idempotency key of one action."""

    key: str
    action: str
    order_id: str


@dataclass(frozen=True)
class KeyStatus:
    """A system's own answer about a key (a ``status`` hook's): ``done`` (with the action's
    result), ``failed`` or ``fenced`` (it did not happen and never will: the system refuses the
    key from now on), or ``unknown``."""

    state: Literal["done", "failed", "fenced", "unknown"]
    result: dict[str, JsonValue] | None = None
    reason: str = ""


StatusHook = Callable[[KeyQuery, Any], Awaitable[KeyStatus]]


@dataclass(frozen=True)
class Call(Generic[P, D]):
    """One call of an action or compensation function."""

    action: str
    params: P  # the function's parameter model, validated; a dict when it declares none
    key: str  # the idempotency key, ``saga_id:action``: give it to the system
    saga_id: str
    order_id: str
    phase: Phase
    # This try of this send, from 1, as the key record counts it: retries of Transient errors,
    # batch re-runs and tries cut short by a crash all count; the catalog's attempts bound it.
    attempt: int
    send: int  # how many times the coordinator has sent the request (a re-send keeps the key)
    deadline: float  # the loop's time (monotonic) by which the call is abandoned as timed out
    deps: D  # what the service's setup yielded: a client, a pool

    @property
    def remaining_s(self) -> float:
        """Seconds left before the deadline, for the timeout of the system's own client."""
        return max(0.0, self.deadline - asyncio.get_running_loop().time())


class Undo(BaseModel):
    """A compensation's parameters: the identifiers the forward call returned (when it answered)
    and always its idempotency key, by which the system finds what landed when it did not."""

    model_config = ConfigDict(frozen=True, extra="allow")
    forward_key: str | None = None  # the coordinator always sends it

    def target(self, id_field: str) -> Result:
        """``{id_field: id}`` when the forward call answered, else ``{"forward_key": key}``;
        ``Permanent`` when neither is given."""
        given = getattr(self, id_field, None)
        if given is None and self.model_extra:
            given = self.model_extra.get(id_field)
        if isinstance(given, str) and given:
            return {id_field: given}
        if self.forward_key:
            return {"forward_key": self.forward_key}
        raise Permanent(f"give {id_field!r} or 'forward_key'")


Function = Callable[[Call[Any, D]], Awaitable[Any]]


@dataclass(frozen=True)
class _Handler(Generic[D]):
    kind: Kind
    fn: Function[D]
    model: type[BaseModel] | None

    def parse(self, req: ActionRequest) -> Any:
        if self.model is None:
            return dict(req.params)
        try:
            return self.model.model_validate(req.params, strict=True)
        except ValidationError as exc:
            raise Permanent(
                clean(f"{req.action}: invalid parameters: {describe(exc)}", 1000)
            ) from None


class Service(Generic[D]):
    """The actions one service serves. ``setup`` opens what its functions need (a client, a
    pool) for as long as the adapter runs; functions find it as ``call.deps``.

    ``status``: how the system itself tells whether a key's call happened (``KeyStatus``),
    asked when a settle finds a claim unfinished (its process died mid-call, say); without it
    such a step stays in doubt until a person settles it. ``atomic``: the system writes its
    effect in the same transaction as the key's row (``Resources.keys``), so an unfinished
    claim landed nothing."""

    def __init__(
        self, name: str, *, setup: Setup[D] | None = None, status: StatusHook | None = None,
        atomic: bool = False,
    ) -> None:  # fmt: skip
        self.name = name
        self._setup = setup
        self.status = status
        self.atomic = atomic
        self._handlers: dict[str, _Handler[D]] = {}

    def action(
        self, name: str, *, params: type[BaseModel] | None = None
    ) -> Callable[[Function[D]], Function[D]]:
        """Register the function performing the catalog's action ``name``."""
        return self._register("action", name, params)

    def compensation(
        self, name: str, *, params: type[BaseModel] | None = None
    ) -> Callable[[Function[D]], Function[D]]:
        """Register the function performing the catalog's compensation ``name``."""
        return self._register("compensation", name, params)

    def _register(
        self, kind: Kind, name: str, params: type[BaseModel] | None
    ) -> Callable[[Function[D]], Function[D]]:
        if service_of(name) != self.name:
            raise ConfigError(f"{name}: service {self.name!r} serves only {self.name}.* actions")
        if name in self._handlers:
            raise ConfigError(f"{name}: registered twice in service {self.name!r}")

        def register(fn: Function[D]) -> Function[D]:
            self._handlers[name] = _Handler(kind, fn, params or _model_of(fn))
            return fn

        return register

    @property
    def actions(self) -> list[str]:
        return sorted(self._handlers)

    def open(self, resources: Resources) -> contextlib.AbstractAsyncContextManager[D | None]:
        if self._setup is None:
            return contextlib.nullcontext(None)
        return self._setup(resources)

    def check(self, catalog: Catalog) -> None:
        """Refuse to start unless the functions and the catalog agree: every action and
        compensation of this service has a function, every function is in the catalog, and a
        parameter model has the catalog's parameters."""
        problems = list(_disagreements(self.name, self._handlers, catalog))
        if problems:
            raise ConfigError(
                f"service {self.name!r} and the catalog disagree: " + "; ".join(problems)
            )

    async def call(self, req: ActionRequest, deps: D, *, attempt: int = 1) -> Result:
        """One try of ``req``: its function's result, or ``Transient`` / ``Permanent``."""
        handler = self._handlers.get(req.action)
        if handler is None:
            known = ", ".join(self.actions)
            raise Permanent(f"{self.name} has no function for {req.action!r} (known: {known})")
        call = Call(
            action=req.action, params=handler.parse(req), key=req.idempotency_key,
            saga_id=req.saga_id, order_id=req.order_id, phase=req.phase, attempt=attempt,
            send=req.attempt, deadline=asyncio.get_running_loop().time() + req.timeout_s,
            deps=deps,
        )  # fmt: skip
        return _result_of(req.action, await handler.fn(call))


def _model_of(fn: Callable[..., Any]) -> type[BaseModel] | None:
    """The parameter model named by the first argument's annotation, ``Call[Model, Deps]``
    (only that annotation is resolved: the others may name what the module cannot see)."""
    first = next(iter(inspect.signature(fn).parameters.values()), None)
    if first is None or first.annotation is inspect.Parameter.empty:
        return None
    holder = types.SimpleNamespace(__annotations__={"call": first.annotation})
    try:
        hint = typing.get_type_hints(holder, globalns=getattr(fn, "__globals__", None))["call"]
    except Exception as exc:
        raise ConfigError(
            f"{fn.__qualname__}: cannot resolve {first.annotation!r} ({exc!r}): define the "
            "model at module level, or pass params=Model"
        ) from None
    args = typing.get_args(hint) if typing.get_origin(hint) is Call else ()
    model = args[0] if args else None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _result_of(action: str, value: object) -> Result:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return value
    # It ran and answered nonsense: whatever it did may have landed.
    kind = type(value).__name__
    raise Permanent(f"{action} returned {kind}, not a dict of results", may_have_landed=True)


_PLAIN = {"str": str, "int": int, "float": float, "bool": bool}


def _disagreements(
    service: str, handlers: dict[str, _Handler[Any]], catalog: Catalog
) -> Sequence[str]:
    declared: dict[str, Kind] = dict.fromkeys(catalog.actions, "action")
    declared |= dict.fromkeys(catalog.compensations, "compensation")
    out: list[str] = []
    for name, kind in sorted(declared.items()):
        if service_of(name) == service and name not in handlers:
            out.append(f"{kind} {name} has no function")
    for name, handler in sorted(handlers.items()):
        if name not in declared:
            out.append(f"{name} is not in the catalog")
        elif declared[name] != handler.kind:
            out.append(
                f"{name} is a {declared[name]} in the catalog, registered as a {handler.kind}"
            )
        elif handler.model is not None and handler.kind == "action":
            out += _param_problems(name, handler.model, catalog)
    return out


def _param_problems(name: str, model: type[BaseModel], catalog: Catalog) -> list[str]:
    specs = catalog.actions[name].params
    fields = model.model_fields
    out = [f"{name}: parameter {p!r} is not in {model.__name__}" for p in specs if p not in fields]
    out += [
        f"{name}: {model.__name__}.{f} is required but not a catalog parameter"
        for f, info in fields.items()
        if info.is_required() and f not in specs
    ]
    for p, spec in specs.items():
        annotation = fields[p].annotation if p in fields else None
        plain = isinstance(annotation, type) and annotation in _PLAIN.values()
        if plain and annotation is not _PLAIN[spec.type]:
            kind = getattr(annotation, "__name__", "?")
            out.append(f"{name}: {p!r} is {spec.type} in the catalog, {kind} in {model.__name__}")
    return out


# --- several calls as one -----------------------------------------------------------------------


@dataclass
class _Batch:
    pending: dict[int, tuple[Coalescer[Any, Any], list[tuple[Any, asyncio.Future[Any]]]]] = field(
        default_factory=dict
    )
    # Insertion-ordered, not a set of tasks hashed by address: cancelled in the order made.
    tasks: dict[asyncio.Task[None], None] = field(default_factory=dict)

    def submit(self, coalescer: Coalescer[T, R], item: T) -> asyncio.Future[R]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        _, queue = self.pending.setdefault(id(coalescer), (coalescer, []))
        if not queue:  # the calls of this tick join it; the flush runs once they have
            loop.call_soon(self._flush, id(coalescer))
        queue.append((item, future))
        return future

    def _flush(self, ident: int) -> None:
        coalescer, queue = self.pending.pop(ident)
        task = asyncio.ensure_future(coalescer.settle(queue))
        self.tasks[task] = None
        task.add_done_callback(lambda done: self.tasks.pop(done, None))


# Whether the outcome of the call in hand is in its key's row already, final: set by a system
# that writes it there in the statement of its effect (an atomic service's, ``sim_call``).
_RECORDED: ContextVar[list[bool] | None] = ContextVar("saga_recorded", default=None)


def mark_recorded() -> None:
    """From the call of an atomic service's function: its system has stored this call's outcome
    as final in the key's row, in the same transaction as the effect, so the SDK has nothing
    left to store for it (one statement fewer a call). Anything else is stored by the SDK."""
    cell = _RECORDED.get()
    if cell is not None:
        cell[0] = True


@contextlib.contextmanager
def recording() -> Iterator[list[bool]]:
    """Around one call: ``[True]`` afterwards if its system said ``mark_recorded``."""
    cell = [False]
    token = _RECORDED.set(cell)
    try:
        yield cell
    finally:
        _RECORDED.reset(token)


_SCOPE: ContextVar[_Batch | None] = ContextVar("saga_batch", default=None)


@contextlib.asynccontextmanager
async def batch_scope() -> AsyncIterator[None]:
    """While open, ``Coalescer.submit`` calls made in the same tick run as one (the adapter
    opens one per delivery batch, around the calls of its functions)."""
    batch = _Batch()
    token = _SCOPE.set(batch)
    try:
        yield
    finally:
        _SCOPE.reset(token)
        for task in list(batch.tasks):
            task.cancel()
        await asyncio.gather(*batch.tasks, return_exceptions=True)


class Coalescer(Generic[T, R]):
    """For a system with a bulk call: ``submit(item)`` from a function; the items the functions
    of one delivery batch submit together reach ``run_many`` as one list (outside a batch, a
    list of one). ``run_many`` returns a result or an exception per item, in order; if it
    raises, every item fails with that error (and the adapter then makes each call alone)."""

    def __init__(self, run_many: Callable[[list[T]], Awaitable[Sequence[R | Exception]]]) -> None:
        self._run_many = run_many

    async def submit(self, item: T) -> R:
        batch = _SCOPE.get()
        if batch is None:
            (only,) = await self._answers([item])
            if isinstance(only, Exception):
                raise only
            return only
        return await batch.submit(self, item)

    async def _answers(self, items: list[T]) -> Sequence[R | Exception]:
        results = await self._run_many(items)
        if len(results) != len(items):
            raise Transient(f"a bulk call of {len(items)} answered {len(results)} times")
        return results

    async def settle(self, queue: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._answers([item for item, _ in queue])
        except asyncio.CancelledError:
            for _, future in queue:
                future.cancel()
            raise
        except Exception as exc:
            for _, future in queue:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(queue, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
