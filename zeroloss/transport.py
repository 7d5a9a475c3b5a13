"""Durable send and (re)dispatch: the database is the record, the broker only a transport."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction

from .handlers import get_handler
from .models import Message
from .service import ZeroLossMessageService

logger = logging.getLogger("zeroloss")


def send(
    queue_name: str,
    data: Any,
    *,
    message_id: str | None = None,
    max_attempts: int | None = None,
    delay: float | dt.timedelta | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Message:
    """Persist a message in the caller's transaction; publish it to the broker after commit.

    If the surrounding transaction rolls back, the message never existed and nothing is
    published. If the broker is down at commit time, the message is still stored and the
    sweep publishes it later. With ``TRANSPORT = "database"`` nothing is published: the
    built-in worker polls the ledger.
    """
    get_handler(queue_name)  # fail fast on a typo: UnknownQueue
    service = ZeroLossMessageService(using=using)
    celery = service.settings.TRANSPORT == "celery"
    message = service.persist_message(
        message_id or uuid.uuid4().hex,
        queue_name,
        data,
        max_attempts,
        delay=delay,
        dispatched=celery,
    )
    if celery:
        countdown = 0.0
        if delay:
            countdown = delay.total_seconds() if isinstance(delay, dt.timedelta) else float(delay)
        mid = message.message_id
        transaction.on_commit(lambda: publish(service, [(mid, queue_name, countdown)]), using=using)
    return message


def publish(service: ZeroLossMessageService, items: Sequence[tuple[str, str, float]]) -> list[str]:
    """Publish a delivery task per ``(message_id, queue_name, countdown)``; returns the ids sent.

    A publish that fails is logged and recorded as undispatched, so the next sweep retries it.
    """
    from .tasks import deliver_message

    sent: list[str] = []
    failed: list[str] = []
    for message_id, _queue, countdown in items:
        try:
            deliver_message.apply_async(args=(message_id,), countdown=countdown, retry=False)
        except Exception as exc:  # the broker is down: the ledger keeps the message
            logger.warning("could not publish %s (%s); the sweep will publish it again", message_id, exc)
            failed.append(message_id)
        else:
            sent.append(message_id)
    if failed:
        service.mark_dispatched(failed, dispatched=False)
    return sent


def redispatch(service: ZeroLossMessageService, *, limit: int = 1000) -> list[str]:
    """Publish again every pending message that no broker message is known to carry."""
    candidates = service.dispatch_candidates(limit=limit)
    if not candidates:
        return []
    sent = publish(service, candidates)
    service.mark_dispatched(sent)
    return sent
