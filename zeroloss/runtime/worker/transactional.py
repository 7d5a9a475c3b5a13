"""Transactional handlers: a batch of them in one transaction, effects and outcomes commit together.

The messages are not locked while their handlers run: they are held by their leases, which
the lease keeper renews as for any other handler, so that a worker that stalls, dies or is cut
off loses them when its leases run out, and the sweep hands them to another worker. The
outcomes are recorded at the end, in the batch's transaction, by the ordinary fenced
statements (current token, still processing, lease unexpired by the database clock): a batch
whose leases ran out records nothing, and rolls back with its effects. One commit makes every
effect and its acknowledgement durable together.

Nothing of the transaction outlives its worker (docs/guarantees.md, "Every lock bounded by its
lease"): the server ends it when the worker's host dies or is cut off (the session keepalives
of :mod:`zeroloss.runtime.worker.sessions`), when it stays idle or runs one statement past
``HANDLER_TIMEOUT`` plus the lease (the bounds :meth:`Engine.open_batch` sets), and the lease
keeper ends its session when a handler runs past ``HANDLER_TIMEOUT``.

Handlers first run without savepoints: a savepoint is a round trip per message, as much as a
short handler's own write. When every handler succeeds, which is the common case, one commit
makes their effects and acknowledgements durable together. When one fails (it raised, or
returned with its transaction failed), the whole transaction is rolled back, so nothing of it
was ever durable, and the batch runs again with a savepoint per handler: the failed handler is
not called again (its failure is recorded), the others are called once more and commit once.
After such a rerun the queue keeps savepoints for its next ``CAREFUL_BATCHES`` batches, so a
queue whose handlers often fail does not run its batches twice.

A handler that ends the batch's transaction itself (a raw ``COMMIT`` or ``ROLLBACK``) cannot
commit its neighbours' effects: the commit is refused (a guard row on PostgreSQL, an
authoriser on SQLite), and a rollback is noticed. The batch's messages then run again one to
a transaction, so that the handler that did it fails alone.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from ...ledger.service import ZeroLossMessageService
from ...ledger.types import Completion, CompletionReport, Lease, Verdict
from ..handlers import HandlerSpec
from ..processing import LEFT_TRANSACTION_FAILED, Delivery, HandlerRun, run_handler, run_in_savepoint
from .batch import Batch
from .keeper import LeaseKeeper
from .watchdog import TransactionWatch

#: Batches of a queue that run with savepoints after one of its batches had to run again.
CAREFUL_BATCHES = 20

#: Why a handler that ended its batch's transaction failed.
ENDED_TRANSACTION = (
    "the handler ended its batch's transaction (a raw COMMIT or ROLLBACK): zeroloss commits a "
    "transactional batch itself, with its acknowledgements; use transaction.atomic() for a savepoint"
)
RELEASED_AT_SHUTDOWN = "released unstarted at worker shutdown"


class _HandlerFailed(Exception):
    """Rolls an optimistic batch back: one of its handlers failed."""

    def __init__(self, message_id: str, run: HandlerRun) -> None:
        super().__init__(message_id)
        self.message_id = message_id
        self.run = run


class _TransactionEnded(Exception):
    """A handler (``message_id``, when known) ended the batch's transaction."""

    def __init__(self, message_id: str | None) -> None:
        super().__init__(message_id or "?")
        self.message_id = message_id


class _EndedByKeeper(Exception):
    """The keeper ended the batch's transaction: a handler ran past ``HANDLER_TIMEOUT``."""

    def __init__(self, watch: TransactionWatch) -> None:
        super().__init__(watch.session)
        self.watch = watch


class _ConnectionLost(Exception):
    """The batch's connection went away while ``lease``'s handler ran (``run``)."""

    def __init__(self, lease: Lease, run: HandlerRun) -> None:
        super().__init__(lease.message_id)
        self.lease = lease
        self.run = run


class _Refused(Exception):
    """An outcome of the batch was refused (its lease ran out): the batch rolls back with it."""

    def __init__(self, report: CompletionReport) -> None:
        super().__init__(", ".join(report.refused))
        self.report = report


