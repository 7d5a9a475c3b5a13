"""Long-running loops (sweep, worker) as plain classes, separate from their commands."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from .service import RecoveryReport, ZeroLossMessageService

logger = logging.getLogger("zeroloss")


class StopFlag:
    """Set by SIGTERM/SIGINT; loops check it between units of work, so none is cut in half.

    Deliberately lock-free. A signal handler runs in the main thread between two bytecodes,
    possibly while that thread is inside ``threading.Event.wait`` holding the event's internal
    lock; a handler that called ``Event.set`` would then wait for that lock forever (a
    ``zeroloss_sweep --loop`` once hung exactly so). Setting a plain attribute cannot block,
    and :meth:`wait` sleeps in short slices instead of waiting on a lock.
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
            self.set(signal.Signals(signum).name)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


class SweepLoop:
    """Run the recovery sweep once, or every ``interval`` seconds until stopped."""

    def __init__(
        self,
        service: ZeroLossMessageService,
        *,
        interval: float | None = None,
        batch_size: int | None = None,
        stop: StopFlag | None = None,
        on_report: Callable[[RecoveryReport], None] | None = None,
    ) -> None:
        self.service = service
        self.interval = interval if interval is not None else service.settings.SWEEP_INTERVAL
        self.batch_size = batch_size
        self.stop = stop if stop is not None else StopFlag()
        self.on_report = on_report
        self.runs = 0

    def run_once(self) -> RecoveryReport:
        """Requeue expired leases; with the Celery transport, publish what needs a broker message."""
        report = self.service.recover_orphaned_messages(batch_size=self.batch_size)
        self.runs += 1
        if self.service.settings.TRANSPORT == "celery":
            from .transport import redispatch

            report = dataclasses.replace(report, redispatched=redispatch(self.service))
        if self.service.connection.vendor == "postgresql":
            # Standby liveness: one read of pg_stat_replication and an upsert per standby.
            # Never allowed to stop the sweep (a standby in recovery, no privilege, ...).
            from django.db import DatabaseError

            from .replication import discover

            try:
                discover(self.service)
            except DatabaseError as exc:
                logger.warning("sweep: standby discovery failed: %s", exc)
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
        """Loop until stopped (or ``max_runs``); returns the number of sweeps run."""
        from django.db import DatabaseError

        while not self.stop and (max_runs is None or self.runs < max_runs):
            try:
                self.run_once()
            except DatabaseError as exc:  # a looping sweeper outlives a database outage
                self.runs += 1
                logger.error("sweep failed (%s); retrying in %ss", exc, self.interval)
            if max_runs is not None and self.runs >= max_runs:
                break
            self.stop.wait(self.interval)
        return self.runs
