"""An asyncio event loop on virtual time, deterministic and instant.

``VirtualLoop`` is asyncio's own ``BaseEventLoop`` (the same ready queue, the same timer heap,
the same task stepping) with two things replaced: ``time()`` reads a virtual clock, and the
selector, which on a real loop blocks until a socket is ready or the next timer is due, never
blocks: with nothing ready it moves the clock to the next timer. A one-hour ``asyncio.sleep``
therefore takes no wall time, and ``wait_for``, ``asyncio.timeout`` and ``call_later`` all
fire in virtual time. With nothing ready and no timer left the program can never progress:
``Deadlock`` is raised instead of waiting for ever.

Determinism. Given the same program (and the same seeds in it), every run takes the same
steps: callbacks run in FIFO order, and timers in (deadline, scheduling order). The second part
is not asyncio's: its heap compares deadlines only, so timers due at the same instant come out
in whatever order the heap's sift leaves them, which is repeatable but not the order they were
scheduled in; here a sequence number breaks the tie. The tasks left at the end are cancelled
in the order they were created, not in the order of ``all_tasks()``'s set.

What it cannot make deterministic, and a simulated component must avoid: real I/O, threads,
subprocesses and signals (all refused with ``RealIO``); reading the wall clock (``time``,
``datetime.now``: use ``loop.time()`` or ``now()``); global ``random``/``uuid4``; iterating a
set of objects hashed by identity (``asyncio.wait``'s ``done`` set: sort it first).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import weakref
from collections.abc import Callable, Coroutine, Generator
from contextvars import Context
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # what virtual time 0.0 is as a wall-clock date
# asyncio's own cap on one wait of the selector; a longer sleep takes several jumps.
MAXIMUM_JUMP = 24 * 3600


class SimulationError(RuntimeError):
    """The simulated program did something the simulation cannot run deterministically."""


class Deadlock(SimulationError):
    """Nothing is ready and no timer is armed: what the program waits for can never come."""


class RealIO(SimulationError):
    """Real I/O, a thread, a subprocess or a signal: outside the simulation."""


class _Timer(asyncio.TimerHandle):
    """A timer ordered by (deadline, scheduling order)."""

    __slots__ = ("_key", "_seq")

    def __init__(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop,
        context: Context | None,
        seq: int,
    ) -> None:
        super().__init__(when, callback, args, loop, context)
        self._seq = seq
        self._key = (when, seq)  # compared on every heap move: built once

    def __lt__(self, other: asyncio.TimerHandle) -> bool:
        return self._key < _order(other)

    def __le__(self, other: asyncio.TimerHandle) -> bool:
        return self._key <= _order(other)

    def __gt__(self, other: asyncio.TimerHandle) -> bool:
        return self._key > _order(other)

    def __ge__(self, other: asyncio.TimerHandle) -> bool:
        return self._key >= _order(other)


def _order(timer: asyncio.TimerHandle) -> tuple[float, int]:
    key: tuple[float, int] | None = getattr(timer, "_key", None)
    return key if key is not None else (timer.when(), -1)


class _Clock:
    """The selector: there is no I/O to wait for, so waiting moves the virtual clock."""

    def __init__(self, loop: VirtualLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        self._loop._jump(timeout)
        return []

    def close(self) -> None:
        return None


def _refuse(what: str) -> NoReturn:
    raise RealIO(
        f"{what} on the simulation's loop: real I/O, threads, subprocesses and signals "
        "would make the run depend on the machine; give the component a simulated port"
    )


def _outside(what: str) -> Callable[..., NoReturn]:
    def refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
        _refuse(what)

    return refuse


class VirtualLoop(asyncio.BaseEventLoop):
    """``time()`` starts at ``start`` (seconds) and moves only when nothing is ready."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._now = float(start)
        self._selector = _Clock(self)
        self._timer_seq = itertools.count()
        self._task_seq = itertools.count()
        self._born: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
        self._fit_resolution()

    def time(self) -> float:
        return self._now

    @property
    def _heap(self) -> list[asyncio.TimerHandle]:
        """asyncio's timer heap (private to it, hence untyped)."""
        return self._scheduled  # type: ignore[attr-defined,no-any-return]

    def _fit_resolution(self) -> None:
        # asyncio runs the timers due before time() + resolution. Far from zero a float's
        # spacing outgrows the monotonic clock's 1 ns and a timer due exactly now would never
        # count as due: the resolution keeps a few spacings of the clock's current value.
        self._clock_resolution = max(1e-9, 4 * math.ulp(self._now))

    def _jump(self, timeout: float | None) -> None:
        if timeout is None:
            raise Deadlock("nothing is ready and no timer is armed: the program cannot progress")
        if timeout <= 0:
            return
        heap = self._heap
        if heap and timeout < MAXIMUM_JUMP:
            # Exactly the deadline: now + (deadline - now) can miss it by a float's spacing.
            self._now = max(self._now, heap[0].when())
        else:
            self._now += timeout
        self._fit_resolution()

    def _process_events(self, event_list: list[Any]) -> None:
        return None  # the selector never reports any

    def _write_to_self(self) -> None:
        return None  # one thread: nothing sleeps in select() to be woken

    def call_at(
        self,
        when: float,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
        timer = _Timer(when, callback, args, self, context, next(self._timer_seq))
        heapq.heappush(self._heap, timer)
        timer._scheduled = True  # type: ignore[attr-defined]  # asyncio's own bookkeeping
        return timer

    def create_task(
        self,
        coro: Generator[Any, None, T] | Coroutine[Any, Any, T],
        *,
        name: object = None,
        context: Context | None = None,
    ) -> asyncio.Task[T]:
        task = super().create_task(coro, name=name, context=context)
        self._born[task] = next(self._task_seq)
        return task

    def birth(self, task: asyncio.Task[Any]) -> int:
        """The order ``task`` was created in (tasks made without ``create_task``: last)."""
        return self._born.get(task, 2**62)

    def add_reader(self, fd: object, callback: object, *args: object) -> NoReturn:
        _refuse("add_reader")

    def add_writer(self, fd: object, callback: object, *args: object) -> NoReturn:
        _refuse("add_writer")

    def remove_reader(self, fd: object) -> bool:
        return False  # none can have been added

    def remove_writer(self, fd: object) -> bool:
        return False

    def run_in_executor(self, executor: object, func: object, *args: object) -> NoReturn:
        _refuse("run_in_executor")

    def add_signal_handler(self, sig: int, callback: object, *args: object) -> NoReturn:
        _refuse("add_signal_handler")

    getaddrinfo = _outside("getaddrinfo")
    getnameinfo = _outside("getnameinfo")
    create_connection = _outside("create_connection")
    create_server = _outside("create_server")
    create_datagram_endpoint = _outside("create_datagram_endpoint")
    sock_connect = _outside("sock_connect")
    sock_recv = _outside("sock_recv")
    sock_sendall = _outside("sock_sendall")
    sock_accept = _outside("sock_accept")
    subprocess_exec = _outside("subprocess_exec")
    subprocess_shell = _outside("subprocess_shell")


def run(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``main`` to completion on a fresh virtual loop starting at ``start``, then cancel
    what is left (quietly, oldest task first) and close the loop."""
    loop = VirtualLoop(start)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_leftovers(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def _cancel_leftovers(loop: VirtualLoop) -> None:
    left = sorted(asyncio.all_tasks(loop), key=loop.birth)
    for task in left:
        task.cancel()
    if left:
        # return_exceptions: what the leftovers raise while stopping is theirs, not the run's
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


def at(seconds: float) -> datetime:
    """Virtual time ``seconds`` as a UTC date."""
    return EPOCH + timedelta(seconds=seconds)


def now() -> datetime:
    """The running virtual loop's time as a timezone-aware UTC date (``EPOCH`` + ``time()``),
    for components that want a wall clock."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualLoop):
        raise SimulationError("now() asked outside a virtual loop: it would read no clock")
    return at(loop.time())
