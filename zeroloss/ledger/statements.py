"""Every SQL statement the ledger runs, by name: the catalogue.

Written whole in the ``.sql`` files of :data:`WHOLE` (:mod:`.catalogue`), read by each engine
(:mod:`.postgres`, :mod:`.sqlite`) as they are: named parameters, a dialect difference written
side by side (``-- name: ACK [postgresql]`` / ``[sqlite]``).

Statements that move a message declare the edges of the state machine they perform in the
``MOVES`` table of their module (:mod:`.statements_moves`); the engine writes their audit rows,
derived from those edges, in the same statement (PostgreSQL, ``PostgresEngine.audit_wrapper``)
or transaction (SQLite).
"""

from __future__ import annotations

from ..core.states import TRANSITIONS, Reason, Transition
from ..core.states import Status as S
from . import statements_cancel, statements_control, statements_leases, statements_workflows
from .catalogue import Catalogue
from .statements_leases import *  # noqa: F403  (named statements of the catalogue)
from .statements_leases import LEASE_COLUMNS, PLANNED_PER_CALL  # noqa: F401
from .statements_moves import Moving, edge

#: The parts of the catalogue written whole (``.sql`` files), read by each engine as they are.
WHOLE: tuple[Catalogue, ...] = (
    Catalogue("sql/operator.sql"),
    statements_cancel.CATALOGUE,
    statements_control.CATALOGUE,
    statements_leases.OUTCOMES,
    statements_leases.LEASES,
    statements_leases.CLAIMS,
    Catalogue("sql/persist.sql"),
    Catalogue("sql/inserts.sql"),
    Catalogue("sql/keys.sql"),
    Catalogue("sql/audit.sql"),
    statements_workflows.CATALOGUE,
)

# Persisting hands back each new row's ``available_at`` (and wakes idle workers, PostgreSQL).
_PERSISTED = (edge("", S.PENDING, Reason.PERSISTED),)
_STORED = Moving(
    "producer", _PERSISTED, returning=("available_at",), notifies=True, result=("id", "message_id")
)
# One message: its audit detail is no parameter (one less to send).
_STORED_ONE = Moving(
    "producer",
    _PERSISTED,
    detail="''",
    returning=("available_at",),
    notifies=True,
    result=("id", "updated_at", "available_at"),
)
_REQUEUED = Moving("operator", (edge(S.PROCESSING, S.PENDING, Reason.REQUEUED_BY_OPERATOR),), prepare=False)


def _dead_lettered(source: S) -> Moving:
    return Moving("operator", (edge(source, S.DEAD, Reason.DEAD_LETTERED_BY_OPERATOR),), prepare=False)


#: Every moving statement of the catalogue, by name, with the edges it performs.
MOVES: dict[str, Moving] = {
    "INSERT_ONE": _STORED_ONE,
    "INSERT_ONE_HEADERS": _STORED_ONE,
    "INSERT_MANY": _STORED,
    "INSERT_MANY_HEADERS": _STORED,
    # It names a table each batch creates again: never prepared.
    "INSERT_STAGED": Moving("producer", _PERSISTED, result=("id", "message_id"), prepare=False),
    "REQUEUE": _REQUEUED,
    "REQUEUE_STUCK": _REQUEUED,
    "REDRIVE": Moving("operator", (edge(S.DEAD, S.PENDING, Reason.REDRIVEN_BY_OPERATOR),), prepare=False),
    "DEAD_LETTER_PENDING": _dead_lettered(S.PENDING),
    "DEAD_LETTER_PROCESSING": _dead_lettered(S.PROCESSING),
    **statements_leases.LEASE_MOVES,
    **statements_cancel.MOVES,
    **statements_workflows.MOVES,
}


def statements_of(transition: Transition) -> list[str]:
    """The names of the moving statements that perform ``transition`` (run by its actor)."""
    edge = (transition.source, transition.target, transition.reason.value)
    return sorted(name for name, m in MOVES.items() if m.by == transition.actor and edge in m.edges)


def transition_table_markdown() -> str:
    """:data:`zeroloss.core.states.TRANSITIONS` with their statements, as Markdown (``docs/concepts.md``
    embeds it; a test keeps them equal)."""
    lines = ["| from | to | reason | by | statements |", "| --- | --- | --- | --- | --- |"]
    for t in TRANSITIONS:
        via = ", ".join(f"`{name}`" for name in statements_of(t))
        lines.append(f"| {t.source or '(new)'} | {t.target} | `{t.reason.value}` | {t.actor} | {via} |")
    return "\n".join(lines)
