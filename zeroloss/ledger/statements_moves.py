"""How a moving statement of the catalogue declares the edges of the state machine it performs.

Each statement that changes a message's status (or annotates it) has a :class:`Moving`
declaration beside its SQL, in the ``MOVES`` table of its catalogue module: who runs it and
its edges ``(from, to, reason)``, each one of :data:`zeroloss.core.states.TRANSITIONS` (or an
annotation). Everything its audit rows say is derived from that declaration: the source status,
the reason (one per target status), and so the columns the engines write the rows from
(:func:`audit_row`, :data:`MOVED`). A move is then called by the statement's name alone
(``LedgerContext.move``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..core.states import FINISHED_STATUSES, Status

#: The columns every moving statement returns, in this order (the audit row needs the first
#: eight and ``created_at``; callers read ``queue_name`` and ``ordering_key`` too).
MOVED = (
    "id, message_id, status, attempts, updated_at, {from_status} AS from_status, {reason} AS reason, "
    "{detail} AS detail, queue_name, ordering_key, created_at"
)
#: The names of the :data:`MOVED` columns, in order.
MOVED_NAMES = (
    "id",
    "message_id",
    "status",
    "attempts",
    "updated_at",
    "from_status",
    "reason",
    "detail",
    "queue_name",
    "ordering_key",
    "created_at",
)
#: The audit detail when it is a parameter of the move (its value passed by the caller).
DETAIL_NAMED = "CAST(%(detail)s AS TEXT)"
#: PostgreSQL: a RETURNING column that wakes idle workers, at commit, when a message became
#: claimable (collapsed per transaction and queue; they LISTEN on the channel).
NOTIFY = "pg_notify('zeroloss_wakeup', queue_name)"
#: Statuses a message finishes in: a move into one may release its ordering key's next message.
FINISHED = frozenset(s.value for s in FINISHED_STATUSES)


class Edge(NamedTuple):
    """One edge of the state machine; ``source`` is ``""`` for a message's first row."""

    source: str
    target: str
    reason: str


@dataclass(frozen=True)
class Moving:
    """The declaration of one moving statement (its SQL is the catalogue entry of that name)."""

    #: Who runs it: ``producer``, ``worker`` (the lease holder), ``sweep`` or ``operator``.
    by: str
    #: Every edge it may perform: one source status, and one edge per target status.
    edges: tuple[Edge, ...]
    #: The audit detail: a parameter (the caller's value), or an SQL expression of the row.
    detail: str = DETAIL_NAMED
    #: More RETURNING columns after :data:`MOVED`, by name.
    returning: tuple[str, ...] = ()
    #: Whether its RETURNING ends with PostgreSQL's wake-up of idle workers (:data:`NOTIFY`).
    notifies: bool = False
    #: The columns handed back, by name; ``None``: all.
    result: tuple[str, ...] | None = None
    #: A hot path: prepared once per connection (PostgreSQL).
    prepare: bool = True

    def __post_init__(self) -> None:
        sources = {e.source for e in self.edges}
        targets = [e.target for e in self.edges]
        if len(sources) != 1 or len(set(targets)) != len(targets):
            raise ValueError(f"a moving statement has one source and one edge per target: {self.edges}")

    @property
    def source(self) -> str:
        return self.edges[0].source

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.reason for e in self.edges))

    @property
    def finishes(self) -> bool:
        """Whether it can finish a message (and so leave its ordering key without a head)."""
        return any(e.target in FINISHED for e in self.edges)

    @property
    def wakes(self) -> bool:
        """Whether it can put a message back to pending, where idle workers must hear of it (a
        producer's insert sends its own wake-up)."""
        return self.by != "producer" and any(e.target == Status.PENDING.value for e in self.edges)

    @property
    def takes_detail(self) -> bool:
        return self.detail == DETAIL_NAMED

    def reason_sql(self) -> str:
        """The audit reason as SQL of the moved row's new ``status`` (a literal for one edge)."""
        *cases, last = self.edges
        if len(self.reasons) == 1:
            return f"'{last.reason}'"
        whens = " ".join(f"WHEN status = '{e.target}' THEN '{e.reason}'" for e in cases)
        return f"CASE {whens} ELSE '{last.reason}' END"

    def returning_sql(self, *, notify: bool = False) -> str:
        """The RETURNING columns its statement must spell, as its declaration derives them (a test
        keeps each written statement equal to this; nothing runs it). ``notify``: where the
        database wakes idle workers (PostgreSQL's :data:`NOTIFY`)."""
        detail = DETAIL_NAMED if self.takes_detail else self.detail
        moved = MOVED.format(
            from_status=f"CAST('{self.source}' AS TEXT)", reason=self.reason_sql(), detail=detail
        )
        return ", ".join([moved, *self.returning, *([NOTIFY] if notify and self.notifies else [])])


def audit_row(
    edge: Edge,
    message_pk: Any,
    attempt: int,
    at: dt.datetime | str,
    actor: str,
    detail: str,
    message_created_at: dt.datetime | str,
) -> tuple[Any, ...]:
    """The values of one audit row (``MessageEvent``'s columns in order) for a message moved along
    ``edge``: the one derivation the engines' client-side writers and the bulk COPY share."""
    return (message_pk, edge.source, edge.target, edge.reason, actor, attempt, detail, at, message_created_at)


#: ``MessageEvent``'s columns, in the order of :func:`audit_row`.
AUDIT_COLUMNS = (
    "message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at"
)


def edge(source: Any, target: Any, reason: Any) -> Edge:
    """An edge from statuses and a reason (enum members or their values)."""
    return Edge(*(str(getattr(v, "value", v)) for v in (source, target, reason)))
