"""The built-in database worker: claims batches straight from the ledger, no broker needed.

One process runs ``concurrency`` claim threads (:mod:`.loop`), one lease keeper
(:mod:`.keeper`), the LISTEN wake-up (PostgreSQL), and, unless told otherwise, the recovery
sweep, so a lone worker recovers from crashes without any other process. Which parts it runs
and what a part's failure does are one table, :data:`.supervisor.PARTS`. Every one of them
rides out a database outage on its own (:mod:`zeroloss.core.outage`): the process keeps running and
drains again when the database is back.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connections

from ...core.outage import Backoff, OutageMonitor, OutageTooLong, is_outage
from ...core.states import LIVE_STATUSES
from ...ledger.models import Message
from ...ledger.service import ZeroLossMessageService
from ..handlers import get_handler
from ..processing import Outcome, close_thread_event_loop
from ..schedules.scheduler import Scheduler
from ..sweep_loop import StopFlag, SweepLoop
from ..transports import after_sweep_hooks
from ..wakeup import IDLE_POLL, Wakeup
from .keeper import LeaseKeeper
from .loop import ClaimLoop
from .pool import ChildSlot, refuse_transactional
from .sessions import harden_sessions
from .supervisor import CLAIMER, HEALTH_FILE, KEEPER, LISTENER, SCHEDULER, SWEEP, Supervised, Supervisor

logger = logging.getLogger("zeroloss")

__all__ = ["Worker", "WorkerStats"]


@dataclass
class WorkerStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    sweeps: int = 0
    recovered: int = 0
    #: A part whose policy is EXIT died of a bug (not an outage): the process exits 1.
    crashed: bool = False
    #: The database stayed unreachable past DB_OUTAGE_TOLERANCE: the process exits 4.
    gave_up: bool = False
    #: The part (:data:`~.supervisor.PARTS`) whose death ended the worker, if one did.
    exit_part: str = ""

    @property
    def handled(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k != Outcome.RELEASED)


class Worker:
    """Process messages of ``queues`` with ``concurrency`` threads until stopped.

    Each thread claims up to ``batch_size`` messages at a time (fewer for slow handlers, see
    :class:`~.loop.Pace`), runs them and records their outcomes in batches. On stop it
    finishes the message in hand, records what is done and releases the rest.
    """

    def __init__(
        self,
        queues: Sequence[str],
        *,
        concurrency: int = 1,
        batch_size: int = 100,
        poll_interval: float = 0.5,
        burst: bool = False,
        max_messages: int | None = None,
        sweep: bool = True,
        schedule: bool = True,
        using: str = "default",
        instance_id: str | None = None,
        stop: StopFlag | None = None,
        health_file: str | Path | None = None,
        health_interval: float = 1.0,
        pool: str = "thread",
        max_tasks_per_child: int | None = None,
    ) -> None:
        if not queues:
            raise ValueError("Worker needs at least one queue.")
        if pool not in ("thread", "process"):
            raise ValueError(f"pool must be 'thread' or 'process', not {pool!r}.")
        if pool == "process":
            refuse_transactional([get_handler(q) for q in queues])
        #: "thread": handlers run on the claim threads; "process": in a child per thread (.pool).
        self.pool = pool
        self.max_tasks_per_child = max_tasks_per_child
        self.queues = list(queues)
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.burst = burst
        self.max_messages = max_messages
        self.sweep = sweep
        #: Run the scheduler (docs/schedules.md) beside the sweep: every worker is a scheduler.
        self.schedule = schedule
        self.using = using
        self.instance_id = instance_id
        self.stop = stop if stop is not None else StopFlag()
        self.supervisor = Supervisor(self.stop)
        self._sweep_round: Supervised | None = None
        self._schedule_round: Supervised | None = None
        self._health_round: Supervised | None = None
        self._sweep_backoff = Backoff()
        self._next_sweep = 0.0
        self.health_file = Path(health_file) if health_file else None
        #: Seconds between two writes of the health file (at most: one per supervisor round).
        self.health_interval = health_interval
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        self.base = ZeroLossMessageService(using=using, instance_id=instance_id)
        settings = self.base.settings
        harden_sessions([using], settings.DEAD_PEER_TIMEOUT)
        self.monitor = OutageMonitor.for_alias(using)
        self.wakeup = Wakeup(using, self.queues, listen=settings.LISTEN)
        self.keeper = LeaseKeeper(
            self.service_for(KEEPER.actor),
            settings.heartbeat_interval,
            tolerance=settings.DB_OUTAGE_TOLERANCE,
            handler_timeout=settings.HANDLER_TIMEOUT,
            on_released=lambda n: self.count(Outcome.RELEASED, n),
        )

    def service_for(self, actor: str) -> ZeroLossMessageService:
        """Each part its own service (and so its own actor name in the audit trail):
        ``<instance>/<actor>``, the actor from :data:`~.supervisor.PARTS` (``t0``, ``sweep``, ...)."""
        return ZeroLossMessageService(using=self.using, instance_id=f"{self.base.instance_id}/{actor}")

    def child_slot(self, n: int) -> ChildSlot | None:
        if self.pool != "process":
            return None
        return ChildSlot(
            n,
            worker=f"{self.base.instance_id}/{CLAIMER.actor.format(n=n)}",
            handler_timeout=self.base.settings.HANDLER_TIMEOUT,
            max_tasks=self.max_tasks_per_child,
        )

    def count(self, outcome: str, n: int = 1) -> None:
        """Record outcomes; stops the worker when ``max_messages`` is reached."""
        with self._lock:
            self.stats.outcomes[outcome] += n
            if self.max_messages is not None and self.stats.handled >= self.max_messages:
                self.stop.set("max-messages")

    def all_idle(self) -> bool:
        # In burst mode, stop only when a claim round found nothing *and* nothing is left that
        # a sweep or a backoff could return (pending retries keep the worker waiting).
        try:
            return (
                not Message.objects.using(self.using)
                .filter(queue_name__in=self.queues, status__in=LIVE_STATUSES)
                .exists()
            )
        except Exception as exc:
            if is_outage(exc):
                return False
            raise

    # -- running ----------------------------------------------------------------------------

    def _claimer(self, n: int) -> Callable[[], None]:
        loop = ClaimLoop(self, n)

        def run() -> None:

            try:
                loop.run()
            finally:
                close_thread_event_loop()  # the async handlers' loop, if this thread made one

        return run

    def _declare_parts(self) -> list[Supervised]:
        """The threads and rounds of this process, by :data:`~.supervisor.PARTS`."""
        sup = self.supervisor
        claimers = [
            sup.add(CLAIMER, self._claimer(n), name=f"{CLAIMER.name}-{n}") for n in range(self.concurrency)
        ]
        sup.add(KEEPER, self.keeper.run)
        if self.wakeup.listens:
            sup.add(LISTENER, self.wakeup.listen)
        if self.sweep:
            sweeper = self._sweeper()
            self._sweep_round = sup.add(SWEEP, lambda: self._sweep_once(sweeper))
        if self.schedule:
            scheduler = self._scheduler()
            self._schedule_round = sup.add(SCHEDULER, lambda: self._schedule_once(scheduler))
        if self.health_file is not None:
            self._health_round = sup.add(HEALTH_FILE, self._write_health)
        return claimers

    def _sweep_once(self, sweeper: SweepLoop) -> None:
        ok, report = self.monitor.attempt(
            sweeper.run_once,
            who="the sweep",
            backoff=self._sweep_backoff,
            wait=self.stop.wait,
            tolerance=self.base.settings.DB_OUTAGE_TOLERANCE,
        )
        if ok and report is not None:
            self.stats.sweeps += 1
            self.stats.recovered += report.total
        self._next_sweep = time.monotonic() + sweeper.interval

    def _schedule_once(self, scheduler: Scheduler) -> None:
        # While the listener hears of every schedule change, a round runs only when a tick is
        # due, a schedule changed, or IDLE_POLL passed: an idle scheduler reads nothing.
        listening = self.wakeup.listening.is_set()
        if self.wakeup.schedules_changed.is_set() or (scheduler.idle_interval is not None and not listening):
            self.wakeup.schedules_changed.clear()
            scheduler.wake()
        scheduler.idle_interval = IDLE_POLL if listening else None
        if not scheduler.round_if_due(self.monitor, self.base.settings.DB_OUTAGE_TOLERANCE):
            raise OutageTooLong("the scheduler: the database stayed unreachable past DB_OUTAGE_TOLERANCE")

    def _round(self, unit: Supervised | None, due: bool = True) -> None:
        """One round of a part on this loop, its failure handled by its policy."""
        if unit is None or not due or self.stop or not self.supervisor.due(unit):
            return
        assert unit.body is not None
        try:
            unit.body()
        except Exception as exc:
            self.supervisor.failed(unit, exc)
        else:
            self.supervisor.succeeded(unit)

    def run(self) -> WorkerStats:
        claimers = self._declare_parts()
        self.supervisor.start()
        try:
            while any(c.alive for c in claimers):
                self._round(self._schedule_round)
                self._round(self._sweep_round, due=time.monotonic() >= self._next_sweep)
                self.supervisor.check()
                if self.stop:
                    self.wakeup.wake()  # idle threads notice the stop at once
                self._round(self._health_round)
                for c in claimers:
                    if c.thread is not None:
                        c.thread.join(timeout=0.05)
        finally:
            self.supervisor.shutting_down()
            self.keeper.stop()
            self.wakeup.stop()
            self.supervisor.join(timeout=30)
            self._record_exit()
            try:
                self._write_health(stopped=True)
            except OSError as exc:
                logger.error("worker health-file: its last write failed: %s", exc)
            connections.close_all()
        return self.stats

    def _record_exit(self) -> None:
        cause = self.supervisor.exit_cause
        if cause is not None:
            self.stats.gave_up = isinstance(cause[1], OutageTooLong)
            self.stats.crashed = not self.stats.gave_up
            self.stats.exit_part = cause[0].name

    def _sweeper(self) -> SweepLoop:

        service = self.service_for(SWEEP.actor)
        return SweepLoop(service, stop=self.stop, after_sweep=after_sweep_hooks(service))

    def _scheduler(self) -> Scheduler:
        return Scheduler(self.using, instance_id=f"{self.base.instance_id}/{SCHEDULER.actor}", stop=self.stop)

    def _write_health(self, *, stopped: bool = False) -> None:
        """``--health-file``: a small JSON a liveness probe can read (rewritten every
        ``health_interval`` seconds, one by default)."""
        if self.health_file is None:
            return
        now = time.time()
        if not stopped and now - getattr(self, "_health_at", 0.0) < self.health_interval:
            return
        outage = self.monitor.status()
        data = {
            "status": "stopped" if stopped else ("degraded" if outage or self.supervisor.degraded else "ok"),
            "database": outage or "reachable",
            "parts": self.supervisor.status(),
            "stopped_on": self.stop.signal_name if stopped else "",
            "pid": os.getpid(),
            "updated_at": now,
            "queues": self.queues,
            "outcomes": dict(self.stats.outcomes),
        }
        tmp = self.health_file.with_suffix(self.health_file.suffix + ".tmp")
        tmp.write_text(json.dumps(data, sort_keys=True))
        tmp.replace(self.health_file)
        self._health_at = now  # after the write: a failed one is tried again at its next round
