"""The scheduler's rows: the database clock it reads, and the state rows it locks and advances.

Plain rows through the schedules' statement catalogue (:mod:`.statements`), not ORM loads: a
burst may touch 10,000 schedules, and Django's ``bulk_update`` builds a CASE per row.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connections
from django.utils.dateparse import parse_datetime

from ...ledger.base import engine_for
from . import statements
from .models import ScheduleState


def aware(value: Any) -> dt.datetime:
    """A timestamp the database handed back, as an aware UTC datetime."""
    if isinstance(value, str):
        parsed = parse_datetime(value)
        assert parsed is not None, value
        value = parsed
    assert isinstance(value, dt.datetime)
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def read_clock(using: str) -> tuple[dt.datetime, tuple[Any, ...]]:
    """The database clock and the database schedules' version, in one query."""
    conn = connections[using]
    [(now, *version)], _ = engine_for(conn).run(conn, statements, "CLOCK")
    return aware(now), tuple(version)


def _by_name(using: str, statement: str, names: list[str]) -> None:
    if names:
        conn = connections[using]
        engine = engine_for(conn)
        engine.run(conn, statements, statement, {"names": engine.column(names)})


def stop_states(using: str, names: list[str]) -> None:
    """Settings schedules seen disabled: enabling one again starts it afresh."""
    _by_name(using, "STOP_STATES", names)


def start_states(using: str, names: list[str], at: dt.datetime) -> None:
    """Schedules seen enabled without a start: each starts at ``at`` (unless started already)."""
    if names:
        conn = connections[using]
        engine = engine_for(conn)
        params = {"names": engine.column(names), "at": conn.ops.adapt_datetimefield_value(at)}
        engine.run(conn, statements, "START_STATES", params)


def create_states(using: str, names: list[str]) -> None:
    conn = connections[using]
    engine = engine_for(conn)
    engine.run(conn, statements, "CREATE_STATES", {"names": engine.column(names)})


def lock_states(using: str, names: list[str], *, idle_bound: float) -> dict[str, ScheduleState]:
    """The state rows of ``names``, locked in name order until commit. Every other scheduler's
    round waits for them: the server ends this transaction once it stays idle ``idle_bound``
    seconds (its scheduler frozen inside it, SIGSTOP or a paused VM)."""
    conn = connections[using]
    engine = engine_for(conn)
    engine.bound_transaction(conn, idle_bound)
    rows, _ = engine.run(conn, statements, "LOCK_STATES", {"names": engine.column(names)})
    return {
        name: ScheduleState(
            name=name,
            last_tick=None if last_tick is None else aware(last_tick),
            last_sent=None if last_sent is None else aware(last_sent),
        )
        for name, last_tick, last_sent in rows
    }


def save_states(using: str, changed: list[ScheduleState]) -> None:
    """One statement for every changed state row."""
    conn = connections[using]
    engine = engine_for(conn)
    stored = conn.ops.adapt_datetimefield_value
    rows = engine.batch(
        name=[s.name for s in changed],
        last_tick=[stored(s.last_tick) for s in changed],
        last_sent=[stored(s.last_sent) for s in changed],
    )
    engine.run(conn, statements, "SAVE_STATES", rows)
