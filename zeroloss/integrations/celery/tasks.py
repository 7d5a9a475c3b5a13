"""Celery tasks. The project's Celery app discovers them (``app.autodiscover_tasks()``), which
looks for exactly this module name (``<app>.tasks``), so it keeps it; Django's own task
framework (django.tasks) is served by :mod:`zeroloss.tasks_backend`, a different thing.

``zeroloss.deliver`` runs one message; ``zeroloss.sweep`` runs the recovery sweep over every
ledger database. Beat schedules the sweep on its own queue (``SWEEP_QUEUE``), so deliveries
queued ahead of it can never delay or starve it; run a worker that consumes that queue
(docs/celery.md).
"""

from __future__ import annotations

import random
from typing import Any

from celery import Task, shared_task
from celery.signals import worker_process_shutdown

from ...core.outage import BACKOFF_MAX, OutageMonitor, close_connection, is_outage
from ...ledger.service import ZeroLossMessageService
from ...runtime.schedules.scheduler import Scheduler
from ...runtime.sweep_loop import SweepLoop
from ...runtime.transports import after_sweep_hooks, ledger_aliases
from ...runtime.worker.transport_runtime import DeliveryRuntime, deliver
from .beat import beat_schedule_entry, scheduler_beat_entry

__all__ = ["beat_schedule_entry", "deliver_message", "schedule", "scheduler_beat_entry", "sweep"]


@shared_task(
    name="zeroloss.deliver",
    bind=True,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,
)
def deliver_message(self: Task, message_id: str, using: str = "default") -> str:
    """Claim, handle and acknowledge one message. Duplicate deliveries are absorbed by the claim.

    With the database unreachable the task is retried (one log line per outage, jittered
    backoff up to 5 s); the message is safe in the ledger meanwhile.
    """

    try:
        return str(deliver(message_id, using))
    except Exception as exc:
        if not is_outage(exc):
            raise
        OutageMonitor.for_alias(using).failed("the Celery delivery task", exc)
        close_connection(using)
        retries = self.request.retries or 0
        countdown = random.uniform(0.05, min(0.1 * 2**retries, BACKOFF_MAX))
        raise self.retry(exc=exc, countdown=countdown) from None


@shared_task(name="zeroloss.sweep", ignore_result=True)
def sweep() -> dict[str, Any]:
    """The recovery sweep of every ledger database, then publish what needs a broker message."""

    totals = {"requeued": 0, "dead_lettered": 0, "redispatched": 0, "released_stranded": 0}
    for alias in ledger_aliases():
        service = ZeroLossMessageService(using=alias)
        report = SweepLoop(service, after_sweep=after_sweep_hooks(service)).run_once()
        totals["requeued"] += len(report.requeued)
        totals["dead_lettered"] += len(report.dead_lettered)
        totals["redispatched"] += len(report.redispatched)
        totals["released_stranded"] += len(report.released_stranded)  # expected 0 (docs/workflows.md)
    return totals


#: One scheduler per ledger database in each worker process: it keeps every schedule's next tick
#: in memory, so a round with nothing due costs one query (the clock read).
_schedulers: dict[str, Any] = {}


@shared_task(name="zeroloss.schedule", ignore_result=True)
def schedule() -> dict[str, Any]:
    """A scheduler round on every ledger database: sends the due ticks (docs/schedules.md)."""

    sent: list[str] = []
    for alias in ledger_aliases():
        scheduler = _schedulers.get(alias)
        if scheduler is None:
            scheduler = _schedulers[alias] = Scheduler(alias, instance_id=f"celery:schedule:{alias}")
        sent += scheduler.run_once().sent
    return {"sent": len(sent)}


@worker_process_shutdown.connect
def _record_waiting_outcomes(**kwargs: Any) -> None:
    """A prefork child that stops (warm shutdown, ``--max-tasks-per-child``) records the outcomes
    still waiting for their batch first; pool children do not run ``atexit`` handlers."""

    DeliveryRuntime.close_all()
