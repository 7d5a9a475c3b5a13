"""Celery tasks. The project's Celery app discovers them (``app.autodiscover_tasks()``)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from .processing import deliver
from .service import ZeroLossMessageService
from .transport import redispatch


@shared_task(name="zeroloss.deliver", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def deliver_message(message_id: str) -> str:
    """Claim, handle and acknowledge one message. Duplicate deliveries are absorbed by the claim."""
    return str(deliver(ZeroLossMessageService(), message_id))


@shared_task(name="zeroloss.sweep", ignore_result=True)
def sweep() -> dict[str, Any]:
    """The recovery sweep, then publish what the sweep requeued and what the broker lost."""
    service = ZeroLossMessageService(instance_id=None)
    report = service.recover_orphaned_messages()
    sent = redispatch(service) if service.settings.TRANSPORT == "celery" else []
    return {
        "requeued": len(report.requeued),
        "dead_lettered": len(report.dead_lettered),
        "redispatched": len(sent),
    }


def beat_schedule_entry(interval: float | None = None) -> dict[str, dict[str, Any]]:
    """The ``beat_schedule`` entry that runs the sweep every ``SWEEP_INTERVAL`` seconds::

    app.conf.beat_schedule = {**zeroloss.tasks.beat_schedule_entry()}
    """
    from .conf import get_settings

    seconds = interval if interval is not None else get_settings().SWEEP_INTERVAL
    return {
        "zeroloss-sweep": {"task": "zeroloss.sweep", "schedule": seconds, "options": {"expires": seconds * 2}}
    }
