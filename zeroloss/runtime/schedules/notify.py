"""Tell listening schedulers that the database schedules changed (PostgreSQL NOTIFY).

An idle worker's scheduler reads the schedules only when a tick is due, when told of a change,
or every ``zeroloss.runtime.wakeup.IDLE_POLL`` seconds; every save or delete of a :class:`~.models.Schedule`
through Django (the admin, the ORM, ``zeroloss_schedule``) sends the wake-up, delivered at its
commit. Connected by the app's ``ready()``.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models.signals import post_delete, post_save

from ...ledger.base import engine_for
from ..wakeup import SCHEDULES
from .models import Schedule


def schedules_changed(sender: type[Schedule], using: str, **kwargs: Any) -> None:
    """Wake the listening schedulers at the change's commit (nothing on SQLite: it polls)."""
    conn = connections[using]
    engine_for(conn).wake(conn, [SCHEDULES])


def connect() -> None:
    post_save.connect(schedules_changed, sender=Schedule, dispatch_uid="zeroloss.schedules.saved")
    post_delete.connect(schedules_changed, sender=Schedule, dispatch_uid="zeroloss.schedules.deleted")
