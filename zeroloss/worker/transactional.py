"""A batch of transactional handlers in one transaction: effects and outcomes commit together.

The batch locks its rows first (fenced: only leases still held and unexpired), so nobody can
move them while it runs and every outcome it records stands, however long it ran.

Handlers first run without savepoints: a savepoint is a round trip per message, as much as a
short handler's own write. When every handler succeeds, which is the common case, one commit
makes their effects and acknowledgements durable together. When one fails (it raised, or
returned with its transaction failed), the whole transaction is rolled back, so nothing of it
was ever durable, and the batch runs again with a savepoint per handler: the failed handler is
not called again (its failure is recorded), the others are called once more and commit once.
After such a rerun the queue keeps savepoints for its next ``CAREFUL_BATCHES`` batches, so a
queue whose handlers often fail does not run its batches twice.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import OperationalError, transaction

from ..handlers import HandlerSpec
from ..ledger.types import Completion, CompletionReport, Lease, Verdict
from ..processing import LEFT_TRANSACTION_FAILED, Delivery, HandlerRun, run_handler, run_in_savepoint
from ..service import ZeroLossMessageService
from .keeper import LeaseKeeper

#: Batches of a queue that run with savepoints after one of its batches had to run again.
CAREFUL_BATCHES = 20


class _HandlerFailed(Exception):
    """Rolls an optimistic batch back: one of its handlers failed."""

    def __init__(self, message_id: str, run: HandlerRun) -> None:
        super().__init__(message_id)
        self.message_id = message_id
        self.run = run


class TransactionalBatches:
    """Runs one claim thread's transactional batches; remembers which queues need savepoints."""

    def __init__(
        self,
        service: ZeroLossMessageService,
        keeper: LeaseKeeper,
        stopping: Callable[[], bool],
    ) -> None:
        self.service = service
        self.keeper = keeper
        self.stopping = stopping
        self.careful: dict[str, int] = {}
        #: Batches rolled back and run again with savepoints (observability, tests).
        self.reruns = 0

    def run(self, spec: HandlerSpec, leases: list[Lease], paced: Callable[[float], None]) -> CompletionReport:
        """Run the batch and record its outcomes; ``paced`` gets each handler's seconds.

        Raises what the database raises (the caller's outage handling decides what then)."""
        queue = spec.queue_name
        if self.careful.get(queue, 0) > 0:
            self.careful[queue] -= 1
            return self._once(spec, leases, paced, failed={})
        try:
            return self._once(spec, leases, paced, failed=None)
        except _HandlerFailed as exc:
            self.reruns += 1
            self.careful[queue] = CAREFUL_BATCHES
            return self._once(spec, leases, paced, failed={exc.message_id: exc.run})

    def _once(
        self,
        spec: HandlerSpec,
        leases: list[Lease],
        paced: Callable[[float], None],
        failed: dict[str, HandlerRun] | None,
    ) -> CompletionReport:
        """One transaction; ``failed`` None: without savepoints, else with, skipping its runs."""
        service = self.service
        using = service.using
        connection = service.connection
        completions: list[Completion] = []
        with transaction.atomic(using=using):
            held = service.lock_held(leases)
            self.keeper.pause(held)
            for lease in leases:
                if lease.message_id not in held:
                    continue  # lost before it started: not run, reported below
                if self.stopping():
                    completions.append(
                        Completion(lease, Verdict.RELEASE, "released unstarted at worker shutdown")
                    )
                    continue
                if failed is None:
                    run = run_handler(spec, Delivery(lease, self.keeper))
                    if run.ok and (
                        connection.needs_rollback or service.engine.transaction_failed(connection)
                    ):
                        run = HandlerRun(False, run.seconds, error=LEFT_TRANSACTION_FAILED)
                    if not run.ok:
                        if service.engine.connection_lost(connection):
                            # The database went away under the handler: an outage for the caller
                            # to ride out (the batch's leases lapse), not the handler's failure.
                            raise OperationalError(
                                f"connection lost during a transactional batch: {run.error}"
                            )
                        raise _HandlerFailed(lease.message_id, run)
                elif lease.message_id in failed:
                    run = failed[lease.message_id]
                else:
                    run = run_in_savepoint(spec, Delivery(lease, self.keeper), using, service.engine)
                paced(run.seconds)
                completions.append(run.completion(lease))
            report = service.complete(completions, locked=True)
        report.refused.extend(x.message_id for x in leases if x.message_id not in held)
        return report