class _Aborted(Exception):
    """A message of the batch was aborted: its handler's effects must not commit. The batch
    rolls back; the aborted message is then recorded cancelled, the others go back unstarted."""


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
        settings = service.settings
        #: The server's bound on one idle gap or statement of a batch's transaction (0: none).
        self.bound_ms = self._bound_ms(settings.HANDLER_TIMEOUT)
        #: Batches rolled back and run again with savepoints (observability, tests).
        self.reruns = 0

    def _bound_ms(self, timeout: float | None) -> int:
        return 0 if timeout is None else int((timeout + self.service.settings.ACK_TIMEOUT) * 1000)

    def run(
        self,
        spec: HandlerSpec,
        batch: Batch,
        paced: Callable[[float], None],
        size: int | None = None,
        taken: list[Lease] | None = None,
    ) -> CompletionReport:
        """Run up to ``size`` (default ``ACK_BATCH_SIZE``) of the batch's waiting messages in one
        transaction and record their outcomes; ``taken`` gets each message taken from the batch.

        Messages are taken one at a time as their turn comes, so those still waiting can be
        given back by the keeper while a handler runs long. Raises what the database raises
        (the caller's outage handling decides what then); ``taken`` then says what ran."""
        if size is None:
            size = self.service.settings.ACK_BATCH_SIZE
        if taken is None:
            taken = []

        def pull() -> Lease | None:
            if len(taken) >= size:
                return None
            lease = batch.next()
            if lease is not None:
                taken.append(lease)
            return lease

        queue = spec.queue_name
        try:
            if self.careful.get(queue, 0) > 0:
                self.careful[queue] -= 1
                return self._settled(self._once(spec, batch, pull, paced, failed={}), taken)
            try:
                return self._settled(self._once(spec, batch, pull, paced, failed=None), taken)
            except _HandlerFailed as exc:
                self.reruns += 1
                self.careful[queue] = CAREFUL_BATCHES
                # The same messages again, then the rest of the batch's share as before.
                again = iter(list(taken))
                report = self._once(
                    spec, batch, lambda: next(again, None) or pull(), paced, {exc.message_id: exc.run}
                )
                return self._settled(report, taken)
        except _TransactionEnded:
            self.reruns += 1
            return self._settled(self._one_by_one(spec, batch, taken, paced), taken)
        except _Refused as exc:
            return self._settled(self._refused(exc.report, taken), taken)
        except _Aborted:
            return self._settled(self._aborted(taken), taken)
        except _ConnectionLost as exc:
            return self._settled(self._connection_lost(exc, taken), taken)
        except _EndedByKeeper as exc:
            return self._ended_by_keeper(exc.watch, taken)
        finally:
            batch.done()

    def _settled(self, report: CompletionReport, taken: list[Lease]) -> CompletionReport:
        """Recorded: stop renewing. A refused message ran here: it stays this worker's (never
        released as unstarted) until its lease runs out and the sweep hands it on."""
        refused = set(report.refused)
        self.keeper.drop(x.message_id for x in taken if x.message_id not in refused)
        self.keeper.forget_later(refused)
        return report

    def _once(
        self,
        spec: HandlerSpec,
        batch: Batch,
        pull: Callable[[], Lease | None],
        paced: Callable[[float], None],
        failed: dict[str, HandlerRun] | None,
    ) -> CompletionReport:
        """One transaction; ``failed`` None: without savepoints, else with, skipping its runs."""
        engine = self.service.engine
        connection = self.service.connection
        watch: TransactionWatch | None = None
        try:
            with transaction.atomic(using=self.service.using):
                # A handler's own time_limit moves the server's bound with it.
                bound = self.bound_ms if spec.time_limit is None else self._bound_ms(spec.time_limit)
                watch = self.keeper.watch(batch, engine.open_batch(connection, bound))
                try:
                    return self._handlers(spec, batch, pull, paced, failed, watch)
                except BaseException:
                    engine.abandon_batch(connection)
                    raise
        except BaseException as exc:
            if watch is not None and watch.ended:
                raise _EndedByKeeper(watch) from exc
            raise
        finally:
            self.keeper.unwatch(watch)

    def _handlers(
        self,
        spec: HandlerSpec,
        batch: Batch,
        pull: Callable[[], Lease | None],
        paced: Callable[[float], None],
        failed: dict[str, HandlerRun] | None,
        watch: TransactionWatch | None,
    ) -> CompletionReport:
        """Inside the batch's transaction: run the handlers, then record their outcomes."""
        service = self.service
        connection = service.connection
        engine = service.engine
        keeper = self.keeper
        completions: list[Completion] = []
        lost: list[str] = []
        while (lease := pull()) is not None:
            if self.stopping():
                completions.append(Completion(lease, Verdict.RELEASE, RELEASED_AT_SHUTDOWN))
                continue
            if keeper.is_lost(lease.message_id):
                lost.append(lease.message_id)  # lost before it started: not run
                continue
            batch.start(lease)
            if failed is None:
                run = run_handler(spec, Delivery(lease, keeper), worker=service.instance_id)
                self._check_still_open(lease, run, paced)
                if run.ok and (connection.needs_rollback or engine.transaction_failed(connection)):
                    run = HandlerRun(False, run.seconds, error=LEFT_TRANSACTION_FAILED)
                if not run.ok:
                    raise _HandlerFailed(lease.message_id, run)
            elif lease.message_id in failed:
                run = failed[lease.message_id]
            else:
                try:
                    run = run_in_savepoint(
                        spec, Delivery(lease, keeper), service.using, engine, worker=service.instance_id
                    )
                except Exception as exc:
                    # Its savepoint went with the transaction or the connection.
                    self._check_still_open(lease, HandlerRun(False, 0.0, error=str(exc)), paced)
                    raise
                self._check_still_open(lease, run, paced)
            batch.done()
            if watch is not None:
                watch.done.append(lease)
            paced(run.seconds)
            completions.append(run.completion(lease))
        if not engine.close_batch(connection):
            raise _TransactionEnded(None)
        report = service.record_outcomes(completions)
        if report.refused:
            raise _Refused(report)
        if report.cancelled:
            raise _Aborted()
        report.refused.extend(lost)
        return report

    def _check_still_open(self, lease: Lease, run: HandlerRun, paced: Callable[[float], None]) -> None:
        """After ``lease``'s handler: the batch's connection and transaction are still there."""
        engine = self.service.engine
        connection = self.service.connection
        if engine.connection_lost(connection):
            paced(run.seconds)
            if run.ok:
                run = HandlerRun(False, run.seconds, error="the handler closed its database connection")
            raise _ConnectionLost(lease, run)
        if not engine.in_batch_transaction(connection):
            raise _TransactionEnded(lease.message_id)

    def _ended_by_keeper(self, watch: TransactionWatch, taken: list[Lease]) -> CompletionReport:
        """The keeper ended the transaction (a handler ran past ``HANDLER_TIMEOUT``): nothing of
        it committed. The keeper gives back what it had run, unstarted; anything else taken goes
        the same way; the overdue message is left to its lease (the sweep counts its attempt)."""
        overdue = watch.overdue
        self.keeper.give_back(
            Completion(x, Verdict.RELEASE, "released unstarted: its batch's transaction was ended")
            for x in taken
            if overdue is None or x.message_id != overdue.message_id
        )
        self.service.connection.close()  # its session is gone
        return CompletionReport(refused=[overdue.message_id] if overdue is not None else [])

    def _connection_lost(self, lost: _ConnectionLost, taken: list[Lease]) -> CompletionReport:
        """The connection went away while a handler ran (it closed it, or the server ended the
        session): the transaction never reached its commit, so nothing of it landed. On a new
        connection, that handler's failure is recorded and the others go back unstarted. When
        the database is down, this raises: an outage for the caller, whose leases then lapse."""
        self.service.connection.close()
        culprit = lost.lease.message_id
        error = f"the batch's database connection was lost while this handler ran: {lost.run.error}"
        return self.service.record_outcomes(
            [
                Completion(lost.lease, Verdict.FAIL, error=error),
                *(
                    Completion(
                        x,
                        Verdict.RELEASE,
                        f"released unstarted: its batch's connection was lost in {culprit}",
                    )
                    for x in taken
                    if x.message_id != culprit
                ),
            ]
        )

    def _refused(self, refused: CompletionReport, taken: list[Lease]) -> CompletionReport:
        """Some leases ran out before the outcomes were recorded: the transaction rolled back,
        so no effect of it landed. The refused are another worker's now; the others are still
        ours, their effects rolled back: given back unstarted."""
        lost = set(refused.refused)
        again = [x for x in taken if x.message_id not in lost]
        report = self.service.record_outcomes(
            Completion(
                x, Verdict.RELEASE, "released unstarted: its batch rolled back (a lease in it ran out)"
            )
            for x in again
        )
        report.refused.extend(lost)
        return report

    def _aborted(self, taken: list[Lease]) -> CompletionReport:
        """A message of the batch was aborted, so the batch rolled back: no effect of it landed.
        Every message goes back unstarted; the aborted ones are refused a release and recorded
        cancelled instead (Outcomes.record)."""
        return self.service.record_outcomes(
            Completion(
                x, Verdict.RELEASE, "released unstarted: its batch rolled back (a message in it was aborted)"
            )
            for x in taken
        )

    def _one_by_one(
        self, spec: HandlerSpec, batch: Batch, taken: list[Lease], paced: Callable[[float], None]
    ) -> CompletionReport:
        """After a handler ended the batch's transaction (nothing of it committed): each message
        again in a transaction of its own, so the handler that does it again fails alone."""
        report = CompletionReport()
        for lease in taken:
            one = iter([lease])
            try:
                part = self._once(spec, batch, lambda one=one: next(one, None), paced, failed={})  # type: ignore[misc]
            except _TransactionEnded:
                part = self.service.record_outcomes(
                    [Completion(lease, Verdict.FAIL, error=ENDED_TRANSACTION)]
                )
            except _Refused as exc:
                part = exc.report
            except _Aborted:
                part = self._aborted([lease])
            report.acknowledged.extend(part.acknowledged)
            report.retrying.extend(part.retrying)
            report.dead_lettered.extend(part.dead_lettered)
            report.released.extend(part.released)
            report.refused.extend(part.refused)
            report.cancelled.extend(part.cancelled)
        return report
