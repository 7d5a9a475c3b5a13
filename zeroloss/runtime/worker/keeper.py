"""The lease keeper: one thread per worker process that renews the leases of messages in hand.

A message is *in hand* from its claim until its outcome is recorded (a batched outcome may
wait a few milliseconds for its flush; the lease is renewed until then). It is not renewed
once the keeper knows it lost the lease, nor past its hard bound (the handler's ``time_limit``,
else ``HANDLER_TIMEOUT``). Claimed messages not
yet started are never held behind a handler that runs long: after one renewal interval the
keeper gives them back (released, the attempt not counted) so another worker takes them.

The keeper never waits for a row lock (a row locked elsewhere is skipped and renewed at the
next tick), and never lets go of a message it failed to give back: a release that fails is
tried again at every tick until it lands or the lease is gone. It is also the watchdog of
the transactional batches (:mod:`.transactional`, :mod:`.watchdog`): a batch whose handler runs past
``HANDLER_TIMEOUT`` has its server session ended, so that its transaction and every lock it
holds go with it; its other messages, whose effects rolled back, are given back unstarted.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import DatabaseError, connections

from ...core.outage import COMMIT_STALL_S, Backoff, OutageMonitor
from ...ledger.aborts import ABORT_POLL_INTERVAL
from ...ledger.service import ZeroLossMessageService
from ...ledger.types import Completion, Lease, Verdict
from .aborts import AbortWatch
from .batch import Batch
from .stops import HandlerStops
from .watchdog import TransactionWatch, TransactionWatchdog

logger = logging.getLogger("zeroloss")


@dataclass
class _Held:
    lease: Lease
    #: Monotonic time by which the lease has certainly expired unless renewed (measured from
    #: before the statement that set it, so never later than the database's own expiry).
    expires: float
    since: float
    batch: Batch | None = None
    timed_out: bool = False
    #: The hard bound of its handler's run: its ``time_limit``, else ``HANDLER_TIMEOUT``.
    limit: float | None = None
    #: Its queue has a concurrency limit: its lease is its slot, renewed past the hard bound until
    #: the handler returns (let go, another run of the queue could start beside this one).
    holds_slot: bool = False


class LeaseKeeper(AbortWatch, HandlerStops, TransactionWatchdog):
    """Renews every held lease each ``interval`` seconds in one statement, on its own connection."""

    def __init__(
        self,
        service: ZeroLossMessageService,
        interval: float,
        *,
        tolerance: float | None = None,
        handler_timeout: float | None = None,
        on_released: Callable[[int], None] | None = None,
    ) -> None:
        self.service = service
        self.interval = interval
        self.tolerance = tolerance
        self.handler_timeout = handler_timeout
        self.on_released = on_released
        self.monitor = OutageMonitor.for_alias(service.using)
        self.lost: set[str] = set()
        self.aborted: set[str] = set()  # see AbortWatch
        self.gave_up: BaseException | None = None
        self._held: dict[str, _Held] = {}
        #: Held, their outcomes being recorded (taken by the completer, not settled yet).
        self._settling: set[str] = set()
        #: Given back but not recorded yet (a failed release is tried again at every tick).
        self._releasing: dict[str, Completion] = {}
        self._watched: dict[int, TransactionWatch] = {}  # see TransactionWatchdog
        self._guards = {}  # see HandlerStops
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run_recorded, name="zeroloss-keeper", daemon=True)

    # -- what the workers tell it -----------------------------------------------------------

    def start(self) -> LeaseKeeper:
        """Run :meth:`run` on a thread of its own (outside a worker's supervisor)."""
        self._thread.start()
        return self

    def hold(
        self,
        leases: Iterable[Lease],
        batch: Batch | None = None,
        *,
        claimed_at: float | None = None,
        time_limit: float | None = None,
    ) -> None:
        """Renew these until dropped; ``time_limit`` overrides ``HANDLER_TIMEOUT`` for them."""
        now = time.monotonic() if claimed_at is None else claimed_at
        ttl = self.service.settings.ACK_TIMEOUT
        limit = self.handler_timeout if time_limit is None else time_limit
        leases = list(leases)
        slots = {q: self._bounds_running(q) for q in {x.queue_name for x in leases}}
        with self._lock:
            for lease in leases:
                held = _Held(lease, now + ttl, now, batch, limit=limit, holds_slot=slots[lease.queue_name])
                self._held[lease.message_id] = held
                self.lost.discard(lease.message_id)

    def _bounds_running(self, queue_name: str) -> bool:
        """Whether the queue's runs hold a concurrency slot. Unknown (the database does not answer):
        yes, the limit's side; the worker meets the outage at its next statement."""
        try:
            return self.service.control.bounds_running(queue_name)
        except DatabaseError:
            return True

    def settling(self, message_ids: Iterable[str], *, being: bool = True) -> None:
        """Their outcomes are being recorded (``being=False``: the attempt failed, they are not).
        A renewal refused meanwhile is the outcome's commit having come first, not a lost lease:
        nothing is marked lost for it (the outcome's own statement is fenced either way)."""
        with self._lock:
            for mid in message_ids:
                if being:
                    self._settling.add(mid)
                else:
                    self._settling.discard(mid)

    def drop(self, message_ids: Iterable[str]) -> None:
        with self._lock:
            for mid in message_ids:
                self._settling.discard(mid)
                self._held.pop(mid, None)
                self._releasing.pop(mid, None)
                self.lost.discard(mid)
                self.aborted.discard(mid)

    def forget_later(self, message_ids: Iterable[str]) -> None:
        """Stop renewing these; they stay this worker's until their leases run out (they ran)."""
        with self._lock:
            for mid in message_ids:
                self._settling.discard(mid)
                if mid in self._held:
                    self.lost.add(mid)

    def _forget_lapsed(self) -> None:
        now = time.monotonic()
        with self._lock:
            for mid in [m for m in self.lost if m in self._held and now >= self._held[m].expires]:
                del self._held[mid]
                self._releasing.pop(mid, None)
                self.lost.discard(mid)
                self.aborted.discard(mid)

    def is_lost(self, message_id: str) -> bool:
        """True once the lease is known lost, or may have expired unrenewed (database down)."""
        with self._lock:
            held = self._held.get(message_id)
            if message_id in self.lost:
                return True
            return held is not None and time.monotonic() >= held.expires

    def held(self) -> list[Lease]:
        with self._lock:
            return [h.lease for h in self._held.values()]

    # -- the thread -----------------------------------------------------------------------

    def _running_for(self, h: _Held, now: float) -> float:
        """How long the message's handler has run (0 while it waits in its batch)."""
        batch = h.batch
        if batch is None:
            return now - h.since
        running = batch.running
        return now - batch.running_since if running is not None and running is h.lease else 0.0

    def _due(self) -> list[_Held]:
        """Held leases to renew now: not lost, their handler not past its hard bound."""
        now = time.monotonic()
        due = []
        with self._lock:
            for h in self._held.values():
                if h.lease.message_id in self.lost:
                    continue
                if h.limit is not None and self._running_for(h, now) >= h.limit:
                    if h.holds_slot:
                        if not h.timed_out:
                            h.timed_out = True
                            logger.warning(
                                "%s: its handler has run longer than its hard time limit (%gs: time_limit, "
                                "else HANDLER_TIMEOUT); its queue has a concurrency limit, so its lease "
                                "(its slot) is kept until the handler returns",
                                h.lease.message_id,
                                h.limit,
                            )
                        due.append(h)
                        continue
                    if not h.timed_out:
                        h.timed_out = True
                        # The hard limit lets the lease go; once it has run out, stops.py stops the run.
                        logger.warning(
                            "%s: its handler has run longer than its hard time limit (%gs: time_limit, "
                            "else HANDLER_TIMEOUT); its lease is left to expire, the message goes to "
                            "another worker and this run's outcome will be refused",
                            h.lease.message_id,
                            h.limit,
                        )
                    continue
                due.append(h)
        return due

    def _has_work(self) -> bool:
        self._forget_lapsed()
        if self._due() or self._releasing or self._overdue_transactions():
            return True
        with self._lock:
            batches = [h.batch for h in self._held.values() if h.batch is not None]
        return any(
            b.running is not None and time.monotonic() - b.running_since >= self.interval for b in batches
        )

    def renew_now(self) -> None:
        due = self._due()
        if not due:
            return
        started = time.monotonic()
        leases = [h.lease for h in due]
        renewed = self.service.renew_leases(leases)
        # Not renewed: lost, or locked elsewhere for a moment (skipped, not waited for).
        missed = [x for x in leases if x.message_id not in renewed]
        busy = self.service.busy_leases(missed) if missed else set()
        ttl = self.service.settings.ACK_TIMEOUT
        answered = time.monotonic()
        with self._lock:
            for h in due:
                mid = h.lease.message_id
                if mid not in self._held or mid in busy or (mid in self._settling and mid not in renewed):
                    continue  # recorded meanwhile (or being: committed first), or renewed at the next tick
                if mid in renewed and answered < h.expires:
                    h.expires = started + ttl
                elif mid in renewed and mid not in self.lost:
                    # Renewed, but only after its lease had run out here: meanwhile the worker
                    # may have reported it lost. Lost stays lost; the lease simply runs out.
                    logger.warning(
                        "lease of %s was renewed only after it had expired here; treated as lost", mid
                    )
                    self._lose(mid)
                    h.expires = started + ttl  # remembered as ours until the renewed lease runs out
                elif mid not in self.lost:
                    logger.warning("lease of %s was lost before it could be renewed", mid)
                    self._lose(mid)

    def give_back(self, completions: Iterable[Completion]) -> None:
        """Release these unstarted messages at the next tick (renewed until it lands)."""
        with self._lock:
            for c in completions:
                if c.lease.message_id in self._held:
                    self._releasing[c.lease.message_id] = c

    def release_stuck_unstarted(self) -> int:
        """Give back claimed messages waiting behind a handler that has run one interval or more,
        and whatever an earlier tick could not give back."""
        with self._lock:
            batches = {id(h.batch): h.batch for h in self._held.values() if h.batch is not None}
        for batch in batches.values():
            taken = batch.take_unstarted(if_running_longer_than=self.interval)
            if taken:
                running = batch.running.message_id if batch.running else "?"
                detail = f"released unstarted: waited behind {running}, still running"
                self.give_back(Completion(lease, Verdict.RELEASE, detail) for lease in taken)
        with self._lock:
            pending = list(self._releasing.values())
        if not pending:
            return 0
        # Still in hand until this lands: a failure leaves them to the next tick.
        report = self.service.record_outcomes(pending)
        self.drop(c.lease.message_id for c in pending)
        released = len(report.released)
        if released and self.on_released:
            self.on_released(released)
        return released

    def run(self) -> None:
        """Renew, release and watch until stopped; raises what ends it (a bug, or
        :class:`~zeroloss.core.outage.OutageTooLong` past ``DB_OUTAGE_TOLERANCE``)."""
        backoff = Backoff()

        def tick() -> None:
            self.renew_now()
            self.end_overdue_transactions()
            self.release_stuck_unstarted()

        poll = min(self.interval, ABORT_POLL_INTERVAL)
        renew_at = time.monotonic() + self.interval
        try:
            while not self._stop.wait(poll):
                if self._held:
                    self.stop_lapsed_runs()
                    # An outage is the renewals' to notice and wait out (below), not this read's.
                    with contextlib.suppress(DatabaseError):
                        self.poll_aborts()
                if time.monotonic() < renew_at:
                    continue
                renew_at = time.monotonic() + self.interval
                if not self._has_work():
                    # No statement to run: a tick that succeeds without the database must not
                    # tell the outage monitor the database is back (a stall may end: no commit
                    # was slow for a while).
                    self.monitor.stall_over()
                    continue
                self.monitor.attempt(
                    tick,
                    who="the lease keeper",
                    backoff=backoff,
                    wait=self._stop.wait,
                    tolerance=self.tolerance,
                    slow_after=COMMIT_STALL_S,
                )
        finally:
            connections.close_all()

    def _run_recorded(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            self.gave_up = exc
            logger.exception("lease keeper stopped: %s", exc)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
