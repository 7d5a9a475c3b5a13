"""Long-running loops (the sweep) and how they stop, as plain classes apart from their commands."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from django.db import DatabaseError

from ..core.outage import Backoff, OutageMonitor, is_outage
from ..ledger.hooks import replication
from ..ledger.service import ZeroLossMessageService
from ..ledger.types import RecoveryReport

logger = logging.getLogger("zeroloss")

#: Runs after every sweep with its report; returns it, possibly with more filled in
#: (``redispatched`` by the Celery transport). See :func:`zeroloss.runtime.transports.after_sweep_hooks`.
AfterSweep = Callable[[ZeroLossMessageService, RecoveryReport], RecoveryReport]


class StopFlag:
    """Set by SIGTERM/SIGINT; loops check it between units of work, so none is cut in half.

    A second signal forces the exit at once (exit code 128 + the signal, as a shell reports
    it): messages in hand are then left to their leases and the sweep, and outcomes not yet
    recorded run again. Deliberately lock-free: a signal handler runs in the main thread between
    two bytecodes, possibly while that thread is inside ``threading.Event.wait`` holding the
    event's internal lock, and a handler calling ``Event.set`` would then wait forever.
    Setting a plain attribute cannot block.
    """

    #: Longest a waiting loop takes to notice the flag.
    SLICE = 0.05

    def __init__(self) -> None:
        self._stopped = False
        self.signal_name = ""

    def __bool__(self) -> bool:
        return self._stopped

    def set(self, reason: str = "") -> None:
        if not self.signal_name:
            self.signal_name = reason
        self._stopped = True

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as the flag is set."""
        deadline = time.monotonic() + seconds
        while not self._stopped:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(remaining, self.SLICE))
        return True

    @contextmanager
    def on_signals(self) -> Iterator[StopFlag]:
        """Install SIGTERM/SIGINT handlers for the duration (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            if self._stopped and self.signal_name in ("SIGTERM", "SIGINT"):
                os.write(2, b"zeroloss: second signal, exiting now; the sweep recovers what was in hand\n")
                os._exit(128 + signum)
            self.set(signal.Signals(signum).name)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


class SweepLoop:
    """Run the recovery sweep once, or every ``interval`` seconds until stopped.

    ``after_sweep`` hooks run after each sweep (publishing again what a broker lost, standby
    discovery); the loop itself knows nothing of brokers or replication. Through a database
    outage :meth:`run` keeps going: it logs one line, backs off, reconnects.
    """

    def __init__(
        self,
        service: ZeroLossMessageService,
        *,
        interval: float | None = None,
        batch_size: int | None = None,
        stop: StopFlag | None = None,
        on_report: Callable[[RecoveryReport], None] | None = None,
        after_sweep: Sequence[AfterSweep] = (),
    ) -> None:
        self.service = service
        self.interval = interval if interval is not None else service.settings.SWEEP_INTERVAL
        self.batch_size = batch_size
        self.stop = stop if stop is not None else StopFlag()
        self.on_report = on_report
        self.after_sweep = list(after_sweep)
        self.runs = 0
        self.failures = 0

    def run_once(self) -> RecoveryReport:
        """Requeue expired leases (never waiting on anything but the ledger), then the hooks."""
        report = self.service.sweep(batch_size=self.batch_size)
        self.runs += 1
        for hook in self.after_sweep:
            try:
                report = hook(self.service, report)
            except Exception as exc:  # a hook (broker, standby discovery) never stops the sweep
                if is_outage(exc):
                    raise
                logger.warning("after-sweep %s failed: %s", getattr(hook, "__name__", hook), exc)
        if report.total or report.redispatched:
            logger.info(
                "sweep: requeued %d, dead-lettered %d, published again %d",
                len(report.requeued),
                len(report.dead_lettered),
                len(report.redispatched),
            )
        if self.on_report:
            self.on_report(report)
        return report

    def run(self, *, max_runs: int | None = None) -> int:
        """Loop until stopped (or ``max_runs`` sweeps); returns the number of sweeps run.

        Raises :class:`~zeroloss.core.outage.OutageTooLong` past ``DB_OUTAGE_TOLERANCE``.
        """
        monitor = OutageMonitor.for_alias(self.service.using)
        backoff = Backoff()
        tolerance = self.service.settings.DB_OUTAGE_TOLERANCE
        while not self.stop and (max_runs is None or self.runs < max_runs):
            ok, _ = monitor.attempt(
                self.run_once, who="the sweep loop", backoff=backoff, wait=self.stop.wait, tolerance=tolerance
            )
            if not ok:
                self.failures += 1
                continue  # backed off already; try again
            if max_runs is not None and self.runs >= max_runs:
                break
            self.stop.wait(self.interval)
        return self.runs


#: When (monotonic) each database's standbys were last discovered by this process.
_DISCOVERED: dict[str, float] = {}


def discover_standbys(service: ZeroLossMessageService, report: RecoveryReport) -> RecoveryReport:
    """After-sweep hook: register (heartbeat) the standbys the primary streams to (PostgreSQL),
    at most every ``NODE_TTL / 3`` seconds a process: a standby stays live (seen within
    ``NODE_TTL``) without a read of ``pg_stat_replication`` at every sweep."""
    now = time.monotonic()
    last = _DISCOVERED.get(service.using)
    if last is not None and now - last < service.settings.NODE_TTL / 3:
        return report
    _DISCOVERED[service.using] = now
    try:
        replication().discover(service)
    except DatabaseError as exc:  # a standby in recovery, no privilege, ... never stops the sweep
        if is_outage(exc):
            raise
        logger.warning("sweep: standby discovery failed: %s", exc)
    return report


__all__ = ["AfterSweep", "StopFlag", "SweepLoop", "discover_standbys"]
