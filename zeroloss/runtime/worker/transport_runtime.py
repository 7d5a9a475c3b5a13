"""The Celery delivery path: one message per task, outcomes batched across tasks of a process.

Each worker process (a Celery prefork child) gets one :class:`DeliveryRuntime` per database:
a lease keeper, and a completer that a background thread flushes every
``ACK_FLUSH_INTERVAL`` (and at process exit). A task returns once its handler ran; its outcome
is recorded within the interval, the lease renewed until then.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

from django.db import close_old_connections, connections

from ...exceptions import UnknownQueue
from ...ledger.service import ZeroLossMessageService
from ...ledger.types import Completion, CompletionReport, Lease, Verdict
from ..handlers import HandlerSpec, get_handler
from ..processing import Delivery, Outcome, run_handler
from .batch import Batch
from .completer import Completer
from .keeper import LeaseKeeper
from .sessions import harden_sessions
from .transactional import TransactionalBatches

logger = logging.getLogger("zeroloss")


class DeliveryRuntime:
    _instances: dict[tuple[int, str], DeliveryRuntime] = {}
    _lock = threading.Lock()

    def __init__(self, using: str) -> None:
        self.service = ZeroLossMessageService(using=using)
        settings = self.service.settings
        harden_sessions([using], settings.DEAD_PEER_TIMEOUT)
        self.keeper = LeaseKeeper(
            ZeroLossMessageService(using=using, instance_id=f"{self.service.instance_id}/keeper"),
            settings.heartbeat_interval,
            handler_timeout=settings.HANDLER_TIMEOUT,
        ).start()
        self._stop = threading.Event()
        self.completer = Completer(self.service, self.keeper, on_report=self._log, wait=self._stop.wait)
        self.transactional = TransactionalBatches(self.service, self.keeper, stopping=self._stop.is_set)
        self._flusher = threading.Thread(target=self._flush_loop, name="zeroloss-flush", daemon=True)
        self._flusher.start()
        atexit.register(self.close)

    @classmethod
    def get(cls, using: str) -> DeliveryRuntime:
        """This process's runtime (a forked child never shares its parent's threads)."""
        key = (os.getpid(), using)
        with cls._lock:
            runtime = cls._instances.get(key)
            if runtime is None:
                runtime = cls._instances[key] = cls(using)
            return runtime

    @staticmethod
    def _log(report: CompletionReport) -> None:
        for mid in report.refused:
            logger.warning("%s: handled, but the lease was lost before the outcome was recorded", mid)

    def _flush_loop(self) -> None:
        interval = self.service.settings.ACK_FLUSH_INTERVAL
        try:
            while not self._stop.wait(interval):
                if self.completer.pending:
                    try:
                        self.completer.flush()
                    except Exception:
                        logger.exception("outcome flush failed; those messages run again after the sweep")
        finally:
            connections.close_all()

    def process(self, lease: Lease) -> Outcome:
        try:
            spec = get_handler(lease.queue_name)
        except UnknownQueue as exc:
            self.completer.add(Completion(lease, Verdict.FAIL, str(exc)))
            self.completer.flush()
            return Outcome.FAILED
        self.keeper.hold([lease], time_limit=spec.time_limit)
        if spec.transactional:
            return self._transactional(spec, lease)
        # An async handler runs on this process's (task thread's) event loop, reused per task.
        run = run_handler(
            spec,
            Delivery(lease, self.keeper),
            worker=self.service.instance_id,
            timeout=self.service.settings.HANDLER_TIMEOUT,
        )
        self.completer.add(run.completion(lease))
        if self.completer.due:
            self.completer.flush()
        return Outcome.COMPLETED if run.ok else Outcome.FAILED

    def _transactional(self, spec: HandlerSpec, lease: Lease) -> Outcome:
        """The same path as the built-in worker's transactional batches, for a batch of one."""
        batch = Batch([lease])
        self.keeper.hold([lease], batch, time_limit=spec.time_limit)
        taken: list[Lease] = []
        try:
            report = self.transactional.run(spec, batch, lambda seconds: None, 1, taken)
        except BaseException:
            # Rolled back, or its commit's outcome is unknown: the handler ran, so the lease
            # stays this process's until it runs out and the sweep hands the message on.
            self.keeper.forget_later([lease.message_id])
            raise
        if report.acknowledged:
            return Outcome.COMPLETED
        if report.cancelled:
            return Outcome.CANCELLED
        return Outcome.FAILED if (report.retrying or report.dead_lettered) else Outcome.LEASE_LOST

    @classmethod
    def close_all(cls) -> None:
        """Close every runtime of this process (its outcomes recorded first)."""
        with cls._lock:
            mine = [cls._instances.pop(key) for key in list(cls._instances) if key[0] == os.getpid()]
        for runtime in mine:
            runtime.close()

    def close(self) -> None:
        """Record what is waiting and stop (process exit, Celery's worker_process_shutdown)."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self.completer.flush()
        except Exception:
            logger.exception("could not record the last outcomes; those messages run again after the sweep")
        self.keeper.stop()
        if self._flusher.is_alive() and self._flusher is not threading.current_thread():
            self._flusher.join(timeout=30)  # it closes its own connections on the way out


def deliver(message_id: str, using: str = "default") -> Outcome:
    """Claim one message by id and run it; a duplicate delivery is absorbed by the claim."""
    close_old_connections()
    service = DeliveryRuntime.get(using).service
    lease = service.claim_message(message_id)
    if lease is None:
        return Outcome.ABSORBED
    return DeliveryRuntime.get(using).process(lease)
