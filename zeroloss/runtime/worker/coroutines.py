"""Async handlers in the built-in worker: a claimed batch awaited on the claim thread's event loop.

Up to ``ASYNC_CONCURRENCY`` handlers of the batch are in flight at once (a sliding window: one
finishes, the next unstarted one starts). Each is cancelled after ``HANDLER_TIMEOUT`` (a
failed attempt). Leases are renewed by the lease keeper as for plain handlers; outcomes go to
the same batch completer. The loop belongs to the claim thread and is reused by every batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ...ledger.aborts import ABORT_POLL_INTERVAL
from ...ledger.types import Completion, Lease, Verdict
from ..handlers import HandlerSpec
from ..processing import Delivery, HandlerRun, Outcome, run_async_handler, thread_event_loop
from .batch import Batch
from .completer import Completer
from .keeper import LeaseKeeper

SHUTDOWN = "released unstarted at worker shutdown"


class AsyncBatchRunner:
    def __init__(
        self,
        *,
        keeper: LeaseKeeper,
        completer: Completer,
        stopping: Callable[[], bool],
        count: Callable[[str, int], None],
        concurrency: int,
        timeout: float | None,
        worker: str,
    ) -> None:
        self.keeper = keeper
        self.completer = completer
        self.stopping = stopping
        self.count = count
        self.concurrency = max(1, concurrency)
        self.timeout = timeout
        self.worker = worker

    def run(self, spec: HandlerSpec, batch: Batch, update_pace: Callable[[float], None]) -> None:
        loop = thread_event_loop()
        in_flight: dict[asyncio.Task[HandlerRun], Lease] = {}
        # Outcomes due mid-batch are flushed between two turns of the loop, never inside one:
        # Django refuses a database call from a thread while an event loop runs on it. The
        # handlers in flight wait meanwhile (a flush is one statement).
        while not loop.run_until_complete(self._drive(spec, batch, update_pace, in_flight)):
            self.completer.flush()
        batch.done()
        if self.stopping():
            for rest in batch.take_unstarted():
                self.completer.add(Completion(rest, Verdict.RELEASE, SHUTDOWN))
        # What is left is recorded with the next claim, in its transaction.

    async def _drive(
        self,
        spec: HandlerSpec,
        batch: Batch,
        update_pace: Callable[[float], None],
        in_flight: dict[asyncio.Task[HandlerRun], Lease],
    ) -> bool:
        """Run the batch's handlers until none is left (True) or outcomes are due a flush while
        more are to come (False: ``in_flight`` holds the handlers still running)."""
        keeper = self.keeper

        def start_more() -> None:
            while len(in_flight) < self.concurrency and not self.stopping():
                lease = batch.next()
                if lease is None:
                    return
                if keeper.is_lost(lease.message_id):
                    # Its lease lapsed before it started (an outage): another worker will run it.
                    keeper.drop([lease.message_id])
                    self.count(Outcome.LEASE_LOST, 1)
                    continue
                task = asyncio.ensure_future(
                    run_async_handler(spec, Delivery(lease, keeper), worker=self.worker, timeout=self.timeout)
                )
                in_flight[task] = lease

        start_more()
        checked = time.monotonic()
        while in_flight:
            done, _ = await asyncio.wait(
                in_flight, timeout=ABORT_POLL_INTERVAL, return_when=asyncio.FIRST_COMPLETED
            )
            if time.monotonic() - checked >= ABORT_POLL_INTERVAL:  # not at every completion: hundreds may run
                checked = time.monotonic()
                for task, lease in in_flight.items():
                    # Its lease was lost (the worker frozen or cut off past ACK_TIMEOUT): the message
                    # may run elsewhere already, so this run stops (its outcome would be refused).
                    if task not in done and not task.done() and keeper.is_lost(lease.message_id):
                        task.cancel()
            if not done:
                continue
            width = len(in_flight)
            for task in done:
                lease = in_flight.pop(task)
                if task.cancelled():  # stopped above: its lease was lost
                    keeper.drop([lease.message_id])
                    self.count(Outcome.LEASE_LOST, 1)
                    continue
                run = task.result()  # run_async_handler records every failure, it never raises
                # Seconds of the thread's time per message: they overlapped ``width`` at a time.
                update_pace(run.seconds / width)
                self.completer.add(run.completion(lease))
            if self.completer.due and (in_flight or batch.has_more):
                return False
            start_more()
        return True
