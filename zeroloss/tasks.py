"""Celery tasks. The project's Celery app discovers them (``app.autodiscover_tasks()``)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from .loops import SweepLoop
from .processing import deliver
from .schedule import beat_schedule_entry
from .service import ZeroLossMessageService

__all__ = ["beat_schedule_entry", "deliver_message", "sweep"]


@shared_task(name="zeroloss.deliver", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def deliver_message(message_id: str) -> str:
    """Claim, handle and acknowledge one message. Duplicate deliveries are absorbed by the claim."""
    return str(deliver(ZeroLossMessageService(), message_id))


@shared_task(name="zeroloss.sweep", ignore_result=True)
def sweep() -> dict[str, Any]:
    """The recovery sweep, then publish what it requeued and what the broker lost."""
    report = SweepLoop(ZeroLossMessageService()).run_once()
    return {
        "requeued": len(report.requeued),
        "dead_lettered": len(report.dead_lettered),
        "redispatched": len(report.redispatched),
    }
