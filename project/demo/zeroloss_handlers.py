"""The example project's handlers (used by the demo and by the tests' real workers).

Each run writes a ``HandledRecord``: the handlers' own record of what ran, which the demo
and the tests compare with the ledger to count lost and twice-handled messages.
"""

from __future__ import annotations

import os
import time

import zeroloss
from zeroloss.processing import Delivery

from .models import HandledRecord


def _record(delivery: Delivery) -> None:
    payload = delivery.payload if isinstance(delivery.payload, dict) else {}
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    if payload.get("fail"):
        raise RuntimeError(f"{delivery.message_id}: this message always fails (payload asked for it)")
    HandledRecord.objects.create(
        message_id=delivery.message_id, queue_name=delivery.queue_name, worker=f"{os.getpid()}"
    )


@zeroloss.handler("demo.record")
def record(delivery: Delivery) -> None:
    """At-least-once: the record commits before the acknowledgement."""
    _record(delivery)


@zeroloss.handler("demo.record_tx", transactional=True)
def record_tx(delivery: Delivery) -> None:
    """Exactly-once effects: the record commits in the acknowledgement's transaction."""
    _record(delivery)


@zeroloss.handler("demo.orders", transactional=True)
def book_order(delivery: Delivery) -> None:
    """The demo's orders: the booking commits with the acknowledgement."""
    _record(delivery)


@zeroloss.handler("demo.emails", transactional=True)
def send_email(delivery: Delivery) -> None:
    """The demo's emails: some payloads always fail, to show the dead-letter path."""
    _record(delivery)


@zeroloss.handler("demo.ordered")
def ordered(delivery: Delivery) -> None:
    """Records its start and its end (each committed at once): the ordering tests' own log."""
    from .models import OrderedRun

    payload = delivery.payload if isinstance(delivery.payload, dict) else {}
    run = OrderedRun.objects.create(
        message_id=delivery.message_id,
        ordering_key=delivery.lease.ordering_key,
        worker=f"{os.getpid()}",
        started=time.time(),
    )
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    if payload.get("fail"):
        raise RuntimeError(f"{delivery.message_id}: this head always fails (payload asked for it)")
    OrderedRun.objects.filter(pk=run.pk).update(finished=time.time())
