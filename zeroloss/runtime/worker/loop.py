"""One worker thread: claim a batch sized to the handler's pace, run it, record the outcomes.

Plain handlers run one after another and their outcomes go to the batch completer.
Transactional handlers run as a batch inside one transaction
(:mod:`zeroloss.runtime.worker.transactional`), held by their leases like any other: the outcomes
are recorded, fenced, in the same transaction, so one commit makes every effect and its
acknowledgement durable together.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Protocol

from django.db import connections, transaction

from ...core.outage import COMMIT_STALL_S, Backoff, OutageMonitor
from ...ledger import events
from ...ledger.service import ZeroLossMessageService
from ...ledger.types import Completion, CompletionReport, Lease, Verdict
from ..handlers import HandlerSpec, get_handler
from ..processing import Delivery, Outcome, run_handler
from ..sweep_loop import StopFlag
from ..wakeup import IDLE_POLL, Wakeup
from .batch import Batch
from .completer import Completer, verdict_counts
from .coroutines import AsyncBatchRunner
from .keeper import LeaseKeeper
from .pool import ChildSlot
from .supervisor import CLAIMER
from .transactional import TransactionalBatches

logger = logging.getLogger("zeroloss")

#: Seconds an idle claim thread polls, without reading the next available time, after a read
#: found a message available that its claims did not take (a paused or limited queue).
BLOCKED_RECHECK = 5.0
#: How long a worker revives the leases of a claim that committed after they had run out
#: (ClaimLoop._revive): a stall of every commit longer than this leaves them to the sweep.
REVIVE_WITHIN = 120.0
#: Slept past a message's ``available_at`` (the database clock's), so its claim finds it.
AHEAD_MARGIN = 0.005


class Pace:
    """Seconds per message of one queue's handler (moving average), and the claim size it allows.

    A claim covers about ``window`` seconds of work and never more than a third of the lease,
    so claimed messages do not wait long unstarted (they count an attempt from their claim).
    """

    def __init__(self, max_size: int, window: float, lease: float) -> None:
        self.max_size = max_size
        self.window = window
        self.lease = lease
        self.seconds: float | None = None
        #: The fewest worth claiming: an async handler's ASYNC_CONCURRENCY (claimed together, they
        #: start together, so none waits unstarted), else 1.
        self.floor = 1

    def update(self, seconds: float) -> None:
        self.seconds = seconds if self.seconds is None else 0.8 * self.seconds + 0.2 * seconds

    @property
    def claim_size(self) -> int:
        if self.seconds is None:
            return min(self.max_size, max(10, self.floor))
        per = max(self.seconds, 1e-6)
        return min(self.max_size, max(self.floor, min(int(self.window / per), int(self.lease / 3 / per))))


class WorkerContext(Protocol):
    """What a claim thread needs from its worker process (:class:`zeroloss.runtime.worker.Worker`)."""

    queues: list[str]
    batch_size: int
    poll_interval: float
    burst: bool
    keeper: LeaseKeeper
    stop: StopFlag
    wakeup: Wakeup

    def service_for(self, actor: str) -> ZeroLossMessageService: ...

    def count(self, outcome: str, n: int = 1) -> None: ...

    def all_idle(self) -> bool: ...

    def child_slot(self, n: int) -> ChildSlot | None:
        """Thread ``n``'s child process (``--pool process``), None with the thread pool."""
        ...


