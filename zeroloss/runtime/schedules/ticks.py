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

**One walk decides.** A cron schedule's ticks are those of the backward walk (the one that finds
the ticks to send after a downtime in ``max_catch_up`` steps); :func:`next_ticks`, which says
when the next one is due, walks forward only to find an upper bound and then takes the backward
walk's ticks below it. cronsim's two directions disagree on a few instants (Lord Howe's 30-minute
fall-back: ``0 */2 * * *`` on 2026-04-05, whose 02:00 the forward walk skips); with two walks a
tick could be due by one and never sent by the other.

**The backward walk steps back in elapsed time** (:class:`_CronWalk`): cronsim's own backward
hour step sets the wall clock to ``hh:59:59``, which across a change of offset inside that wall
hour moves forward in time: around Chatham's changes (45-minute offsets, ``0 */2 * * *``) it
cycles for ever on the fall-back and skips 02:00 on the spring-forward.

All instants returned are aware datetimes in UTC.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from cronsim import CronSim

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


_SECOND = dt.timedelta(seconds=1)


class _CronWalk(CronSim):
    """cronsim, its backward hour step taken in elapsed time (module docstring)."""

    def reverse_hour(self) -> bool:
        now = self.dt
        if now.hour in self.hours or now.tzinfo in (None, dt.UTC):  # naive: wall-clock arithmetic
            return bool(super().reverse_hour())
        at = now.astimezone(dt.UTC)
        # The last second before this wall hour began: at hh:00 by elapsed time, or at the change
        # of offset inside it if the wall clock jumped into this hour there (a spring-forward).
        land = at - dt.timedelta(seconds=now.minute * 60 + now.second + 1)
        if land.astimezone(now.tzinfo).utcoffset() != now.utcoffset():
            low, high = land, at  # the change lies between: find its second
            while high - low > _SECOND:
                mid = (low + (high - low) / 2).replace(microsecond=0)
                if mid.astimezone(now.tzinfo).utcoffset() == now.utcoffset():
                    high = mid
                else:
                    low = mid
            if (high - _SECOND).astimezone(now.tzinfo).hour != now.hour:
                land = high - _SECOND
        self.dt = land.astimezone(now.tzinfo)
        while self.dt.hour not in self.hours and self.dt.hour != 23:  # 23: the day is checked again
            self.tick(3600)
        return True


def _cron(spec: ScheduleSpec, start: dt.datetime, *, reverse: bool) -> Iterator[dt.datetime]:
    assert spec.cron is not None
    for tick in _CronWalk(spec.cron, start.astimezone(spec.tz), reverse=reverse):
        yield tick.astimezone(dt.UTC)


def next_ticks(spec: ScheduleSpec, after: dt.datetime, count: int = 1) -> list[dt.datetime]:
    """The first ``count`` ticks strictly after ``after``."""
    if spec.every is not None:
        step = _every_us(spec)
        first = (_us(after) // step + 1) * step
        return [_at(first + n * step) for n in range(count)]
    found: list[dt.datetime] = []
    while len(found) < count:
        tick = _next_cron(spec, after)
        if tick is None:
            break
        found.append(tick)
        after = tick
    return found


def _next_cron(spec: ScheduleSpec, after: dt.datetime) -> dt.datetime | None:
    """The backward walk's first tick after ``after``: the forward walk's first tick bounds it,
    the backward walk from that bound down to ``after`` names it."""
    bound = after
    for _ in range(1000):  # each turn moves the bound to a later forward tick
        upper = next(_cron(spec, bound, reverse=False), None)
        if upper is None:
            return None
        below = list(_walk_back(spec, after, upper))
        if below:
            return below[-1]
        bound = upper
    return None


def _walk_back(spec: ScheduleSpec, after: dt.datetime, until: dt.datetime) -> Iterator[dt.datetime]:
    """The backward walk's ticks ``t`` with ``after < t <= until``, newest first."""
    for tick in _cron(spec, until + _US, reverse=True):
        if tick <= after:
            return
        yield tick


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
    for tick in _walk_back(spec, after if after is not None else EPOCH, until):
        found.append(tick)
        if len(found) >= limit:
            break
    return found[::-1]
