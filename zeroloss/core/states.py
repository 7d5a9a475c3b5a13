"""The ledger's state machine, as data: statuses, reasons, and the one table of allowed transitions.

Each moving statement of the ledger's catalogue declares the edges it performs
(``zeroloss.ledger.statements.MOVES``); a test holds them equal to :data:`TRANSITIONS`, both
ways, and the docs' table (``docs/concepts.md``) is generated from both
(``zeroloss.ledger.statements.transition_table_markdown``). ``zeroloss_verify`` (which flags any audit row whose
edge is not in :data:`TRANSITIONS`) read this table; nothing else decides which moves exist.

::

                      +------------- released / lease_expired / failed (retry) -------+
                      v                                                                |
    (send) --persisted--> pending --claimed--> processing --acknowledged--> completed  |
                      ^     |                      |   +--------------------------------+
                      |     |                      +--dead_lettered (attempts spent)--> dead
                      |     +--dead_lettered_by_operator-------------------------------> dead
                      +--requeued_by_operator (stuck or revoked) <-- processing
                      +--redriven_by_operator <-- dead
    processing --snoozed (attempt not counted)--> pending
    processing --dead_lettered_by_handler (Fail, or an error not retried)--> dead
    pending --cancelled_by_operator--> cancelled
    processing --abort_requested (annotation)--> processing --aborted--> cancelled
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models
from django.utils.translation import gettext_lazy as _


class Status(models.TextChoices):
    PENDING = "pending", _("Pending")
    PROCESSING = "processing", _("Processing")
    COMPLETED = "completed", _("Completed")
    DEAD = "dead", _("Dead")
    #: Terminal: an operator cancelled it before it ran, or aborted it while it ran.
    CANCELLED = "cancelled", _("Cancelled")
    #: A workflow's step whose dependencies have not all completed: never claimed; released to
    #: pending in the transaction of its last dependency's outcome (docs/workflows.md).
    WAITING = "waiting", _("Waiting for its dependencies")


@dataclass(frozen=True)
class StatusTraits:
    """What the rest of the code asks of a status; every set of statuses below derives from these."""

    #: Terminal: nothing moves it on its own any more; retention purges it once past its age.
    finished: bool = False
    #: A worker may claim it (once it is available).
    claimable: bool = False
    #: A worker holds a lease on it: its lease token fences every write of the holder.
    leased: bool = False
    #: Its rows are many (every message ends so): counted by the planner's estimate where the
    #: database keeps one, never read row by row for a snapshot.
    estimated: bool = False
    #: The column that says when it finished, which retention ages it by ("": not finished).
    finished_at: str = ""


#: Each status's traits, in :class:`Status`'s order (the order of every column listing them).
TRAITS: dict[Status, StatusTraits] = {
    Status.PENDING: StatusTraits(claimable=True),
    Status.PROCESSING: StatusTraits(leased=True),
    Status.COMPLETED: StatusTraits(finished=True, estimated=True, finished_at="completed_at"),
    Status.DEAD: StatusTraits(finished=True, finished_at="dead_at"),
    Status.CANCELLED: StatusTraits(finished=True, finished_at="updated_at"),
    Status.WAITING: StatusTraits(),
}


def _having(trait: str, value: bool = True) -> tuple[Status, ...]:
    return tuple(s for s in Status if getattr(TRAITS[s], trait) is value)


#: Statuses a message can still leave on its own (it is not finished).
LIVE_STATUSES: tuple[Status, ...] = _having("finished", False)
#: Terminal statuses: what retention purges and what releases an ordering key's next message.
FINISHED_STATUSES: tuple[Status, ...] = _having("finished")
#: Statuses a worker may claim.
CLAIMABLE_STATUSES: tuple[Status, ...] = _having("claimable")
#: Statuses under a lease.
LEASED_STATUSES: tuple[Status, ...] = _having("leased")
#: Claimable or under a lease: what can be its ordering key's head (one at most per key).
ACTIVE_STATUSES: tuple[Status, ...] = tuple(
    s for s in Status if s in CLAIMABLE_STATUSES or s in LEASED_STATUSES
)
#: Statuses a snapshot counts row by row (the others by an estimate where there is one).
COUNTED_STATUSES: tuple[Status, ...] = _having("estimated", False)
#: Every declared set, by name: SQL that spells a set of statuses must spell one of these.
STATUS_SETS: dict[str, frozenset[str]] = {
    "LIVE_STATUSES": frozenset(LIVE_STATUSES),
    "FINISHED_STATUSES": frozenset(FINISHED_STATUSES),
    "CLAIMABLE_STATUSES": frozenset(CLAIMABLE_STATUSES),
    "LEASED_STATUSES": frozenset(LEASED_STATUSES),
    "ACTIVE_STATUSES": frozenset(ACTIVE_STATUSES),
    "COUNTED_STATUSES": frozenset(COUNTED_STATUSES),
}


class Reason(models.TextChoices):
    """Why an audit row was written. The values are stored; never rename one."""

    PERSISTED = "persisted", _("Persisted")
    CLAIMED = "claimed", _("Claimed")
    ACKNOWLEDGED = "acknowledged", _("Acknowledged")
    FAILED = "failed", _("Failed (will retry)")
    DEAD_LETTERED = "dead_lettered", _("Dead-lettered (attempts spent)")
    LEASE_EXPIRED = "lease_expired", _("Lease expired")
    RELEASED = "released", _("Released unstarted")
    REQUEUED_BY_OPERATOR = "requeued_by_operator", _("Requeued by an operator")
    REDRIVEN_BY_OPERATOR = "redriven_by_operator", _("Redriven by an operator")
    DEAD_LETTERED_BY_OPERATOR = "dead_lettered_by_operator", _("Dead-lettered by an operator")
    CANCELLED_BY_OPERATOR = "cancelled_by_operator", _("Cancelled by an operator")
    #: A processing message whose abort an operator requested ended: its handler returned or
    #: raised (the worker records it), or its worker died (the sweep records it).
    ABORTED = "aborted", _("Aborted")
    #: Not a transition: an operator asked a running message's handler to stop. Its row repeats
    #: the status (``processing``); the outcome (``aborted``) follows when the handler ends.
    ABORT_REQUESTED = "abort_requested", _("Abort requested")
    #: Not a transition: a send inside a deduplication window returned this message instead of
    #: creating one. Its row repeats the status the message had (``from_status == to_status``).
    DUPLICATE_ABSORBED = "duplicate_absorbed", _("Duplicate absorbed")
    #: Its handler raised ``zeroloss.Snooze``: back to pending after the delay, the attempt not
    #: counted (``MAX_SNOOZES`` bounds how often; past it a snooze is a failed attempt).
    SNOOZED = "snoozed", _("Snoozed by its handler")
    #: Its handler raised ``zeroloss.Fail``, or an exception its retry policy does not retry
    #: (``retry_on``, ``dont_retry_on``): dead at once, whatever attempts were left.
    DEAD_LETTERED_BY_HANDLER = "dead_lettered_by_handler", _("Dead-lettered by its handler (not retried)")
    #: A workflow's step: the last of its dependencies completed (or, under ``on_upstream_failure=
    #: "run"``, ended): pending, in the transaction of that outcome.
    DEPENDENCIES_COMPLETED = "dependencies_completed", _("Released: its dependencies completed")
    #: A workflow's step cancelled because a dependency ended dead or cancelled
    #: (``on_upstream_failure="cancel"``, or a cancelled dependency under ``"wait"``).
    UPSTREAM_FAILED = "upstream_failed", _("Cancelled: a dependency failed")


@dataclass(frozen=True)
class Transition:
    """One allowed move. ``source`` is ``""`` for the first row of a message (it did not exist)."""

    source: str
    target: str
    reason: Reason
    #: Who makes it: ``producer``, ``worker`` (the lease holder), ``sweep``, ``operator``, or
    #: ``dependency`` (a workflow's step, moved with the outcome of its dependency).
    actor: str


P, R, C, D, X = Status.PENDING, Status.PROCESSING, Status.COMPLETED, Status.DEAD, Status.CANCELLED
W = Status.WAITING

#: Every edge of the state machine. Nothing moves a message along an edge not listed here.
TRANSITIONS: tuple[Transition, ...] = (
    Transition("", P, Reason.PERSISTED, "producer"),
    Transition(P, R, Reason.CLAIMED, "worker"),
    Transition(R, C, Reason.ACKNOWLEDGED, "worker"),
    Transition(R, P, Reason.FAILED, "worker"),
    Transition(R, D, Reason.DEAD_LETTERED, "worker"),
    Transition(R, P, Reason.RELEASED, "worker"),
    Transition(R, P, Reason.SNOOZED, "worker"),
    Transition(R, D, Reason.DEAD_LETTERED_BY_HANDLER, "worker"),
    Transition(R, P, Reason.LEASE_EXPIRED, "sweep"),
    Transition(R, D, Reason.DEAD_LETTERED, "sweep"),
    Transition(R, P, Reason.REQUEUED_BY_OPERATOR, "operator"),
    Transition(D, P, Reason.REDRIVEN_BY_OPERATOR, "operator"),
    Transition(P, D, Reason.DEAD_LETTERED_BY_OPERATOR, "operator"),
    Transition(R, D, Reason.DEAD_LETTERED_BY_OPERATOR, "operator"),
    Transition(P, X, Reason.CANCELLED_BY_OPERATOR, "operator"),
    Transition(R, X, Reason.ABORTED, "worker"),
    Transition(R, X, Reason.ABORTED, "sweep"),
    # Workflows (docs/workflows.md). ``dependency``: in the transaction of the outcome that
    # settled the step's last dependency, by whoever recorded it (its worker, the sweep, an
    # operator), or by the sweep's safety net.
    Transition("", W, Reason.PERSISTED, "producer"),
    Transition(W, P, Reason.DEPENDENCIES_COMPLETED, "dependency"),
    Transition(W, X, Reason.UPSTREAM_FAILED, "dependency"),
    Transition(W, X, Reason.CANCELLED_BY_OPERATOR, "operator"),
)


def sources_of(reason: Reason) -> frozenset[str]:
    """The statuses a message can leave for ``reason`` (an operator's action applies to these)."""
    return frozenset(t.source for t in TRANSITIONS if t.reason == reason)


#: Audit rows that record an event but move nothing (``from_status == to_status``).
ANNOTATIONS: frozenset[Reason] = frozenset({Reason.DUPLICATE_ABSORBED, Reason.ABORT_REQUESTED})

#: ``(from_status, to_status, reason)`` of every allowed audit row.
ALLOWED_EDGES: frozenset[tuple[str, str, str]] = frozenset(
    (t.source, t.target, t.reason.value) for t in TRANSITIONS
) | frozenset((s.value, s.value, r.value) for r in ANNOTATIONS for s in Status)


def is_allowed(source: str, target: str, reason: str) -> bool:
    return (source, target, reason) in ALLOWED_EDGES