class ClaimLoop:
    def __init__(self, worker: WorkerContext, n: int) -> None:
        self.worker = worker
        self.service: ZeroLossMessageService = worker.service_for(CLAIMER.actor.format(n=n))
        settings = self.service.settings
        self.paces = {
            q: Pace(worker.batch_size, max(settings.ACK_FLUSH_INTERVAL, 0.05), settings.ACK_TIMEOUT)
            for q in worker.queues
        }
        self.monitor = OutageMonitor.for_alias(self.service.using)
        self.backoff = Backoff()
        self.completer = Completer(
            self.service,
            worker.keeper,
            on_report=self._count,
            wait=worker.stop.wait,
            tolerance=settings.DB_OUTAGE_TOLERANCE,
        )
        self.transactional = TransactionalBatches(
            self.service, worker.keeper, stopping=lambda: bool(worker.stop)
        )
        self.batch: Batch | None = None
        self.claim_unknown = False
        self.slot = worker.child_slot(n)
        #: Until when (monotonic) an idle round polls without reading the next available time:
        #: the last read found a message available that the claims did not take.
        self._blocked_until = 0.0

    # -- bookkeeping ------------------------------------------------------------------------

    def _count(self, report: CompletionReport) -> None:
        for outcome, n in verdict_counts(report).items():
            if n:
                self.worker.count(outcome, n)

    def _attempt(self, work, who: str, slow_after: float | None = None, watched: bool = False):  # type: ignore[no-untyped-def]
        return self.monitor.attempt(
            work,
            who=who,
            backoff=self.backoff,
            wait=self.worker.stop.wait,
            tolerance=self.service.settings.DB_OUTAGE_TOLERANCE,
            slow_after=slow_after,
            watched=watched,
        )

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        try:
            if self.slot is not None:
                self.slot.start()  # before claiming: a child that cannot start claims nothing
            self._loop()
        finally:
            self._give_back()
            if self.slot is not None:
                self.slot.close()
            connections.close_all()

    def _loop(self) -> None:
        turn = 0
        idle_rounds = 0
        worker = self.worker
        while not worker.stop:
            if self.claim_unknown:
                # The last claim died with its connection: it may have committed. Give back
                # whatever the ledger says this thread holds that it does not know of.
                ok, _ = self._attempt(
                    lambda: self.service.release_unknown_claims(self.worker.keeper.held()), "a claim"
                )
                if not ok:
                    continue
                self.claim_unknown = False
            leases: list[Lease] = []
            queue = ""
            seen = worker.wakeup.seen()  # before the claims: a wake-up during them is not lost
            for i in range(len(worker.queues)):
                queue = worker.queues[(turn + i) % len(worker.queues)]
                claimed_at = time.monotonic()
                size = self.paces[queue].claim_size
                # Outcomes still waiting are recorded in the claim's transaction: one commit.
                outcomes, retried = self.completer.take()
                live, lost = self.completer.split_lost(outcomes)
                ok, got = self._attempt(
                    lambda q=queue, s=size, o=live: self._record_and_claim(o, q, s),
                    "an acknowledgement" if live else "a claim",
                    COMMIT_STALL_S if live else None,  # an acknowledgement's commit: a stall shows
                    watched=True,  # a claim's commit still waiting: a stall goes on
                )
                if not ok or got is None:
                    self.completer.restore(outcomes)
                    self.claim_unknown = True
                    break
                report, leases = got
                if lost:
                    report = report or CompletionReport()
                    report.refused.extend(c.lease.message_id for c in lost)
                if report is not None:
                    self.completer.settle(outcomes, report, retried=retried)
                if leases:
                    break
            turn += 1
            if self.claim_unknown:
                continue
            if not leases:
                self.completer.flush()
                idle_rounds += 1
                if worker.burst and idle_rounds >= 2 and worker.all_idle():
                    return
                if not worker.stop:
                    # A rate-limited queue is claimed again when its next token is due.
                    due = self.service.next_token_in(queue)
                    if due is None and not worker.burst:
                        self._sleep_idle(seen)
                    else:
                        worker.wakeup.wait(
                            worker.poll_interval if due is None else min(worker.poll_interval, due),
                            since=seen,
                        )
                continue
            idle_rounds = 0
            spec = get_handler(queue)
            # From when the claim statement ran, not from before it waited for a lock.
            claimed_at = max(claimed_at, self.service.leases.claimed_from)
            if time.monotonic() >= claimed_at + self.service.settings.ACK_TIMEOUT:
                leases, claimed_at = self._revive(leases, claimed_at)
                if not leases:
                    continue
            self.batch = Batch(leases)
            worker.keeper.hold(leases, self.batch, claimed_at=claimed_at, time_limit=spec.time_limit)
            with events.tracer().batch():  # the batch's per-message metrics recorded once, at its end
                if spec.transactional:
                    self._run_transactional(spec, self.paces[queue])
                else:
                    self._run_plain(spec, self.paces[queue])
            self.batch = None

    def _revive(self, leases: list[Lease], claimed_at: float) -> tuple[list[Lease], float]:
        """A claim whose commit took longer than its leases (an fsync stall): they ran out
        before anything ran. Those nobody else took since are revived (Leases.revive_leases),
        again until a revival commits within its own lease, so that they run once commits are
        fast again instead of being swept with their attempt spent; at most REVIVE_WITHIN
        seconds. Returns the leases revived, and when their leases were set."""
        ttl = self.service.settings.ACK_TIMEOUT
        given_up_at = time.monotonic() + REVIVE_WITHIN
        while leases and not self.worker.stop and time.monotonic() < given_up_at:
            started = time.monotonic()
            # A revival's time is its commit's (one row each, by id): a stall shows.
            ok, revived = self._attempt(
                lambda held=leases: self.service.revive_leases(held), "a lease revival", COMMIT_STALL_S
            )
            if not ok:
                break
            leases = [x for x in leases if x.message_id in revived]
            if time.monotonic() < started + ttl:
                return leases, started
        # Left to run out: the sweep puts them back (their attempts counted), as before.
        self.worker.count(Outcome.LEASE_LOST, len(leases))
        return [], claimed_at

    def _sleep_idle(self, seen: int) -> None:
        """After a claim round found nothing: wait for the next claim worth trying.

        Without a listener (SQLite, ``--no-listen``, the listener reconnecting): ``poll_interval``.
        With one, an idle worker costs the database nothing: it reads when its queues' earliest
        pending message becomes available and sleeps until then (at most :data:`IDLE_POLL`,
        then it reads again) or until a wake-up. One available now that the claims did not take
        (a paused or limited queue, rows locked by another claim) is polled for as before.
        """
        worker = self.worker
        wakeup = worker.wakeup
        first = True
        while not worker.stop:
            if not wakeup.listening.is_set() or (first and time.monotonic() < self._blocked_until):
                wakeup.wait(worker.poll_interval, since=seen)
                return
            ok, ahead = self._attempt(lambda: self.service.next_available_in(worker.queues), "a claim")
            if not ok:
                return
            if ahead is not None and ahead <= 0:
                if first:  # available, yet not claimed: poll, and read again only after a while
                    self._blocked_until = time.monotonic() + BLOCKED_RECHECK
                    wakeup.wait(worker.poll_interval, since=seen)
                return
            sleep = IDLE_POLL if ahead is None or ahead > IDLE_POLL else ahead + AHEAD_MARGIN
            if wakeup.wait(sleep, since=seen) or sleep < IDLE_POLL:
                return  # woken, or the earliest message is due: claim
            first = False  # the safety net's look: claim only if something is due

    def _record_and_claim(
        self, outcomes: list[Completion], queue: str, size: int
    ) -> tuple[CompletionReport | None, list[Lease]]:
        service = self.service
        if not outcomes:
            # No transaction of the worker's: nothing for a worker that stalls to hold (on
            # PostgreSQL the claim's own, bounded; Leases._planned_claim).
            return None, service.claim(queue, limit=size)
        with transaction.atomic(using=service.using):
            # Two statements, one commit: the server ends the transaction should this worker
            # stall between them (cut off or dead, its session's keepalives do).
            service.leases.bound_claim_transaction()
            return service.record_outcomes(outcomes), service.claim(queue, limit=size)

    def _run_plain(self, spec: HandlerSpec, pace: Pace) -> None:
        assert self.batch is not None
        keeper = self.worker.keeper
        settings = self.service.settings
        if spec.is_async and self.slot is None:
            pace.floor = settings.ASYNC_CONCURRENCY
            AsyncBatchRunner(
                keeper=keeper,
                completer=self.completer,
                stopping=lambda: bool(self.worker.stop),
                count=self.worker.count,
                concurrency=settings.ASYNC_CONCURRENCY,
                timeout=settings.HANDLER_TIMEOUT,
                worker=self.service.instance_id,
            ).run(spec, self.batch, pace.update)
            return
        while (lease := self.batch.next()) is not None:
            if self.worker.stop:
                self.completer.add(
                    Completion(lease, Verdict.RELEASE, "released unstarted at worker shutdown")
                )
                for rest in self.batch.take_unstarted():
                    self.completer.add(
                        Completion(rest, Verdict.RELEASE, "released unstarted at worker shutdown")
                    )
                break
            if keeper.is_lost(lease.message_id):
                # Its lease lapsed before it started (an outage): another worker will run it.
                keeper.drop([lease.message_id])
                self.worker.count(Outcome.LEASE_LOST)
                continue
            if keeper.is_abort_requested(lease.message_id):
                # Aborted before it started: not run; its release is recorded cancelled.
                self.completer.add(Completion(lease, Verdict.RELEASE, "aborted before it started"))
                continue
            if self.slot is not None:  # in its child process (async ones too, one at a time)
                mid = lease.message_id
                run = self.slot.run(
                    spec,
                    lease,
                    aborted=functools.partial(keeper.is_abort_requested, mid),
                    lost=functools.partial(keeper.is_lost, mid),
                )
            else:
                run = run_handler(spec, Delivery(lease, keeper), worker=self.service.instance_id)
            self.batch.done()
            pace.update(run.seconds)
            self.completer.add(run.completion(lease))
            if self.completer.due and self.batch.has_more:
                self.completer.flush()
        # What is left is recorded with the next claim, in its transaction.

    def _run_transactional(self, spec: HandlerSpec, pace: Pace) -> None:
        """Each ``ACK_BATCH_SIZE`` of the claim in one transaction (1: a transaction per message)."""
        assert self.batch is not None
        batch = self.batch
        size = self.service.settings.ACK_BATCH_SIZE
        keeper = self.worker.keeper
        while batch.has_more:
            taken: list[Lease] = []
            ok, report = self._attempt(
                lambda taken=taken: self.transactional.run(spec, batch, pace.update, size, taken),
                "a transactional batch",
            )
            if ok and report is not None:
                self._count(report)
                continue
            # Rolled back with its connection (or its commit's outcome is unknown): no effect of
            # this batch is durable unless its acknowledgements are. The handlers ran, so the
            # leases stay this worker's until they run out (never released as unstarted); the
            # sweep then puts each back, its attempt counted, and it runs from a clean slate.
            keeper.forget_later(x.message_id for x in taken)
            self.worker.count(Outcome.LEASE_LOST, len(taken))

    def _give_back(self) -> None:
        """On the way out (stop, crash): record finished outcomes and release unstarted claims."""
        batch, self.batch = self.batch, None
        if batch is not None:
            for lease in batch.take_unstarted():
                self.completer.add(
                    Completion(lease, Verdict.RELEASE, "released unstarted: worker thread stopped")
                )
        try:
            self.completer.flush()
        except Exception:
            logger.exception("could not record the last outcomes; their messages run again after the sweep")
