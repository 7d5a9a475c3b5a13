"""The built-in database worker: claims batches straight from the ledger, no broker needed."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import connections

from .loops import StopFlag, SweepLoop
from .processing import LeaseKeeper, Outcome, process
from .service import ZeroLossMessageService
from .wakeup import Wakeup

logger = logging.getLogger("zeroloss")


@dataclass
class WorkerStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    sweeps: int = 0
    recovered: int = 0
    crashed: bool = False

    @property
    def handled(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k != Outcome.RELEASED)


class Worker:
    """Process messages of ``queues`` with ``concurrency`` threads until stopped.

    Each thread claims up to ``batch_size`` messages at a time (``FOR UPDATE SKIP LOCKED``),
    holds their leases with one heartbeat thread, runs them in order and acknowledges each.
    On stop it finishes the message in hand and releases the rest of its batch. Unless
    ``sweep`` is False it also runs the recovery sweep every ``SWEEP_INTERVAL``, so a lone
    worker recovers from crashes without any other process.
    """

    def __init__(
        self,
        queues: Sequence[str],
        *,
        concurrency: int = 1,
        batch_size: int = 10,
        poll_interval: float = 0.5,
        burst: bool = False,
        max_messages: int | None = None,
        sweep: bool = True,
        using: str = "default",
        instance_id: str | None = None,
        stop: StopFlag | None = None,
    ) -> None:
        if not queues:
            raise ValueError("Worker needs at least one queue.")
        self.queues = list(queues)
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.burst = burst
        self.max_messages = max_messages
        self.sweep = sweep
        self.using = using
        self.instance_id = instance_id
        self.stop = stop if stop is not None else StopFlag()
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        self.wakeup = Wakeup(using, self.queues)

    def _service(self, n: int) -> ZeroLossMessageService:
        base = ZeroLossMessageService(using=self.using, instance_id=self.instance_id)
        if self.concurrency > 1:
            base.instance_id = f"{base.instance_id}/t{n}"
        return base

    def _count(self, outcome: str, n: int = 1) -> bool:
        """Record outcomes; True when ``max_messages`` is reached."""
        with self._lock:
            self.stats.outcomes[outcome] += n
            if self.max_messages is not None and self.stats.handled >= self.max_messages:
                self.stop.set("max-messages")
                return True
        return False

    def run(self) -> WorkerStats:
        threads = [
            threading.Thread(target=self._thread_main, args=(n,), name=f"zeroloss-worker-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        self.wakeup.start()
        for t in threads:
            t.start()
        sweeper = SweepLoop(self._service(-1), stop=self.stop) if self.sweep else None
        next_sweep = time.monotonic()
        try:
            while any(t.is_alive() for t in threads):
                if sweeper is not None and time.monotonic() >= next_sweep:
                    try:
                        report = sweeper.run_once()
                        self.stats.sweeps += 1
                        self.stats.recovered += report.total
                    except Exception:
                        logger.exception("sweep failed; retrying next interval")
                    next_sweep = time.monotonic() + sweeper.interval
                if self.stop:
                    self.wakeup.event.set()  # idle threads notice the stop at once
                for t in threads:
                    t.join(timeout=0.05)
        finally:
            self.wakeup.stop()
            connections.close_all()
        return self.stats

    def _thread_main(self, n: int) -> None:
        service = self._service(n)
        keeper = LeaseKeeper(service, service.settings.heartbeat_interval).start()
        try:
            self._loop(service, keeper)
        except Exception:
            logger.exception("worker thread %d crashed; its leases will expire and be swept", n)
            self.stats.crashed = True
            self.stop.set("crash")
        finally:
            keeper.stop()
            connections.close_all()

    def _loop(self, service: ZeroLossMessageService, keeper: LeaseKeeper) -> None:
        turn = 0
        idle_rounds = 0
        while not self.stop:
            leases = []
            for i in range(len(self.queues)):
                queue = self.queues[(turn + i) % len(self.queues)]
                leases = service.claim_next(queue, limit=self.batch_size)
                if leases:
                    break
            turn += 1
            if not leases:
                idle_rounds += 1
                if self.burst and idle_rounds >= 2 and self._all_idle():
                    return
                if not self.stop:
                    self.wakeup.wait(self.poll_interval)
                continue
            idle_rounds = 0
            keeper.hold(leases)
            for i, lease in enumerate(leases):
                if self.stop:
                    self._release(service, keeper, leases[i:])
                    return
                outcome = process(service, lease, keeper)
                if self._count(outcome):
                    self._release(service, keeper, leases[i + 1 :])
                    return

    def _all_idle(self) -> bool:
        # In burst mode, stop only when a claim round found nothing *and* no sweep is due to
        # return work (pending retries still backing off keep the worker waiting).
        from .models import Message

        return (
            not Message.objects.using(self.using)
            .filter(queue_name__in=self.queues, status__in=["pending", "processing"])
            .exists()
        )

    def _release(
        self, service: ZeroLossMessageService, keeper: LeaseKeeper, leases: Sequence[object]
    ) -> None:
        from .service import Lease

        for lease in leases:
            assert isinstance(lease, Lease)
            keeper.drop(lease.message_id)
            if service.release_lease(lease.message_id, lease.token):
                self._count(Outcome.RELEASED)
