"""The Celery transport: a task per message after commit; the sweep publishes again what was lost.

Publishing never holds up the ledger: it runs after the caller's commit (one callback per
transaction, whatever it sent), over one broker connection whose every wait is bounded
(``PUBLISH_TIMEOUT``: connect and socket timeouts, no retries). After the first failure the
rest are marked undispatched without trying each, and the sweep publishes them again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

from django.db import connections

from ...exceptions import InvalidMessage
from ...ledger.models import Message
from ...ledger.service import ZeroLossMessageService
from ...ledger.types import RecoveryReport
from ...runtime.transports import ledger_aliases
from .. import telemetry
from .app import project_app

logger = logging.getLogger("zeroloss")

#: The delivery task's name (``zeroloss.tasks.deliver_message``).
DELIVER_TASK = "zeroloss.deliver"


class _Outbox:
    """The messages one transaction sent; published together once it commits."""

    def __init__(self, service: ZeroLossMessageService) -> None:
        self.service = service
        self.items: list[tuple[str, float]] = []

    def flush(self) -> None:
        items, self.items = self.items, []
        publish(self.service, items)


class CeleryTransport:
    name = "celery"

    def before_send(self, service: ZeroLossMessageService) -> None:
        project_app(sending=True)  # CeleryAppNotConfigured before anything is stored
        if service.using not in ledger_aliases():
            raise InvalidMessage(
                f"Database {service.using!r} is not in ZEROLOSS['LEDGER_DATABASES'] "
                f"{list(service.settings.LEDGER_DATABASES)}: the Celery sweep would never recover its messages. "
                "Add it there; nothing was stored."
            )

    def after_commit(self, service: ZeroLossMessageService, messages: Sequence[Message]) -> None:
        items = [(m.message_id, _countdown(service, m)) for m in messages if m.available_at is not None]
        if not items:
            return  # waiting behind an ordering key: published when its turn comes (by the sweep)
        conn = service.connection
        if not conn.in_atomic_block:
            publish(service, items)
            return
        outbox: _Outbox | None = vars(conn).get("_zeroloss_outbox")
        pending = outbox is not None and any(entry[1] == outbox.flush for entry in conn.run_on_commit)
        if outbox is None or not pending or outbox.service.using != service.using:
            outbox = vars(conn)["_zeroloss_outbox"] = _Outbox(service)
            conn.on_commit(outbox.flush)
        outbox.items += items

    def after_sweep(self, service: ZeroLossMessageService, report: RecoveryReport) -> RecoveryReport:
        """Publish again what no broker message is known to carry (after, never during, the sweep)."""

        with telemetry.operation("redispatch"):
            return dataclasses.replace(report, redispatched=redispatch(service))


def _countdown(service: ZeroLossMessageService, message: Message) -> float:
    if message.available_at is None or message.created_at is None:
        return 0.0
    return max((message.available_at - message.created_at).total_seconds(), 0.0)


def _connection_options(app: Any, budget: float) -> dict[str, Any]:
    options = dict(app.conf.broker_transport_options or {})
    # Redis (redis-py) and AMQP (py-amqp) spell their socket timeouts differently.
    options.update(
        socket_timeout=budget,
        socket_connect_timeout=budget,
        read_timeout=budget,
        write_timeout=budget,
        max_retries=0,
    )
    return {"connect_timeout": budget, "transport_options": options}


def publish(service: ZeroLossMessageService, items: Sequence[tuple[str, float]]) -> list[str]:
    """Publish a delivery task per ``(message_id, countdown)``; returns the ids sent.

    Every wait on the broker (connecting, each send) is bounded by ``PUBLISH_TIMEOUT``; the
    first failure ends the batch, and the rest are recorded as undispatched without trying
    each (the next sweep publishes them).
    """
    if not items:
        return []
    budget = service.settings.PUBLISH_TIMEOUT
    sent: list[str] = []
    try:
        app = project_app()  # never Celery's own default app: that is a broker nobody consumes
        with app.connection_for_write(**_connection_options(app, budget)) as conn:
            conn.ensure_connection(max_retries=1, timeout=math.ceil(budget))
            producer = app.amqp.Producer(conn, auto_declare=False)
            for message_id, countdown in items:
                options: dict[str, Any] = {"countdown": countdown} if countdown else {}
                # By name (zeroloss.tasks.deliver_message), routed like any task of that name.
                app.send_task(
                    DELIVER_TASK, args=(message_id, service.using), producer=producer, retry=False, **options
                )
                sent.append(message_id)
    except Exception as exc:  # the broker is down or hung: the ledger keeps every message
        failed = [mid for mid, _ in items if mid not in set(sent)]
        logger.warning(
            "could not publish %d message(s) (%s: %s); the sweep publishes them again",
            len(failed),
            type(exc).__name__,
            exc,
        )
        _mark_undispatched(service, failed)
    return sent


def _mark_undispatched(service: ZeroLossMessageService, message_ids: list[str]) -> None:
    try:
        service.mark_dispatched(message_ids, dispatched=False)
    except Exception as exc:  # the ledger too is unreachable: the grace period covers it
        logger.warning("could not record %d undispatched message(s): %s", len(message_ids), exc)
        connections[service.using].close()


def redispatch(service: ZeroLossMessageService, *, limit: int = 1000) -> list[str]:
    """Publish again every pending message that no broker message is known to carry.

    Candidates are stamped *before* publishing: one claimed and failed while it is being
    published is changed after the stamp, so it stays a candidate (it needs a new task).
    """
    candidates = service.dispatch_candidates(limit=limit)
    if not candidates:
        return []
    service.mark_dispatched([mid for mid, _, _ in candidates])
    return publish(service, [(mid, 0.0) for mid, _, _ in candidates])
