"""Each handler records ``<what>:<pid>`` in a ``HandledRecord`` (``worker``), committed at once."""

from __future__ import annotations

import os
import time

from asgiref.sync import sync_to_async

import zeroloss
from project.demo.models import HandledRecord, OrderedRun
from tests.support.waiting import NEVER, never_done
from zeroloss.runtime.processing import Delivery


def note(delivery: Delivery, what: str) -> None:
    HandledRecord.objects.create(
        message_id=delivery.message_id, queue_name=delivery.queue_name, worker=f"{what}:{os.getpid()}"
    )


@zeroloss.handler("tl.record")
def record(delivery: Delivery) -> None:
    note(delivery, "ran")


@zeroloss.handler("tl.hang", time_limit=1.0)
def hang(delivery: Delivery) -> None:
    """``{"hang": true}``: never returns on its own (a blocking call the soft limit cannot stop)."""
    note(delivery, "started")
    if isinstance(delivery.payload, dict) and delivery.payload.get("hang"):
        NEVER.wait()
    note(delivery, "ran")


@zeroloss.handler("tl.soft", soft_time_limit=0.5, time_limit=30)
def soft(delivery: Delivery) -> None:
    """Blocked in a call; SIGUSR1's SoftTimeLimitExceeded ends it; it cleans up, returns."""
    try:
        NEVER.wait(60)
    except zeroloss.SoftTimeLimitExceeded:
        note(delivery, "soft")


@zeroloss.handler("tl.soft_raise", soft_time_limit=0.5, time_limit=30)
def soft_raise(delivery: Delivery) -> None:
    note(delivery, "started")
    NEVER.wait(60)  # SoftTimeLimitExceeded propagates: a failed attempt


@zeroloss.handler("tl.async_soft", soft_time_limit=0.5, time_limit=30)
async def async_soft(delivery: Delivery) -> None:
    try:
        await never_done()
    except zeroloss.SoftTimeLimitExceeded:
        await sync_to_async(note)(delivery, "soft")


@zeroloss.handler("tl.exit")
def exits(delivery: Delivery) -> None:
    """``{"exit": true}``: the process dies under the handler on its first attempt."""
    if isinstance(delivery.payload, dict) and delivery.payload.get("exit") and delivery.attempt == 1:
        os._exit(3)
    note(delivery, "ran")


@zeroloss.handler("tl.forever")
def forever(delivery: Delivery) -> None:
    """No time limit: runs until its process is killed."""
    note(delivery, "started")
    NEVER.wait()


@zeroloss.handler("tl.stubborn", soft_time_limit=0.5, time_limit=1.5)
def stubborn(delivery: Delivery) -> None:
    """Catches its soft limit and hangs on regardless: the hard limit has to kill it."""
    try:
        NEVER.wait(60)
    except zeroloss.SoftTimeLimitExceeded:
        note(delivery, "soft")
    NEVER.wait()


@zeroloss.handler("tl.spin")
def spin(delivery: Delivery) -> None:
    """Pure Python, in steps of 5 ms: the first attempt for up to 120 s, a later one for 3 s.
    Its ``OrderedRun`` (``worker``: the pid) records when it started and, however it ended
    (returned, or stopped by an exception), when it ended."""
    run = OrderedRun.objects.create(
        message_id=delivery.message_id, ordering_key="", worker=str(os.getpid()), started=time.time()
    )
    until = time.monotonic() + (120 if delivery.attempt == 1 else 3)
    try:
        while time.monotonic() < until:
            time.sleep(0.005)
    finally:
        OrderedRun.objects.filter(pk=run.pk).update(finished=time.time())
