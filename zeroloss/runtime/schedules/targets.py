"""What a schedule's tick sends: the schedules read (settings, then the database's), each one's
target (a queue and payload, or a task through its zeroloss backend), and the ticks' messages
stored (one batch per kind, a tick the ledger refuses logged, never retried)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from ...exceptions import InvalidMessage, MessageConflict
from ...ledger.service import ZeroLossMessageService
from ..handlers import default_max_attempts
from .models import Schedule
from .spec import ScheduleError, ScheduleSpec, parse_schedule, resolve_task, settings_schedules

logger = logging.getLogger("zeroloss")


def load_schedules(using: str = "default", *, check_targets: bool = True) -> dict[str, ScheduleSpec]:
    """Settings schedules, then the database's (a settings name wins). Invalid settings raise
    :class:`ScheduleError`; an invalid database row (edited behind the admin's back) is logged and
    left out, since one bad row must not stop every other schedule."""
    specs = settings_schedules(check_targets=check_targets)
    for row in Schedule.objects.using(using).all():
        if row.name in specs:
            logger.warning("schedule %r is defined in settings and in the database; settings win", row.name)
            continue
        try:
            specs[row.name] = parse_schedule(
                row.name, row.as_raw(), source="database", check_targets=check_targets
            )
        except ScheduleError as exc:
            logger.error("database schedule %r ignored: %s", row.name, exc)
    return specs


@dataclass(frozen=True)
class Target:
    queue: str
    payload: Any
    max_attempts: int | None
    priority: int
    ordering_key: str


def resolve_target(spec: ScheduleSpec) -> Target:
    """Queue, payload and options of a tick's message (a task's: through its zeroloss backend)."""
    if spec.task is None:
        # The handler's max_attempts, as send() gives it (None: MAX_ATTEMPTS).
        return Target(
            spec.queue, spec.payload, default_max_attempts(spec.queue), spec.priority, spec.ordering_key
        )
    task = resolve_task(spec.task)
    backend = task.get_backend()
    if not getattr(backend, "is_zeroloss_backend", False):
        raise ScheduleError(
            spec.name,
            "task",
            f"task {spec.task!r} does not use a zeroloss task backend.",
            "zeroloss.E057",
        )
    backend.validate_task(task)
    payload = backend._payload(task, spec.args, spec.kwargs)
    priority = spec.priority or int(task.priority)
    return Target(task.queue_name, payload, backend.max_attempts_for(task), priority, spec.ordering_key)


def persist_ticks(
    service: ZeroLossMessageService,
    using: str,
    batch: list[tuple[str, str, Any]],
    max_attempts: int | None,
    priority: int,
    ordering_key: str,
) -> list[Any]:
    """Store the ticks' messages of one kind in one batch (a tick stored already, or refused by
    the ledger, then one at a time)."""
    dispatched = service.settings.TRANSPORT == "celery"
    options = {
        "max_attempts": max_attempts,
        "priority": priority,
        "ordering_key": ordering_key,
        "dispatched": dispatched,
    }
    try:
        with transaction.atomic(using=using):
            return service.persist_messages(batch, **options)  # type: ignore[arg-type]
    except (MessageConflict, InvalidMessage):
        pass
    # One tick at a time, so one cannot hold back the others: a tick stored earlier with
    # another payload (the schedule was edited while another scheduler sent it) was sent;
    # one the ledger refuses (a payload over MAX_PAYLOAD_BYTES, ...) is logged, not retried.
    stored = []
    for item in batch:
        try:
            with transaction.atomic(using=using):
                stored += service.persist_messages([item], **options)  # type: ignore[arg-type]
        except MessageConflict:
            logger.warning("schedule tick %s was already sent with another payload", item[0])
        except InvalidMessage as exc:
            logger.error("schedule tick %s refused by the ledger, not sent: %s", item[0], exc)
    return stored
