"""Running handlers in tests: :func:`drain` (docs/testing.md).

``drain("emails")`` runs the pending, available messages of those queues one by one, in the
caller's thread and on the caller's database connection, so it works inside a Django
``TestCase`` (one transaction that is never committed) as well as in a
``TransactionTestCase``. It goes through the ledger's real, fenced statements — claim, then
acknowledge / fail / lock-and-record — exactly as a worker does; only the threads, the lease
keeper and the batching are left out. A transactional handler runs in a savepoint of its own
inside a transaction (a savepoint of the test's) with its outcome, as in the worker.

The built-in worker cannot run inside a test's transaction: its threads have their own
connections, which cannot see uncommitted messages, and it closes the connections it used.
``zeroloss_worker`` refuses to start there (:func:`refuse_inside_a_transaction`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync
from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from .core.doc_pages import see
from .core.states import Status
from .ledger.service import ZeroLossMessageService
from .ledger.types import CompletionReport, Lease
from .runtime.handlers import HandlerSpec, get_handler, registered_queues
from .runtime.processing import Delivery, HandlerRun, run_async_handler, run_handler, run_in_savepoint
from .runtime.transports import database_for

__all__ = ["DrainResult", "DrainedMessage", "drain", "refuse_inside_a_transaction"]

#: The actor drain's claims and outcomes carry in the audit trail.
ACTOR = "zeroloss.testing.drain"
#: Seconds drain's leases last at least: nothing renews them, and a test may stop in a debugger.
LEASE_SECONDS = 600.0


@dataclass(frozen=True)
class DrainedMessage:
    """One attempt drain ran: ``outcome`` is ``completed``, ``failed`` (pending again, after its
    backoff), ``snoozed`` (``zeroloss.Snooze``: pending again, the attempt not counted), ``dead``
    (attempts spent, or not retried) or ``lease_lost`` (not recorded: its lease was gone)."""

    message_id: str
    queue_name: str
    attempt: int
    outcome: str
    error: str = ""
    result: Any = None


@dataclass
class DrainResult:
    """What :func:`drain` ran, in order (a message retried within one drain appears once per attempt)."""

    attempts: list[DrainedMessage] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.attempts)

    def __iter__(self) -> Iterator[DrainedMessage]:
        return iter(self.attempts)

    def __getitem__(self, message_id: str) -> DrainedMessage:
        """The last attempt of one message (``KeyError`` if drain did not run it)."""
        for attempt in reversed(self.attempts):
            if attempt.message_id == message_id:
                return attempt
        raise KeyError(message_id)

    @property
    def outcomes(self) -> dict[str, str]:
        """Message id -> the outcome of its last attempt."""
        return {a.message_id: a.outcome for a in self.attempts}

    @property
    def errors(self) -> dict[str, str]:
        """Message id -> the error of its last failed attempt (the handler's traceback)."""
        return {a.message_id: a.error for a in self.attempts if a.error}

    @property
    def counts(self) -> Counter[str]:
        """Attempts by outcome."""
        return Counter(a.outcome for a in self.attempts)

    @property
    def completed(self) -> int:
        return self.counts[Status.COMPLETED]

    @property
    def failed(self) -> int:
        return self.counts["failed"]

    @property
    def dead(self) -> int:
        return self.counts[Status.DEAD]

    def raise_errors(self) -> DrainResult:
        """Raise ``AssertionError`` with every error drain recorded, if any (for a test's last line)."""
        if self.errors:
            shown = "\n\n".join(f"{mid}:\n{text}" for mid, text in self.errors.items())
            raise AssertionError(f"{len(self.errors)} message(s) failed in zeroloss.testing.drain:\n{shown}")
        return self


def refuse_inside_a_transaction(using: str = DEFAULT_DB_ALIAS) -> None:
    """Refuse to start a worker inside a transaction (a ``TestCase``): say what to use instead."""
    if connections[using].in_atomic_block:
        raise CommandError(
            f"zeroloss_worker cannot run inside a transaction on database {using!r} (a Django TestCase, "
            "or transaction.atomic()): its threads use connections of their own, which cannot see the "
            "uncommitted messages, and it closes the connections it used, the test's among them. "
            "In a test, run the messages with zeroloss.testing.drain(queue) "
            f"({see('testing', 'Not the worker command')}).",
            returncode=2,
        )


def drain(
    *queues: str, using: str | None = None, max_attempts: int = 1000, batch_size: int = 100
) -> DrainResult:
    """Run the pending, available messages of ``queues`` (all registered queues if none) now.

    Runs until none of them has an available message left or ``max_attempts`` handler runs
    were made; a failed message retries within the same drain only when its backoff has
    already ended (``RETRY_BACKOFF`` with ``BASE`` 0). Each queue's ledger is the database
    ``QUEUE_DATABASES`` routes it to (``default``), unless ``using`` names one. Raises
    :class:`~zeroloss.exceptions.UnknownQueue` for a queue without a handler. Handler errors
    are returned, not raised (``.raise_errors()``).
    """

    names = list(queues) or registered_queues()
    specs = {queue: get_handler(queue) for queue in names}
    base = ZeroLossMessageService(using=using or DEFAULT_DB_ALIAS)
    lease_seconds = max(base.settings.ACK_TIMEOUT, LEASE_SECONDS)
    services: dict[str, ZeroLossMessageService] = {}
    for queue in names:
        alias = database_for(queue, using)
        if alias not in services:
            services[alias] = ZeroLossMessageService(
                using=alias, instance_id=ACTOR, ack_timeout=lease_seconds
            )
    timeout = base.settings.HANDLER_TIMEOUT
    result = DrainResult()
    while len(result) < max_attempts:
        ran = False
        for queue, spec in specs.items():
            room = min(batch_size, max_attempts - len(result))
            if room <= 0:
                break
            service = services[database_for(queue, using)]
            for lease in service.claim(queue, limit=room):
                ran = True
                result.attempts.append(_run_one(service, spec, lease, timeout))
        if not ran and not any(services[database_for(q, using)].next_token_in(q) == 0.0 for q in specs):
            break  # (0.0: a claim near a limit left its queue to the exact path: claim again at once)
    return result


def _run_one(
    service: ZeroLossMessageService, spec: HandlerSpec, lease: Lease, timeout: float | None
) -> DrainedMessage:
    delivery = Delivery(lease)
    if spec.transactional:
        with transaction.atomic(using=service.using):
            if not service.lock_held([lease]):
                return _drained(lease, HandlerRun(False, 0.0), CompletionReport(refused=[lease.message_id]))
            run = run_in_savepoint(spec, delivery, service.using, service.engine, worker=ACTOR)
            report = service.record_outcomes([run.completion(lease)], locked=True)
        return _drained(lease, run, report)
    if spec.is_async:
        # async_to_sync, not a private loop: the handler's sync_to_async (ORM) calls then run
        # back in this thread, on the test's connection and inside its transaction.
        run = async_to_sync(run_async_handler)(spec, delivery, worker=ACTOR, timeout=timeout)
    else:
        run = run_handler(spec, delivery, worker=ACTOR)
    return _drained(lease, run, service.record_outcomes([run.completion(lease)]))


def _drained(lease: Lease, run: HandlerRun, report: CompletionReport) -> DrainedMessage:
    mid = lease.message_id
    if mid in report.acknowledged:
        outcome = Status.COMPLETED.value
    elif mid in report.dead_lettered:
        outcome = Status.DEAD.value
    elif mid in report.retrying:
        outcome = "failed"
    elif mid in report.snoozed:
        outcome = "snoozed"
    else:
        outcome = "lease_lost"
    return DrainedMessage(mid, lease.queue_name, lease.attempt, outcome, run.error, run.result)
