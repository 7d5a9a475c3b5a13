"""Per-handler time limits: ``@zeroloss.handler(..., soft_time_limit=S1, time_limit=S2)``.

- The **soft** limit raises :class:`~zeroloss.exceptions.SoftTimeLimitExceeded` inside the
  handler: on its own thread (sync handlers, :func:`soft_limit`, by
  ``PyThreadState_SetAsyncExc``), in its task (async handlers, :func:`async_soft_limit`), or by
  ``SIGUSR1`` in a process-pool child (:mod:`zeroloss.runtime.worker.pool`).
- The **hard** limit is the handler's own override of ``HANDLER_TIMEOUT``
  (:func:`hard_limit`): the process pool kills the child running it, an async handler is
  cancelled, and in the thread pool the lease keeper stops renewing the lease (on a queue
  without a concurrency limit), so another worker gets the message and this run's outcome is
  refused.
- A sync handler on a thread whose **lease is lost** (its worker froze past ``ACK_TIMEOUT`` and
  another took the message over, or the lease ran out) gets
  :class:`~zeroloss.exceptions.LeaseLostInterrupt` from the lease keeper, through the same
  guard as its soft limit.
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import threading
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from ..exceptions import InvalidHandler, LeaseLostInterrupt, SoftTimeLimitExceeded

if TYPE_CHECKING:
    from .handlers import HandlerSpec

T = TypeVar("T")

__all__ = ["async_soft_limit", "hard_limit", "soft_limit", "validate_limits"]


def validate_limits(name: str, soft: float | None, hard: float | None) -> None:
    """Positive, finite numbers of seconds, the soft one shorter than the hard one."""
    for label, value in (("soft_time_limit", soft), ("time_limit", hard)):
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise InvalidHandler(
                f"Handler {name}: {label} must be a positive number of seconds (or None), got {value!r}."
            )
    if soft is not None and hard is not None and soft >= hard:
        raise InvalidHandler(
            f"Handler {name}: soft_time_limit ({soft:g}s) must be shorter than time_limit ({hard:g}s): "
            "the soft limit is the handler's chance to clean up before the hard one stops it."
        )


def hard_limit(spec: HandlerSpec, handler_timeout: float | None) -> float | None:
    """The handler's hard bound: its ``time_limit``, else ``HANDLER_TIMEOUT`` (None: unbounded)."""
    return spec.time_limit if spec.time_limit is not None else handler_timeout


def soft_message(spec: HandlerSpec) -> str:
    return f"handler {spec.name} ran past its soft_time_limit ({spec.soft_time_limit:g}s)"


# -- sync handlers on a thread ------------------------------------------------------------

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = [ctypes.c_ulong, ctypes.py_object]
_set_async_exc.restype = ctypes.c_int


class ThreadGuard:
    """Raises an exception in one thread, only while it is armed: its soft time limit (a timer
    started by :meth:`arm`), or whoever calls :meth:`fire` (the lease keeper, once the run's
    lease is lost: :class:`~zeroloss.exceptions.LeaseLostInterrupt`).

    Armed only once its timer thread has started: an exception delivered inside
    ``Thread.start()`` would break the threading module's bookkeeping (a ``KeyError`` from
    its limbo table instead of the limit). One fired before then is due, and :meth:`arm`
    raises it itself. Each exception type is delivered once.
    """

    def __init__(self, thread_id: int, soft_seconds: float | None = None) -> None:
        self.thread_id = thread_id
        self.lock = threading.Lock()
        self.state = "starting"  # then "armed", then "done"
        self.due: type[BaseException] | None = None
        self.sent: set[type[BaseException]] = set()
        self.timer: threading.Timer | None = None
        if soft_seconds is not None:
            self.timer = threading.Timer(soft_seconds, self.fire, args=(SoftTimeLimitExceeded,))
            self.timer.daemon = True

    def fire(self, exc: type[BaseException]) -> None:
        with self.lock:
            if exc in self.sent or self.state == "done":
                return  # "done": the guarded block ended first
            self.sent.add(exc)
            if self.state == "starting":
                self.due = exc
            else:
                _set_async_exc(self.thread_id, exc)

    def arm(self) -> None:
        """Start the timer; raise here what was fired before it was armed."""
        if self.timer is not None:
            self.timer.start()
        with self.lock:
            due, self.state = self.due, "done" if self.due else "armed"
        if due is not None:
            raise due

    def disarm(self) -> None:
        """After this returns nothing more is raised: a pending exception not yet delivered to
        the thread is withdrawn (``PyThreadState_SetAsyncExc(id, NULL)``) under the lock."""
        if self.timer is not None:
            self.timer.cancel()
        with self.lock:
            fired, self.state = self.state == "armed" and bool(self.sent), "done"
            if fired:
                _set_async_exc(self.thread_id, ctypes.py_object())  # NULL: clear what is pending


@contextmanager
def soft_limit(
    seconds: float | None, *, watch: Callable[[ThreadGuard | None], None] | None = None
) -> Iterator[None]:
    """Raise SoftTimeLimitExceeded in this thread if the block runs longer than ``seconds``.

    ``watch`` (the lease keeper's, for one message) is handed the block's guard before it is
    armed and None once it is disarmed: it may fire the guard meanwhile.

    Delivered between two bytecodes: a handler blocked inside one C call (``time.sleep(60)``,
    a socket read without timeout) sees it only when that call returns. An exception that
    arrives while the block is ending propagates from the block (the handler did run past
    its limit); none can arrive after it.
    """
    if seconds is None and watch is None:
        yield
        return
    guard = ThreadGuard(threading.get_ident(), seconds)
    if watch is not None:
        watch(guard)
    try:
        guard.arm()
        yield
    finally:
        while True:
            try:
                guard.disarm()
                break
            except (SoftTimeLimitExceeded, LeaseLostInterrupt):  # delivered inside disarm: again
                continue
        if watch is not None:
            watch(None)


# -- async handlers -------------------------------------------------------------------------


class _Throwing:
    """Drives a coroutine as ``yield from`` would, but turns the one cancellation the soft limit
    asked for into SoftTimeLimitExceeded thrown at the coroutine's ``await``."""

    def __init__(self, coro: Awaitable[T]) -> None:
        self.coro: Any = coro.__await__()
        self.soft_fired = False

    def __await__(self) -> Generator[Any, Any, Any]:
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                yielded = self.coro.send(send) if throw is None else self.coro.throw(throw)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            try:
                send = yield yielded
            except asyncio.CancelledError as exc:
                if self.soft_fired:
                    self.soft_fired = False
                    task = asyncio.current_task()
                    if task is not None:
                        task.uncancel()  # this cancellation was ours, not the caller's
                    throw = SoftTimeLimitExceeded()
                    throw.__context__ = exc
                else:
                    throw = exc
            except BaseException as exc:
                throw = exc


async def async_soft_limit(awaitable: Awaitable[T], seconds: float | None) -> T:
    """Await ``awaitable``; past ``seconds``, SoftTimeLimitExceeded is raised at its ``await``."""
    if seconds is None:
        return await awaitable
    driver = _Throwing(awaitable)
    task = asyncio.current_task()
    assert task is not None

    def fire() -> None:
        driver.soft_fired = True
        task.cancel()

    handle = asyncio.get_running_loop().call_later(seconds, fire)
    try:
        result: T = await driver
        return result
    finally:
        handle.cancel()
