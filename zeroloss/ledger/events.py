"""The ledger's one road out: typed events of what it did, published after the commit.

Every side effect of an outcome leaves through here: log records, signals, telemetry, metrics and
this process's waiters for outcomes are *subscribers* (:mod:`zeroloss.apps` installs them at
``ready()``), and the ledger imports none of them. The events are derived in one place, the
``of_*`` functions below, from the rows a transition moved or the report of a batch of outcomes;
:meth:`.base.LedgerContext.emit` publishes them once the transaction on the ledger's database
alias commits (at once outside one), never for a rollback, in the order they happened.

The layers above publish here too, so a signal has one sender: the senders' ``Sent`` (after
their commit) and a handler run's ``Started`` (at once).

Spans wrap work in progress rather than report an outcome: the ledger and the runtime name the
work (:func:`span`, :func:`settle_span`, ``tracer().send_span``, ``.process``, ``.batch``) and the
tracer installed by the telemetry layer (:func:`install_tracer`) makes the span; until one is
installed, none is made.
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
    "NO_PROCESS",
    "NO_SPAN",
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
    "tracer",
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
    """The telemetry layer's spans around work in progress: the ledger's (an operation, a settle)
    and the runtime's (a send, a handler run, a claim batch's metrics)."""

    def operation(self, name: str, **attributes: Any) -> AbstractContextManager[None]: ...

    def settle_span(self, batch: Sequence[Completion]) -> AbstractContextManager[None]: ...

    def send_span(self, queue_name: str, count: int) -> AbstractContextManager[Any]: ...

    def process(self, delivery: Any, worker: str) -> Any: ...

    def batch(self) -> AbstractContextManager[None]: ...


class _NoSpan:
    """A send span that records nothing: headers pass through unchanged."""

    def headers(self, headers: Any) -> Any:
        return headers

    def stored(self, messages: Sequence[Any]) -> None:
        pass


class _NoProcess:
    """A handler run's span that records nothing."""

    def end(self, ok: bool, seconds: float, exc: BaseException | None = None) -> None:
        pass


NO_SPAN = _NoSpan()
NO_PROCESS = _NoProcess()


class _Untraced:
    """Until the app's ``ready()`` installs the telemetry's tracer: no span at all."""

    def operation(self, name: str, **attributes: Any) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def settle_span(self, batch: Sequence[Completion]) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def send_span(self, queue_name: str, count: int) -> AbstractContextManager[Any]:
        return contextlib.nullcontext(NO_SPAN)

    def process(self, delivery: Any, worker: str) -> Any:
        return NO_PROCESS

    def batch(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


_tracer: list[Tracer] = [_Untraced()]


def install_tracer(tracer: Tracer) -> None:
    """Install (or replace) the tracer; idempotent, called from ``ready()``."""
    _tracer[:] = [tracer]


def tracer() -> Tracer:
    """The installed tracer: the runtime's spans (``tracer().send_span(queue, n)``, ...)."""
    return _tracer[0]


def span(name: str, **attributes: Any) -> AbstractContextManager[None]:
    """Around a ledger-wide operation: ``sweep`` or an operator action (its reason)."""
    return _tracer[0].operation(name, **attributes)


def settle_span(batch: Sequence[Completion]) -> AbstractContextManager[None]:
    """Around recording a batch of outcomes (one transaction)."""
    return _tracer[0].settle_span(batch)
