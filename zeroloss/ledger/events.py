"""The ledger's one road out: typed events of what it did, published after the commit.

Every side effect of an outcome leaves through here: log records, signals, telemetry, metrics and
this process's waiters for outcomes are *subscribers* (:mod:`zeroloss.apps` installs them at
``ready()``), and the ledger imports none of them. The events are derived in one place, the
``of_*`` functions below, from the rows a transition moved or the report of a batch of outcomes;
:meth:`.base.LedgerContext.emit` publishes them once the transaction on the ledger's database
alias commits (at once outside one), never for a rollback, in the order they happened.

The layers above publish here too, so a signal has one sender: the senders' ``Sent`` (after
their commit) and a handler run's ``Started`` (at once).

Spans wrap work in progress rather than report an outcome: the ledger names the work
(:func:`span`, :func:`settle_span`) and the tracer installed by the telemetry layer
(:func:`install_tracer`) makes the span; with none installed they cost one attribute check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..core.states import Status
from .types import Completion, CompletionReport, Lease

if TYPE_CHECKING:
    from .engine import Rows

__all__ = [
    "Cancelled",
    "Claimed",
    "DeadLettered",
    "Event",
    "Finished",
    "MessageEvent",
    "Recovered",
    "Released",
    "Sent",
    "Started",
    "Subscriber",
    "Tracer",
    "install_tracer",
    "of_cancels",
    "of_outcomes",
    "of_sweep",
    "publish",
    "settle_span",
    "span",
    "subscribe",
    "wanted",
]


@dataclass(frozen=True, slots=True)
class Sent:
    """A message is stored (``send``/``send_many``; an idempotent resend too)."""

    message_id: str
    queue_name: str
    using: str


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim of ``queue_name`` leased these messages."""

    queue_name: str
    leases: Sequence[Lease]


@dataclass(frozen=True, slots=True)
class Started:
    """A handler is about to run (published at once: it is no transition)."""

    delivery: Any
    worker: str


@dataclass(frozen=True, slots=True)
class MessageEvent:
    """What every event of one message's transition tells: ``worker`` is who ran it (for the
    sweep's, who held the expired lease; for an operator's, the actor)."""

    message_id: str
    queue_name: str
    attempt: int
    worker: str
    using: str


@dataclass(frozen=True, slots=True)
class Finished(MessageEvent):
    """An attempt's outcome: ``completed``, ``failed``, ``snoozed``, ``dead``, ``cancelled`` or
    ``lease_lost`` (nothing recorded); ``error`` is "" unless failed or dead."""

    outcome: str
    error: str


@dataclass(frozen=True, slots=True)
class Released:
    """A claimed message given back unstarted (no attempt: no :class:`Finished`)."""

    message_id: str
    queue_name: str


@dataclass(frozen=True, slots=True)
class DeadLettered(MessageEvent):
    """A message went ``dead``: ``by`` ``"worker"`` (its last attempt failed; ``max_attempts`` and
    ``headers`` from its lease) or ``"sweep"`` (its last attempt's lease expired; ``error`` is the
    audit detail)."""

    error: str
    by: str
    max_attempts: int = 0
    headers: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Recovered(MessageEvent):
    """The sweep put back to pending a message whose lease expired."""


@dataclass(frozen=True, slots=True)
class Cancelled(MessageEvent):
    """A message went ``cancelled``: ``by`` ``"worker"`` (its run was aborted), ``"sweep"`` (aborted,
    its lease expired) or ``"operator"``."""

    by: str


Event = Sent | Claimed | Started | Finished | Released | DeadLettered | Recovered | Cancelled


class Subscriber(Protocol):
    """What subscribes to the events: a cheap check, then the events of one transaction."""

    def wants(self, kind: type, /) -> bool:
        """Whether events of this kind would do anything now (no: they are not even built)."""
        ...

    def __call__(self, sender: type | None, events: Sequence[Event], /) -> None:
        """The events, in order; ``sender``: the class of the service that performed them
        (None: published by a layer above the ledger)."""
        ...


_subscribers: list[Subscriber] = []


def subscribe(*subscribers: Subscriber) -> None:
    """Install the subscribers, in the order each batch of events reaches them (replacing any
    installed before: idempotent, called from ``ready()``)."""
    _subscribers[:] = subscribers


