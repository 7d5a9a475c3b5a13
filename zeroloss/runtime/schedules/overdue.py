"""Schedules whose tick is overdue: no scheduler is sending them.

A live scheduler (every ``zeroloss_worker``, ``zeroloss_schedule --loop``, or beat's
``zeroloss.schedule`` entry) runs a round every ``SCHEDULE_INTERVAL`` seconds and sends each
tick within about that. So a tick still unsent :func:`grace` seconds after its time means that
no scheduler is running for its database: ``zeroloss_status``, the health endpoint and the
admin's dashboard report it.

Read from the state rows (:class:`.models.ScheduleState`), by the database clock:

- a schedule that has sent a tick: its next tick after ``last_tick``;
- one a scheduler has seen (its state row, created when a scheduler loads it) but not yet
  ticked: its first tick after then;
- one no scheduler has ever seen (no state row): its first tick in the last :data:`LOOKBACK`
  (after the row's last edit, for a database schedule), since nothing tells when it was added.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ...core.durations import format_duration
from ...core.settings import get_settings
from ..transports import database_for
from .models import Schedule, ScheduleState
from .scheduler import load_schedules
from .spec import ScheduleError
from .ticks import next_tick

#: The least grace: a round every SCHEDULE_INTERVAL, a busy worker, a database hiccup.
MIN_GRACE = 60.0

#: How far back a schedule no scheduler has seen is judged from.
LOOKBACK = dt.timedelta(days=1)


@dataclass(frozen=True)
class OverdueSchedule:
    """A schedule whose tick ``due`` was not sent ``late`` seconds after its time."""

    name: str
    due: dt.datetime
    late: float
    #: Whether any scheduler has ever loaded this schedule (False: it has a state row of none).
    seen: bool

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "due": self.due.isoformat(), "late": self.late, "seen": self.seen}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OverdueSchedule:
        return cls(
            data["name"], dt.datetime.fromisoformat(data["due"]), float(data["late"]), bool(data["seen"])
        )

    def describe(self) -> str:

        why = "" if self.seen else ", never loaded by a scheduler"
        return f"schedule {self.name!r}: tick {self.due.isoformat()} not sent, {format_duration(self.late)} late{why}"


def grace(schedule_interval: float) -> float:
    """Seconds past its time after which an unsent tick is overdue."""
    return max(MIN_GRACE, 3 * schedule_interval)


def overdue_schedules(using: str, now: dt.datetime) -> list[OverdueSchedule]:
    """The enabled schedules of database ``using`` whose tick is overdue at ``now`` (the database
    clock), most overdue first. Invalid settings schedules are the system checks' to report."""

    try:
        specs = load_schedules(using)
    except ScheduleError:
        return []
    specs = {n: s for n, s in specs.items() if s.enabled and database_for(s.queue) == using}
    if not specs:
        return []
    states = {s.name: s for s in ScheduleState.objects.using(using).filter(name__in=list(specs))}
    edited = dict(
        Schedule.objects.using(using).filter(name__in=list(specs)).values_list("name", "updated_at")
    )
    late_after = dt.timedelta(seconds=grace(get_settings().SCHEDULE_INTERVAL))
    found = []
    for name, spec in sorted(specs.items()):
        state = states.get(name)
        if state is not None:
            after = state.last_tick or state.updated_at
        else:
            after = now - LOOKBACK
            if spec.source == "database" and name in edited:
                after = max(after, edited[name])
        due = next_tick(spec, after)
        if due is not None and now - due > late_after:
            found.append(OverdueSchedule(name, due, (now - due).total_seconds(), seen=state is not None))
    return sorted(found, key=lambda o: -o.late)
