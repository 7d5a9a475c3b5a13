"""The handler registry: which Python callable processes which queue.

Handlers live in a ``zeroloss_handlers`` module of any installed app (autodiscovered at
start-up, like ``admin.py``), or anywhere that is imported before workers start::

    import zeroloss

    @zeroloss.handler("emails")
    def send_email(delivery):
        mail.send(to=delivery.payload["to"])

    @zeroloss.handler("ledger", transactional=True)
    def book(delivery):
        Entry.objects.create(...)  # commits with the acknowledgement, or not at all

    @zeroloss.handler("webhooks")
    async def call_webhook(delivery):
        await client.post(delivery.payload["url"])  # awaited on the claim thread's event loop

    @zeroloss.handler("reports", soft_time_limit=50, time_limit=60)
    def build_report(delivery):
        ...  # SoftTimeLimitExceeded raised in it at 50 s; stopped at 60 s (docs/control.md)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .exceptions import InvalidHandler, InvalidMessage, UnknownQueue

if TYPE_CHECKING:
    from .delivery import Delivery

HandlerFunc = Callable[["Delivery"], Any]
F = TypeVar("F", bound=HandlerFunc)


@dataclass(frozen=True)
class HandlerSpec:
    queue_name: str
    func: HandlerFunc
    #: Run the handler and the acknowledgement in one database transaction, so the handler's
    #: writes to the same database happen exactly once.
    transactional: bool = False
    #: Store the handler's return value (JSON) on the message with its acknowledgement
    #: (``Message.result``); a value that is not JSON then fails the attempt. Task queues use it.
    store_result: bool = False
    #: Seconds after which ``SoftTimeLimitExceeded`` is raised inside the handler (None: never).
    soft_time_limit: float | None = None
    #: Seconds after which the run is stopped: the handler's own ``HANDLER_TIMEOUT`` (None: that
    #: setting). See :mod:`zeroloss.timelimits`.
    time_limit: float | None = None
    #: What a log record calls the code a message (its payload) runs (None: ``handler
    #: <module.function>``): a task queue's names the task, not the runner that calls it.
    describe: Callable[[Any], str] | None = None
    #: ``async def`` (or an object whose ``__call__`` is): awaited on an event loop, never called bare.
    is_async: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        from .timelimits import validate_limits

        object.__setattr__(self, "is_async", is_coroutine_function(self.func))
        validate_limits(f"{self.name} of queue {self.queue_name!r}", self.soft_time_limit, self.time_limit)

    @property
    def name(self) -> str:
        return (
            f"{getattr(self.func, '__module__', '?')}.{getattr(self.func, '__qualname__', repr(self.func))}"
        )

    def runs(self, payload: Any) -> str:
        """``handler module.function``, or what :attr:`describe` says of ``payload`` (``task module.function``)."""
        if self.describe is not None:
            with contextlib.suppress(Exception):  # a log line must not cost the message its record
                return self.describe(payload)
        return f"handler {self.name}"


def is_coroutine_function(func: Any) -> bool:
    """``async def`` functions, ``functools.partial`` of one, and objects with an async ``__call__``."""
    from asgiref.sync import iscoroutinefunction

    while isinstance(func, functools.partial):
        func = func.func
    if iscoroutinefunction(func):
        return True
    call = None if inspect.isroutine(func) or inspect.isclass(func) else type(func).__dict__.get("__call__")
    return call is not None and iscoroutinefunction(call)


#: Why ``transactional=True`` is refused on a coroutine function.
ASYNC_NOT_TRANSACTIONAL = (
    "an async handler cannot be transactional: its writes and its acknowledgement must share one "
    "database transaction on the worker thread's connection, and the async ORM runs every query "
    "through sync_to_async on another thread, outside that transaction. Write it as a plain def "
    "(Django's ORM is synchronous anyway) or drop transactional=True."
)

_registry: dict[str, HandlerSpec] = {}


def handler(
    queue_name: str,
    *,
    transactional: bool = False,
    store_result: bool = False,
    soft_time_limit: float | None = None,
    time_limit: float | None = None,
) -> Callable[[F], F]:
    """Register the decorated callable as the handler of ``queue_name``.

    ``soft_time_limit`` raises :class:`~zeroloss.SoftTimeLimitExceeded` in the handler;
    ``time_limit`` overrides ``HANDLER_TIMEOUT`` for it (both seconds; soft < hard, else
    :class:`~zeroloss.exceptions.InvalidHandler`)."""
    from .ledger.validation import validate_queue_name

    validate_queue_name(queue_name)

    def decorator(func: F) -> F:
        existing = _registry.get(queue_name)
        spec = HandlerSpec(
            queue_name,
            func,
            transactional,
            store_result,
            soft_time_limit=soft_time_limit,
            time_limit=time_limit,
        )
        if spec.is_async and transactional:
            raise InvalidHandler(f"Handler {spec.name} of queue {queue_name!r}: {ASYNC_NOT_TRANSACTIONAL}")
        if existing is not None and existing.name != spec.name:
            raise InvalidMessage(f"Queue {queue_name!r} already has a handler: {existing.name}.")
        _registry[queue_name] = spec
        return func

    return decorator


class QueueSource(Protocol):
    """Queues handled by something other than a ``@zeroloss.handler`` (the task backend's)."""

    def spec(self, queue_name: str) -> HandlerSpec | None: ...

    def queues(self) -> Iterable[str]: ...


#: Added at start-up (``ZeroLossConfig.ready``), so this module imports none of them.
_sources: list[QueueSource] = []


def add_queue_source(source: QueueSource) -> None:
    if source not in _sources:
        _sources.append(source)


def get_handler(queue_name: str) -> HandlerSpec:
    """The queue's handler: a ``@zeroloss.handler``, or the task runner of a queue listed by a
    zeroloss task backend in ``TASKS`` (:mod:`zeroloss.tasks_backend`)."""
    spec = _registry.get(queue_name)
    if spec is not None:
        return spec
    for source in _sources:
        spec = source.spec(queue_name)
        if spec is not None:
            return spec
    raise UnknownQueue(queue_name)


def registered_queues() -> list[str]:
    """Handler queues and task queues (``TASKS``), sorted."""
    return sorted({*_registry, *(queue for source in _sources for queue in source.queues())})


def autodiscover() -> None:
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("zeroloss_handlers")