def wanted(*kinds: type) -> bool:
    """Whether any subscriber wants events of these kinds (the check before building them)."""
    return any(s.wants(kind) for s in _subscribers for kind in kinds)


def publish(sender: type | None, events: Sequence[Event]) -> None:
    """Hand ``events`` to every subscriber, now (after the commit: :meth:`.base.LedgerContext.emit`)."""
    if events:
        for subscriber in list(_subscribers):
            subscriber(sender, events)


# --- the events of a transition: derived here only -------------------------------------------


def of_outcomes(
    using: str, worker: str, batch: Sequence[Completion], report: CompletionReport
) -> list[Event]:
    """A recorded batch of outcomes, message by message in the batch's order."""
    outcome_of = {
        **dict.fromkeys(report.acknowledged, Status.COMPLETED.value),
        **dict.fromkeys(report.retrying, "failed"),
        **dict.fromkeys(report.dead_lettered, Status.DEAD.value),
        **dict.fromkeys(report.refused, "lease_lost"),
        **dict.fromkeys(report.cancelled, Status.CANCELLED.value),
        **dict.fromkeys(report.snoozed, "snoozed"),
    }
    released = set(report.released)
    found: list[Event] = []
    for c in batch:
        lease = c.lease
        mid, queue, attempt = lease.message_id, lease.queue_name, lease.attempt
        outcome = outcome_of.get(mid)
        if outcome == Status.DEAD:
            dead = DeadLettered(
                mid, queue, attempt, worker, using, c.error, "worker", lease.max_attempts, lease.headers
            )
            found.append(dead)
        elif outcome == Status.CANCELLED:
            found.append(Cancelled(mid, queue, attempt, worker, using, "worker"))
        if outcome is not None:
            error = c.error if outcome in ("failed", Status.DEAD) else ""
            found.append(Finished(mid, queue, attempt, worker, using, outcome, error))
        elif mid in released:
            found.append(Released(mid, queue))
    return found


_HELD_BY = ("lease held by ", " expired")


def of_sweep(using: str, rows: Rows) -> list[Event]:
    """A sweep batch's moved rows (:data:`.statements_moves.MOVED`: ``message_id`` at 1,
    ``status`` 2, ``attempts`` 3, ``detail`` 7, ``queue_name`` 8)."""
    found: list[Event] = []
    for row in rows:
        mid, status, attempt, detail, queue = row[1], row[2], row[3], row[7] or "", row[8]
        holder = detail.removeprefix(_HELD_BY[0]).removesuffix(_HELD_BY[1])
        if status == Status.CANCELLED:
            found.append(Cancelled(mid, queue, attempt, holder, using, "sweep"))
        elif status == Status.DEAD:
            found.append(DeadLettered(mid, queue, attempt, holder, using, detail, "sweep"))
        else:
            found.append(Recovered(mid, queue, attempt, holder, using))
    return found


def of_cancels(using: str, actor: str, moved: Sequence[tuple[str, str]]) -> list[Event]:
    """An operator's cancel: ``(message_id, queue_name)`` of each message moved."""
    return [Cancelled(mid, queue, 0, actor, using, "operator") for mid, queue in moved]


# --- spans: work in progress, made by the installed tracer ------------------------------------


class Tracer(Protocol):
    """The telemetry layer's spans around the ledger's work."""

    def operation(self, name: str, **attributes: Any) -> AbstractContextManager[None]: ...

    def settle_span(self, batch: Sequence[Completion]) -> AbstractContextManager[None]: ...


_tracer: list[Tracer] = []


def install_tracer(tracer: Tracer) -> None:
    """Install (or replace) the tracer; idempotent, called from ``ready()``."""
    _tracer[:] = [tracer]


def span(name: str, **attributes: Any) -> AbstractContextManager[None]:
    """Around a ledger-wide operation: ``sweep`` or an operator action (its reason)."""
    if not _tracer:
        return contextlib.nullcontext()
    return _tracer[0].operation(name, **attributes)


def settle_span(batch: Sequence[Completion]) -> AbstractContextManager[None]:
    """Around recording a batch of outcomes (one transaction)."""
    if not _tracer:
        return contextlib.nullcontext()
    return _tracer[0].settle_span(batch)
