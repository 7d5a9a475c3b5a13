"""Sending messages, and the transport that carries them to workers.

The database is the record; a transport only tells workers that a message is ready:

- ``"database"`` (:mod:`.database`): workers find messages in the ledger themselves
  (``zeroloss_worker``), woken by PostgreSQL NOTIFY;
- ``"celery"`` (:mod:`.celery`): a Celery task is published after commit, and the sweep
  publishes again whatever a broker lost.

:func:`send` stores a message in the caller's transaction whatever the transport;
:func:`after_sweep_hooks` gives the sweep what the configured transport needs after it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, connections

from ...core.settings import get_settings
from ...exceptions import InvalidHeaders, InvalidMessage, UnknownQueue
from ...ledger import events
from ...ledger.models import Message
from ...ledger.service import ZeroLossMessageService
from ...ledger.types import RecoveryReport
from .. import retention
from ..handlers import default_max_attempts, get_handler
from ..sweep_loop import discover_standbys
from .database import DatabaseTransport

__all__ = [
    "Transport",
    "after_sweep_hooks",
    "asend",
    "database_for",
    "get_transport",
    "ledger_aliases",
    "register_transport",
    "send",
    "send_many",
]


class Transport(Protocol):
    name: str

    def before_send(self, service: ZeroLossMessageService) -> None:
        """Refuse, before anything is stored, a message this transport could not deliver."""

    def after_commit(self, service: ZeroLossMessageService, messages: Sequence[Message]) -> None:
        """Messages were stored in the current transaction; tell workers once it commits."""

    def after_sweep(self, service: ZeroLossMessageService, report: RecoveryReport) -> RecoveryReport:
        """Runs after every sweep (see :class:`zeroloss.runtime.sweep_loop.SweepLoop`)."""
        ...


#: The transports by ``TRANSPORT`` value. The Celery one, a layer above, is registered by the
#: app's ``ready()`` (:func:`register_transport`).
TRANSPORTS: dict[str, Callable[[], Transport]] = {"database": DatabaseTransport}


def register_transport(name: str, factory: Callable[[], Transport]) -> None:
    TRANSPORTS[name] = factory


def get_transport(service: ZeroLossMessageService) -> Transport:
    return TRANSPORTS[service.settings.TRANSPORT]()


def ledger_aliases() -> list[str]:
    """Every database alias that holds a ledger: ``LEDGER_DATABASES`` and every database
    ``QUEUE_DATABASES`` routes to. The beat sweep covers each."""

    settings = get_settings()
    return list(dict.fromkeys([*settings.LEDGER_DATABASES, *settings.QUEUE_DATABASES.values()]))


def database_for(queue_name: str, using: str | None = None) -> str:
    """The database alias holding ``queue_name``'s ledger (``QUEUE_DATABASES``), or ``using``.

    An explicit ``using`` that disagrees with the queue's route is refused: the message would
    land where no worker of that queue looks.
    """

    routed = get_settings().QUEUE_DATABASES.get(queue_name, DEFAULT_DB_ALIAS)
    if using is not None and using != routed:
        raise InvalidMessage(
            f"Queue {queue_name!r} lives in database {routed!r} (ZEROLOSS['QUEUE_DATABASES']), not {using!r}; "
            "nothing was stored."
        )
    return routed


def _check_queue(queue_name: str) -> None:
    """A queue with a handler in this process, or declared in ``ZEROLOSS["QUEUES"]`` (a web
    process sending to workers whose handlers it does not import); else :class:`UnknownQueue`."""

    try:
        get_handler(queue_name)
    except UnknownQueue:
        if queue_name not in get_settings().QUEUES:
            raise


def _check_transaction(alias: str) -> None:
    """Refuse to store a message outside a transaction the caller is in (on another database):
    it would commit at once, whatever became of the caller's transaction."""

    if connections[alias].in_atomic_block:
        return
    for conn in connections.all(initialized_only=True):
        if conn.alias != alias and conn.in_atomic_block:
            raise InvalidMessage(
                f"This message's ledger is database {alias!r}, but the caller is in a transaction on "
                f"{conn.alias!r}: it would be committed at once, outside that transaction. Send it inside "
                f"transaction.atomic(using={alias!r}) (committed with it), or outside any transaction; "
                "nothing was stored."
            )


def after_sweep_hooks(service: ZeroLossMessageService) -> list[Any]:
    """What runs after each sweep: the transport's (Celery: publish again), standby discovery,
    the retention turn (:mod:`zeroloss.runtime.retention`)."""

    hooks: list[Any] = [get_transport(service).after_sweep]
    if service.engine.supports_replication:
        hooks.append(discover_standbys)
    hooks.append(retention.after_sweep)
    return hooks


