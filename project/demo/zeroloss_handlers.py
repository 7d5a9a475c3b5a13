"""The example project's handlers (used by the demo and by the tests' real workers).

Each run writes a ``HandledRecord``: the handlers' own record of what ran, which the demo
and the tests compare with the ledger to count lost and twice-handled messages.
"""

from __future__ import annotations

import os
import time

import zeroloss
from zeroloss.runtime.processing import Delivery

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


def _until_aborted(delivery: Delivery) -> None:
    """Loop until the message is aborted (at most ``limit`` seconds), then write to the file
    ``out`` when it started and when it saw the abort (its own clock): the abort tests' log.
    A file, not a row: a transactional handler's rows roll back with it."""
    import json
    from pathlib import Path

    payload = delivery.payload
    out = Path(payload["out"])
    started = time.time()
    Path(f"{out}.started").write_text(str(started))
    deadline = started + float(payload.get("limit", 60))
    while not delivery.abort_requested and time.time() < deadline:
        time.sleep(0.01)
    seen = time.time() if delivery.abort_requested else None
    Path(f"{out}.tmp").write_text(json.dumps({"started": started, "seen": seen, "pid": os.getpid()}))
    Path(f"{out}.tmp").replace(out)
    if payload.get("raise"):
        delivery.raise_if_abort_requested()


@zeroloss.handler("demo.abortable")
def abortable(delivery: Delivery) -> None:
    """Runs until aborted (zeroloss_cancel --abort); see _until_aborted."""
    _until_aborted(delivery)


@zeroloss.handler("demo.abortable_tx", transactional=True)
def abortable_tx(delivery: Delivery) -> None:
    """Writes a record in its transaction, then runs until aborted: the record must roll back."""
    HandledRecord.objects.create(
        message_id=delivery.message_id, queue_name=delivery.queue_name, worker=f"{os.getpid()}"
    )
    _until_aborted(delivery)


@zeroloss.handler("demo.abortable_async")
async def abortable_async(delivery: Delivery) -> None:
    """The same, awaited: the abort reaches an async handler through the same delivery."""
    import asyncio

    from asgiref.sync import sync_to_async

    limit = time.time() + float(delivery.payload.get("limit", 60))
    while not delivery.abort_requested and time.time() < limit:
        await asyncio.sleep(0.01)
    await sync_to_async(_until_aborted)(delivery)  # writes the log (the abort already seen)
