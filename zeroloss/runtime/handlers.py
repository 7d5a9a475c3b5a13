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

    @zeroloss.handler("webhooks", max_attempts=10, backoff=zeroloss.FixedBackoff(30), dont_retry_on=(KeyError,))
    def deliver(delivery):
        ...  # its retry policy (zeroloss.runtime.retry, docs/handlers.md)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from asgiref.sync import iscoroutinefunction
from django.utils.module_loading import autodiscover_modules

from ..exceptions import InvalidHandler, InvalidMessage, UnknownQueue
from ..ledger.validation import MAX_ATTEMPTS_LIMIT, validate_queue_name
from .retry import Backoff
from .timelimits import validate_limits

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
    #: setting). See :mod:`zeroloss.runtime.timelimits`.
    time_limit: float | None = None
    #: What a log record calls the code a message (its payload) runs (None: ``handler
    #: <module.function>``): a task queue's names the task, not the runner that calls it.
    describe: Callable[[Any], str] | None = None
    #: Attempts before its messages are dead-lettered, for a message sent without
    #: ``max_attempts`` (None: ``ZEROLOSS["MAX_ATTEMPTS"]``). Applied when the message is stored.
    max_attempts: int | None = None
    #: The delay after a failed attempt: a callable of the attempt number (None: ``RETRY_BACKOFF``).
    backoff: Backoff | None = None
    #: Only these exceptions are retried (empty: every one); any other is dead-lettered at once.
    retry_on: tuple[type[BaseException], ...] = ()
    #: These exceptions are dead-lettered at once, never retried (before ``retry_on``).
    dont_retry_on: tuple[type[BaseException], ...] = ()
    #: ``async def`` (or an object whose ``__call__`` is): awaited on an event loop, never called bare.
    is_async: bool = field(init=False, default=False)

    def __post_init__(self) -> None:

        object.__setattr__(self, "is_async", is_coroutine_function(self.func))
        what = f"{self.name} of queue {self.queue_name!r}"
        validate_limits(what, self.soft_time_limit, self.time_limit)
        _validate_policy(what, self)

    def retried(self, exc: BaseException) -> bool:
        """Whether its policy retries ``exc`` (``dont_retry_on`` first, then ``retry_on``)."""
        if self.dont_retry_on and isinstance(exc, self.dont_retry_on):
            return False
        return not self.retry_on or isinstance(exc, self.retry_on)

    @property
    def has_policy(self) -> bool:
        return bool(
            self.max_attempts is not None or self.backoff is not None or self.retry_on or self.dont_retry_on
        )

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


def _validate_policy(what: str, spec: HandlerSpec) -> None:
    """A retry policy it cannot honour is refused at registration (:class:`InvalidHandler`)."""

    n = spec.max_attempts
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ATTEMPTS_LIMIT):
        raise InvalidHandler(
            f"Handler {what}: max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, got {n!r}."
        )
    if spec.backoff is not None and not callable(spec.backoff):
        raise InvalidHandler(
            f"Handler {what}: backoff must be a callable of the failed attempt's number returning seconds "
            f"(or zeroloss.ExponentialBackoff(...) / zeroloss.FixedBackoff(...)), got {spec.backoff!r}."
        )
    for name in ("retry_on", "dont_retry_on"):
        value = getattr(spec, name)
        if not isinstance(value, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in value
        ):
            raise InvalidHandler(
                f"Handler {what}: {name} must be a tuple of exception classes, got {value!r}."
            )


def is_coroutine_function(func: Any) -> bool:
    """``async def`` functions, ``functools.partial`` of one, and objects with an async ``__call__``."""

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
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
    dont_retry_on: tuple[type[BaseException], ...] = (),
) -> Callable[[F], F]:
    """Register the decorated callable as the handler of ``queue_name``.

    ``soft_time_limit`` raises :class:`~zeroloss.SoftTimeLimitExceeded` in the handler;
    ``time_limit`` overrides ``HANDLER_TIMEOUT`` for it (both seconds; soft < hard, else
    :class:`~zeroloss.exceptions.InvalidHandler`).

    Its retry policy (docs/handlers.md#retry-policy): ``max_attempts`` for messages sent without
    one (else ``MAX_ATTEMPTS``); ``backoff``, a callable of the failed attempt's number returning
    the seconds before the next (:class:`~zeroloss.ExponentialBackoff`,
    :class:`~zeroloss.FixedBackoff`; else ``RETRY_BACKOFF``); ``retry_on``: only these exceptions
    are retried; ``dont_retry_on``: these are dead-lettered at once."""

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
            max_attempts=max_attempts,
            backoff=backoff,
            retry_on=retry_on,
            dont_retry_on=dont_retry_on,
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


def default_max_attempts(queue_name: str) -> int | None:
    """The ``max_attempts`` of the queue's handler in this process, if it sets one (a message sent
    without its own gets it; else ``MAX_ATTEMPTS``)."""
    spec = _registry.get(queue_name)
    if spec is None:
        for source in _sources:
            spec = source.spec(queue_name)
            if spec is not None:
                break
    return None if spec is None else spec.max_attempts


def registered_queues() -> list[str]:
    """Handler queues and task queues (``TASKS``), sorted."""
    return sorted({*_registry, *(queue for source in _sources for queue in source.queues())})


def autodiscover() -> None:

    autodiscover_modules("zeroloss_handlers")
