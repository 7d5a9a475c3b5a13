"""The scheduler: one round reads the database clock once and sends every due tick.

A round (:meth:`Scheduler.run_once`):

1. one query reads the database clock and the version of the database schedules (their count
   and latest ``updated_at``); schedules are re-read only when that changed;
2. the due schedules are found in Python from that one clock reading (each schedule's next tick
   is kept in memory): with nothing due the round costs that single query;
3. otherwise one transaction locks the due schedules' :class:`~.models.ScheduleState` rows,
   decides per catch-up and overlap policy which ticks to send, inserts their messages in one
   batch per kind (``persist_messages``: ON CONFLICT on the unique id) and advances the states.

Exactly once per tick needs no leader: every scheduler names a tick ``<name>@<tick UTC>``, so
the ledger's unique message id admits one insert, and the state row (locked, written in the same
transaction) keeps catch-up decisions consistent. Only the database clock decides what is due,
so a host whose clock is off sends nothing early or twice.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from ...core.outage import Backoff, OutageMonitor, OutageTooLong
from ...core.states import LIVE_STATUSES
from ...ledger.models import Message
from ...ledger.service import ZeroLossMessageService
from ..sweep_loop import StopFlag
from ..transports import database_for, get_transport
from .models import ScheduleState
from .spec import ScheduleSpec, settings_schedules
from .state_rows import create_states, lock_states, read_clock, save_states, start_states, stop_states
from .targets import Target, load_schedules, persist_ticks, resolve_target
from .ticks import latest_ticks, next_tick, next_ticks

logger = logging.getLogger("zeroloss")

__all__ = ["ON_TIME_WINDOW", "RoundReport", "Scheduler", "load_schedules"]

#: A tick found due at most this long after its time is on time: ``catch_up="none"`` sends it.
ON_TIME_WINDOW = 10.0


@dataclass
class RoundReport:
    """What one round did. ``sent``: tick message ids inserted or found already there."""

    now: dt.datetime
    due: int = 0
    sent: list[str] = field(default_factory=list)
    skipped_overlap: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    queries: int = 0


class Scheduler:
    """Sends the ticks of the schedules whose queues live in database ``using``.

    ``clock`` replaces the database clock (tests inject one); everything else stays real.
    """

    def __init__(
        self,
        using: str = "default",
        *,
        clock: Callable[[], dt.datetime] | None = None,
        instance_id: str | None = None,
        stop: StopFlag | None = None,
    ) -> None:
        self.using = using
        self.clock = clock
        self.service = ZeroLossMessageService(using=using, instance_id=instance_id)
        self.interval = self.service.settings.SCHEDULE_INTERVAL
        self.stop = stop if stop is not None else StopFlag()
        settings_schedules()  # refuse to start on a bad settings schedule
        self.specs: dict[str, ScheduleSpec] = {}
        self._version: tuple[Any, ...] | None = None
        self._next: dict[str, dt.datetime] = {}
        self._targets: dict[str, Target] = {}
        self._next_round = 0.0
        self._have_state: set[str] = set()
        self._due_in: float | None = None
        #: Seconds between rounds while no tick is due sooner, if not ``SCHEDULE_INTERVAL``: a
        #: worker whose listener hears of every schedule change (:meth:`wake`) waits longer.
        self.idle_interval: float | None = None

        self._backoff = Backoff()

    # -- reading ------------------------------------------------------------------------------

    def read_clock(self) -> tuple[dt.datetime, tuple[Any, ...]]:
        """The database clock and the database schedules' version, in one query."""
        now, version = read_clock(self.using)
        return (self.clock() if self.clock else now), version

    def _reload(self, now: dt.datetime) -> None:

        loaded = {
            name: spec
            for name, spec in load_schedules(self.using).items()
            if database_for(spec.queue) == self.using
        }
        specs = {name: spec for name, spec in loaded.items() if spec.enabled}
        # A settings schedule seen disabled loses its start: deployed enabled again, it starts
        # afresh rather than catching up on the time it was off (a database schedule's enabling
        # restarts it where it is saved).
        stop_states(
            self.using,
            sorted(n for n, s in loaded.items() if not s.enabled and s.source == "settings"),
        )
        states = {s.name: s for s in ScheduleState.objects.using(self.using).filter(name__in=list(specs))}
        # Seen enabled without a start (new, or enabled again in the settings): it starts now,
        # so its first tick is the next one; no tick from before it existed is sent. Its row also
        # says since when a scheduler has been running it (zeroloss.runtime.schedules.overdue).
        unstarted = sorted(n for n in specs if n not in states or states[n].last_tick is None)
        start_states(self.using, unstarted, now)
        self._next = {}
        self._have_state = set(states) | set(unstarted)
        for name, spec in specs.items():
            state = states.get(name)
            after = state.last_tick if state is not None and state.last_tick else now
            first = next_tick(spec, after)
            if first is not None:
                self._next[name] = first
        self.specs = specs
        self._targets = {}

    def target(self, spec: ScheduleSpec) -> Target:
        """Queue, payload and options of a tick's message (a task's: through its zeroloss backend)."""
        found = self._targets.get(spec.name)
        if found is None:
            found = self._targets[spec.name] = resolve_target(spec)
        return found

    # -- a round ------------------------------------------------------------------------------

    def run_once(self) -> RoundReport:
        now, version = self.read_clock()
        report = RoundReport(now=now, queries=1)
        if version != self._version:
            self._reload(now)
            self._version = version
            report.queries += 2
        due = [self.specs[name] for name, tick in self._next.items() if tick <= now]
        report.due = len(due)
        if due:
            try:
                self._send(due, now, report)
            except BaseException:
                self._have_state = set()  # rows created by the rolled-back transaction are gone
                raise
            for spec in due:
                upcoming = next_tick(spec, now)
                if upcoming is None:
                    self._next.pop(spec.name, None)
                else:
                    self._next[spec.name] = upcoming
        earliest = min(self._next.values(), default=None)
        self._due_in = None if earliest is None else (earliest - now).total_seconds()
        return report

    def next_round_in(self) -> float:
        """Seconds until the next round: ``SCHEDULE_INTERVAL``, or less when a tick falls due
        sooner (by the last clock reading), so a tick's message is not a whole interval late."""
        interval = self.interval if self.idle_interval is None else self.idle_interval
        if self._due_in is None:
            return interval
        return max(0.001, min(interval, self._due_in + 0.002))

    def wake(self) -> None:
        """Run a round at the next :meth:`round_if_due` (the database schedules changed)."""
        self._next_round = 0.0

    def _send(self, due: list[ScheduleSpec], now: dt.datetime, report: RoundReport) -> None:

        names = sorted(spec.name for spec in due)
        on_time = now - dt.timedelta(seconds=ON_TIME_WINDOW)
        with transaction.atomic(using=self.using):
            missing = [n for n in names if n not in self._have_state]
            if missing:
                create_states(self.using, missing)
                # Known to exist once this transaction commits (run_once forgets them if it does not).
                self._have_state.update(missing)
                report.queries += 1
            states = lock_states(self.using, names, idle_bound=self.service.settings.ACK_TIMEOUT)
            report.queries += 1
            plans: dict[str, list[dt.datetime]] = {}
            for spec in due:
                state = states[spec.name]
                if state.last_tick is None:  # its start was reset meanwhile: it starts now
                    state.last_tick = now
                    plans[spec.name] = []
                    continue
                after = state.last_tick
                newest = latest_ticks(spec, after, now, 1)
                if not newest:
                    continue  # another scheduler handled these ticks already
                limit = spec.max_catch_up if spec.catch_up == "all" else 1
                ticks = latest_ticks(spec, after, now, limit)
                if spec.catch_up == "none":
                    report.dropped += [spec.message_id(t) for t in ticks if t < on_time]
                    ticks = [t for t in ticks if t >= on_time]
                state.last_tick = newest[0]
                plans[spec.name] = ticks
            busy = self._busy([self.specs[n] for n in plans], states)
            if busy is not None:
                report.queries += 1
            items: dict[tuple[Any, ...], list[tuple[str, str, Any]]] = defaultdict(list)
            for name, ticks in list(plans.items()):
                spec = self.specs[name]
                if not ticks:
                    continue
                try:
                    target = self.target(spec)
                except Exception as exc:
                    # Its state stays put: once the task imports again, catch-up sends the tick.
                    logger.error("schedule %r: tick %s not sent: %s", name, spec.message_id(ticks[-1]), exc)
                    del plans[name]
                    continue
                if spec.overlap == "skip":
                    if busy and name in busy:
                        report.skipped_overlap += [spec.message_id(t) for t in ticks]
                        continue
                    # Each later tick would overlap the one sent before it.
                    report.skipped_overlap += [spec.message_id(t) for t in ticks[1:]]
                    ticks = ticks[:1]
                key = (target.max_attempts, target.priority, target.ordering_key)
                items[key] += [(spec.message_id(t), target.queue, target.payload) for t in ticks]
                states[name].last_sent = ticks[-1]
                report.sent += [spec.message_id(t) for t in ticks]
            stored: list[Message] = []
            for (max_attempts, priority, ordering_key), batch in items.items():
                stored += persist_ticks(self.service, self.using, batch, max_attempts, priority, ordering_key)
                report.queries += 1
            changed = [states[n] for n in plans]
            if changed:
                save_states(self.using, changed)
                report.queries += 1
            if stored:
                service = self.service
                transaction.on_commit(
                    lambda: get_transport(service).after_commit(service, stored), using=self.using
                )

    def _busy(self, specs: Iterable[ScheduleSpec], states: dict[str, ScheduleState]) -> set[str] | None:
        """Names of overlap="skip" schedules whose last sent tick's message is pending or processing."""

        previous = {
            spec.message_id(states[spec.name].last_sent): spec.name  # type: ignore[arg-type]
            for spec in specs
            if spec.overlap == "skip" and states[spec.name].last_sent is not None
        }
        if not previous:
            return None
        running = (
            Message.objects.using(self.using)
            .filter(message_id__in=list(previous), status__in=LIVE_STATUSES)
            .values_list("message_id", flat=True)
        )
        return {previous[mid] for mid in running}

    # -- tools --------------------------------------------------------------------------------

    def preview(self, name: str, count: int = 5, *, after: dt.datetime | None = None) -> list[dt.datetime]:
        spec = self.spec(name)
        return next_ticks(spec, after or self.read_clock()[0], count)

    def spec(self, name: str) -> ScheduleSpec:
        specs = load_schedules(self.using)
        if name not in specs:
            raise KeyError(name)
        return specs[name]

    def run_now(self, name: str) -> str:
        """Send one message of schedule ``name`` now, outside its ticks (``<name>@run-<uuid>``):
        it never stands in for a tick, so the next tick is sent as usual."""
        spec = self.spec(name)
        target = self.target(spec)
        message_id = f"{name}@run-{uuid.uuid4().hex}"
        persist_ticks(
            self.service,
            self.using,
            [(message_id, target.queue, target.payload)],
            target.max_attempts,
            target.priority,
            target.ordering_key,
        )
        return message_id

    def round_if_due(self, monitor: Any, tolerance: float | None) -> bool:
        """A round when ``SCHEDULE_INTERVAL`` has passed since the last (the worker's main loop
        calls this often). False when the database stayed unreachable past ``tolerance``.
        A round that fails for another reason is logged and tried again next interval: a bad
        schedule must not stop the worker's processing."""

        if time.monotonic() < self._next_round:
            return True
        self._next_round = time.monotonic() + self.interval
        try:
            ok, _ = monitor.attempt(
                self.run_once,
                who="the scheduler",
                backoff=self._backoff,
                wait=self.stop.wait,
                tolerance=tolerance,
            )
        except OutageTooLong as exc:
            logger.error("%s; stopping", exc)
            return False
        except Exception:
            logger.exception("scheduler round failed; trying again in %gs", self.interval)
            self._backoff = Backoff()
            return True
        if ok:
            self._next_round = time.monotonic() + self.next_round_in()
        return True

    def run(self) -> None:
        """Rounds every ``SCHEDULE_INTERVAL`` until stopped, riding out database outages."""

        monitor = OutageMonitor.for_alias(self.using)
        backoff = Backoff()
        while not self.stop:
            started = time.monotonic()
            monitor.attempt(
                self.run_once,
                who="the scheduler",
                backoff=backoff,
                wait=self.stop.wait,
                tolerance=self.service.settings.DB_OUTAGE_TOLERANCE,
            )
            self.stop.wait(max(0.0, self.next_round_in() - (time.monotonic() - started)))
