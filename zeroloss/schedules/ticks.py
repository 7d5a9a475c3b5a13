"""When a schedule ticks. Pure functions of a :class:`~.spec.ScheduleSpec` and instants: the
scheduler passes the database clock, tests pass any instant they like (an injected clock).

- ``every``: ticks at whole multiples of the interval since the Unix epoch (UTC), computed in
  integer microseconds, so every host names the same instants whatever its start time.
- ``cron``: the expression is read in the schedule's time zone by ``cronsim``, which follows
  Debian cron's rule for daylight-saving changes. **The DST rule**: a wall-clock time skipped by
  a spring-forward change fires once, at the first instant after the gap (a daily 02:30 in
  Europe/Berlin fires at 03:00 CEST on that day); a wall-clock time repeated by a fall-back
  change fires once, at its first occurrence (02:30 CEST, not again at 02:30 CET) — except
  for expressions whose hour field is ``*``, which run in both copies of the repeated hour
  (they are hourly, and that hour happens twice). Either way a daily job runs once a day.

All instants returned are aware datetimes in UTC.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from .spec import ScheduleSpec

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


def _us(instant: dt.datetime) -> int:
    delta = instant.astimezone(dt.UTC) - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _at(us: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=us)


def _every_us(spec: ScheduleSpec) -> int:
    assert spec.every is not None
    return max(1, round(spec.every * 1_000_000))


def _cron(spec: ScheduleSpec, start: dt.datetime, *, reverse: bool) -> Iterator[dt.datetime]:
    from cronsim import CronSim

    assert spec.cron is not None
    for tick in CronSim(spec.cron, start.astimezone(spec.tz), reverse=reverse):
        yield tick.astimezone(dt.UTC)


def next_ticks(spec: ScheduleSpec, after: dt.datetime, count: int = 1) -> list[dt.datetime]:
    """The first ``count`` ticks strictly after ``after``."""
    if spec.every is not None:
        step = _every_us(spec)
        first = (_us(after) // step + 1) * step
        return [_at(first + n * step) for n in range(count)]
    found: list[dt.datetime] = []
    for tick in _cron(spec, after, reverse=False):
        found.append(tick)
        if len(found) >= count:
            break
    return found


def next_tick(spec: ScheduleSpec, after: dt.datetime) -> dt.datetime | None:
    ticks = next_ticks(spec, after, 1)
    return ticks[0] if ticks else None


def latest_ticks(
    spec: ScheduleSpec, after: dt.datetime | None, until: dt.datetime, limit: int
) -> list[dt.datetime]:
    """The latest ``limit`` ticks ``t`` with ``after < t <= until``, oldest first. Walks back from
    ``until``, so a long downtime costs ``limit`` steps, not one per missed tick."""
    if limit <= 0:
        return []
    if spec.every is not None:
        step = _every_us(spec)
        last = _us(until) // step * step
        low = None if after is None else _us(after)
        ticks = []
        for n in range(limit):
            us = last - n * step
            if low is not None and us <= low:
                break
            ticks.append(_at(us))
        return ticks[::-1]
    found: list[dt.datetime] = []
    for tick in _cron(spec, until + _US, reverse=True):
        if after is not None and tick <= after:
            break
        found.append(tick)
        if len(found) >= limit:
            break
    return found[::-1]
