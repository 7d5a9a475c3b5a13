"""The batch completer: outcomes are collected and recorded together, one fenced statement per kind.

Recorded when ``ACK_BATCH_SIZE`` outcomes are waiting or ``ACK_FLUSH_INTERVAL`` seconds passed
since the first, and always before the worker claims again or stops. Until then the lease
keeper goes on renewing their leases. A process killed with outcomes unrecorded loses only
those: their leases expire, the sweep puts the messages back, and they run again — each
re-run is visible in the audit trail as ``lease_expired``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ...core.outage import COMMIT_STALL_S, Backoff, OutageMonitor, close_connection, is_outage
from ...ledger.service import ZeroLossMessageService
from ...ledger.types import Completion, CompletionReport, Verdict
from .keeper import LeaseKeeper

logger = logging.getLogger("zeroloss")


class Completer:
    def __init__(
        self,
        service: ZeroLossMessageService,
        keeper: LeaseKeeper,
        *,
        on_report: Callable[[CompletionReport], None],
        wait: Callable[[float], object],
        tolerance: float | None = None,
    ) -> None:
        self.service = service
        self.keeper = keeper
        self.batch_size = service.settings.ACK_BATCH_SIZE
        self.interval = service.settings.ACK_FLUSH_INTERVAL
        self.on_report = on_report
        self._wait = wait
        self.tolerance = tolerance
        self.monitor = OutageMonitor.for_alias(service.using)
        self.pending: list[Completion] = []
        self._retried = False
        self._first_at = 0.0
        self._lock = threading.Lock()

    def wait(self, seconds: float) -> None:
        """Back off; still pause (briefly) when the loop is stopping, so a shutdown during an
        outage retries its last flush without spinning."""
        if self._wait(seconds):
            time.sleep(min(seconds, 0.2))

    def add(self, completion: Completion) -> None:
        with self._lock:
            if not self.pending:
                self._first_at = time.monotonic()
            self.pending.append(completion)

    @property
    def due(self) -> bool:
        return bool(self.pending) and (
            len(self.pending) >= self.batch_size or time.monotonic() - self._first_at >= self.interval
        )

    def take(self) -> tuple[list[Completion], bool]:
        """The waiting outcomes (now the caller's to record), and whether an earlier attempt to
        record them may have landed (its commit outcome was lost)."""
        with self._lock:
            batch, self.pending = self.pending, []
            retried, self._retried = self._retried, False
        self.keeper.settling(c.lease.message_id for c in batch)
        return batch, retried

    def restore(self, batch: list[Completion]) -> None:
        """Give back outcomes a failed attempt did not record (it may have: they are checked)."""
        self.keeper.settling((c.lease.message_id for c in batch), being=False)
        with self._lock:
            self.pending[:0] = batch
            self._retried = self._retried or bool(batch)
            if batch:
                self._first_at = time.monotonic()

    def split_lost(self, batch: list[Completion]) -> tuple[list[Completion], list[Completion]]:
        """The outcomes whose leases may still be ours, and those whose leases are lost or may
        have run out here. A lost one is never sent: the ledger might still accept it (a late
        renewal, a slow clock), but this worker already counted it lost, and lost stays lost."""
        live: list[Completion] = []
        lost: list[Completion] = []
        for c in batch:
            (lost if self.keeper.is_lost(c.lease.message_id) else live).append(c)
        return live, lost

    def settle(self, batch: list[Completion], report: CompletionReport, *, retried: bool) -> CompletionReport:
        """Outcomes recorded (by :meth:`flush`, or with a claim in one transaction): stop renewing."""
        if retried and report.refused:
            try:
                report = self._resolve(report, batch)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                close_connection(self.service.using)
                # The database went away again: which of them landed stays unknown here (the
                # ledger knows). Counted as refused; their leases have run out, nothing is lost.
                logger.warning(
                    "could not tell whether %d outcome(s) recorded before an outage landed: %s",
                    len(report.refused),
                    exc,
                )
        refused = set(report.refused)
        self.keeper.drop(c.lease.message_id for c in batch if c.lease.message_id not in refused)
        # A refused message ran here: it stays this worker's (never released as unstarted)
        # until its lease has run out and the sweep hands it to another worker.
        self.keeper.forget_later(refused)
        self.on_report(report)
        return report

    def flush(self) -> CompletionReport | None:
        """Record every waiting outcome. Through an outage it retries until each is recorded or
        its lease has certainly expired (then nothing can be recorded: it is reported refused)."""
        batch, retried = self.take()
        if not batch:
            return None
        backoff = Backoff()
        while True:
            live, expired = self.split_lost(batch)
            if not live:
                report = CompletionReport(refused=[c.lease.message_id for c in batch])
                break
            ok, got = self.monitor.attempt(
                lambda live=live: self.service.record_outcomes(live),  # type: ignore[misc]
                who="the outcome flush",
                backoff=backoff,
                wait=self.wait,
                tolerance=self.tolerance,
                slow_after=COMMIT_STALL_S,
            )
            if ok and got is not None:
                report = got
                report.refused.extend(c.lease.message_id for c in expired)
                break
            retried = True
        return self.settle(batch, report, retried=retried)

    def _resolve(self, report: CompletionReport, sent: list[Completion]) -> CompletionReport:
        """A retry after a lost commit: rows refused because the first try did land are ours."""
        refused = [c.lease for c in sent if c.lease.message_id in set(report.refused)]
        landed = self.service.own_outcomes(refused)
        if not landed:
            return report
        buckets = {
            "acknowledged": report.acknowledged,
            "failed": report.retrying,
            "dead_lettered": report.dead_lettered,
            "released": report.released,
            "aborted": report.cancelled,
            "snoozed": report.snoozed,
            "dead_lettered_by_handler": report.dead_lettered,
        }
        for mid, reason in landed.items():
            buckets[reason].append(mid)
        still = [m for m in report.refused if m not in landed]
        report.refused.clear()
        report.refused.extend(still)
        return report


def verdict_counts(report: CompletionReport) -> dict[str, int]:
    """A report as the worker's outcome counters."""
    return {
        "completed": len(report.acknowledged),
        "failed": len(report.retrying) + len(report.dead_lettered),
        "released": len(report.released),
        "lease_lost": len(report.refused),
        "cancelled": len(report.cancelled),
        "snoozed": len(report.snoozed),
    }


__all__ = ["Completer", "Verdict", "verdict_counts"]