def send(
    queue_name: str,
    data: Any,
    *,
    message_id: str | None = None,
    max_attempts: int | None = None,
    delay: float | dt.timedelta | None = None,
    priority: int = 0,
    ordering_key: str = "",
    dedup_key: str = "",
    dedup_window: float | dt.timedelta | None = None,
    headers: dict[str, Any] | None = None,
    using: str | None = None,
) -> Message:
    """Persist a message in the caller's transaction; the transport carries it after commit.

    If the surrounding transaction rolls back, the message never existed and nothing is
    published. The queue's ledger database comes from ``QUEUE_DATABASES`` (``default``
    otherwise); a send inside a transaction on another database is refused rather than
    committed outside it. Bad input raises a :class:`~zeroloss.exceptions.ZeroLossError` and stores
    nothing; a database that cannot be reached raises Django's ``OperationalError``, one whose disk
    is full :class:`~zeroloss.exceptions.StorageFull` (an ``OperationalError`` too): the message
    was not accepted — unless the connection died during COMMIT, when it may have been stored.
    Either way, retry with the same ``message_id``: persisting is idempotent.

    ``headers``: metadata for the handler (``delivery.headers``), such as trace and correlation
    ids: a dict of names to JSON values, stored with the message but not part of its checksum (a
    resend with other headers is the same message: the stored one is returned).
    """
    _check_queue(queue_name)  # fail fast on a typo: UnknownQueue
    alias = database_for(queue_name, using)
    _check_transaction(alias)
    service = ZeroLossMessageService(using=alias)
    get_transport(service).before_send(service)
    with events.tracer().send_span(queue_name, 1) as span:  # PRODUCER: its context goes into the headers
        message = service.persist_message(
            message_id or uuid.uuid4().hex,
            queue_name,
            data,
            default_max_attempts(queue_name) if max_attempts is None else max_attempts,
            delay=delay,
            priority=priority,
            ordering_key=ordering_key,
            dedup_key=dedup_key,
            dedup_window=dedup_window,
            dispatched=service.settings.TRANSPORT == "celery",
            headers=span.headers(headers),
        )
        span.stored([message])
    get_transport(service).after_commit(service, [message])
    if events.wanted(events.Sent):
        _signal_sent(service, [message])
    return message


def send_many(
    queue_name: str,
    payloads: Iterable[Any],
    *,
    message_ids: Iterable[str] | None = None,
    max_attempts: int | None = None,
    delay: float | dt.timedelta | None = None,
    priority: int = 0,
    ordering_key: str = "",
    headers: dict[str, Any] | Iterable[dict[str, Any] | None] | None = None,
    using: str | None = None,
) -> list[Message]:
    """Persist many messages of one queue in the caller's transaction, all or nothing.

    Each payload is validated, hashed and made idempotent exactly as by :func:`send`; one bad
    payload raises an error naming its position and nothing is stored. ``headers``: one dict for
    every message, or one dict (or None) per payload, in order, like ``message_ids``.
    """

    _check_queue(queue_name)
    data = list(payloads)
    ids = [uuid.uuid4().hex for _ in data] if message_ids is None else list(message_ids)
    if len(ids) != len(data):
        raise InvalidMessage(
            f"send_many got {len(ids)} message ids for {len(data)} payloads; nothing was stored."
        )
    with events.tracer().send_span(queue_name, len(data)) as span:  # one PRODUCER span for the batch
        service, messages = _send_many(
            queue_name, data, ids, headers, span, using, max_attempts, delay, priority, ordering_key
        )
    if events.wanted(events.Sent):
        _signal_sent(service, messages)
    return messages


def _send_many(
    queue_name: str,
    data: list[Any],
    ids: list[str],
    headers: Any,
    span: Any,
    using: str | None,
    max_attempts: int | None,
    delay: float | dt.timedelta | None,
    priority: int,
    ordering_key: str,
) -> tuple[ZeroLossMessageService, list[Message]]:

    items: list[tuple[Any, ...]]
    if headers is None or isinstance(headers, dict):
        headers = span.headers(headers)
    if headers is None:
        items = [(mid, queue_name, payload) for mid, payload in zip(ids, data, strict=True)]
    elif isinstance(headers, dict):
        items = [(mid, queue_name, payload, headers) for mid, payload in zip(ids, data, strict=True)]
    elif isinstance(headers, str | bytes):
        raise InvalidHeaders(
            f"send_many's headers must be a dict (one for every message) or one dict per payload, "
            f"got {type(headers).__name__}; nothing was stored."
        )
    else:
        each = list(headers)
        if len(each) != len(data):
            raise InvalidMessage(
                f"send_many got {len(each)} headers for {len(data)} payloads (one dict for all, or one "
                "per payload); nothing was stored."
            )
        items = [(mid, queue_name, p, span.headers(h)) for mid, p, h in zip(ids, data, each, strict=True)]
    alias = database_for(queue_name, using)
    _check_transaction(alias)
    service = ZeroLossMessageService(using=alias)
    get_transport(service).before_send(service)
    messages = service.persist_messages(
        items,
        max_attempts=default_max_attempts(queue_name) if max_attempts is None else max_attempts,
        delay=delay,
        priority=priority,
        ordering_key=ordering_key,
        dispatched=service.settings.TRANSPORT == "celery",
    )
    get_transport(service).after_commit(service, messages)
    span.stored(messages)
    return service, messages


def _signal_sent(service: ZeroLossMessageService, messages: Sequence[Message]) -> None:
    """``message_sent`` for each message, once the caller's transaction committed."""
    service.context.emit([events.Sent(m.message_id, m.queue_name, service.using) for m in messages])


async def asend(queue_name: str, data: Any, **kwargs: Any) -> Message:
    """:func:`send` for async code. It runs in Django's sync thread in its own transaction, so
    the message is committed when it returns (async code cannot hold ``transaction.atomic``
    across awaits; to store a message with other writes atomically, do both inside one
    function run through ``sync_to_async``)."""
    return await sync_to_async(send, thread_sensitive=True)(queue_name, data, **kwargs)
