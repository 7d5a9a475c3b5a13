"""Every SQL statement the ledger runs, by name.

Each is a template; an engine (:mod:`.postgres`, :mod:`.sqlite`) renders it once with its own
spelling of the few things the two databases say differently: the database clock
(``{now}``, fixed for a statement, so an index can search by it; ``{clock}``, read when a row
is written), "now plus %s seconds" (``{after}``, ``{clock_after}``), a new lease token, a JSON
cast, how a batch of rows is passed (``{rows}``: ``unnest`` of arrays, or ``json_each`` of one
JSON array), and row locking. Lease times always come from the database's clock: a lease is
set and checked with ``{clock}``, so a statement that waited for a lock neither hands out a
lease that has already run out nor accepts one that ran out while it waited.

Statements that move a message declare the edges of the state machine they perform in the
``MOVES`` table of their module (:mod:`.statements_moves`); the engine's ``transition()`` adds
their RETURNING columns and writes their audit rows, derived from those edges, in the same
statement (PostgreSQL) or transaction (SQLite).
"""

from __future__ import annotations

from ..core.states import TRANSITIONS, Reason, Transition
from ..core.states import Status as S
from . import statements_cancel, statements_control, statements_leases
from .catalogue import Catalogue
from .statements_leases import *  # noqa: F403  (named statements of the catalogue)
from .statements_leases import LEASE_COLUMNS, PLANNED_PER_CALL  # noqa: F401
from .statements_moves import AUDIT_COLUMNS as _AUDIT_COLUMNS
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
    Catalogue("sql/keys.sql"),
)

INSERT_COLUMNS = (
    "message_id, queue_name, payload, checksum, status, attempts, max_attempts, priority, ordering_key, "
    "available_at, claimed_by, last_error, replication_targets, created_at, updated_at, dispatched_at"
)

# -- persisting (pending, or waiting for an ordering key's head) ----------------------------

INSERT_ONE = (
    "INSERT INTO {msg} (" + INSERT_COLUMNS + ") VALUES (%s, %s, %s{jsonb}, %s, 'pending', 0, %s, %s, %s, "
    "CASE WHEN %s <> '' THEN NULL ELSE {after} END, '', '', '[]'{jsonb}, {now}, {now}, "
    "CASE WHEN %s THEN {now} END) ON CONFLICT (message_id) DO NOTHING"
)
_INSERT_SELECT = (
    "INSERT INTO {msg} (" + INSERT_COLUMNS + ") SELECT b.mid, b.q, b.payload{jsonb}, "
    "b.checksum, 'pending', 0, b.max_attempts, b.priority, b.k, "
    "CASE WHEN b.k <> '' THEN NULL ELSE {after} END, '', '', '[]'{jsonb}, {now}, {now}, "
    "CASE WHEN %s THEN {now} END FROM "
)
INSERT_MANY = _INSERT_SELECT + "{rows} WHERE true ON CONFLICT (message_id) DO NOTHING"
# The same, for messages sent with headers (a column of their own: the statements of messages
# without any stay as they were, and cost what they did).
INSERT_ONE_HEADERS = INSERT_ONE.replace(INSERT_COLUMNS, INSERT_COLUMNS + ", headers", 1).replace(
    "CASE WHEN %s THEN {now} END)", "CASE WHEN %s THEN {now} END, %s{jsonb})", 1
)
_INSERT_SELECT_HEADERS = _INSERT_SELECT.replace(INSERT_COLUMNS, INSERT_COLUMNS + ", headers", 1).replace(
    "CASE WHEN %s THEN {now} END FROM ", "CASE WHEN %s THEN {now} END, b.headers{jsonb} FROM ", 1
)
INSERT_MANY_HEADERS = _INSERT_SELECT_HEADERS + "{rows} WHERE true ON CONFLICT (message_id) DO NOTHING"
# A large batch (PostgreSQL, ``Engine.stage_from``) of new messages: ids drawn in the batch's
# order and one clock reading, then the message rows and their audit rows COPY'd.
# (as one text: 100,000 ids load in a few ms, where 100,000 rows took a tenth of the batch; the
# sequence looked up once, not once a row: 4x faster)
RESERVE_IDS = (
    "SELECT {now}, string_agg(nextval((SELECT pg_get_serial_sequence('{msg}', 'id')::regclass))::text, ',') "
    "FROM generate_series(1, %s)"
)
COPY_MESSAGES = (
    "COPY {msg} (id, message_id, queue_name, payload, checksum, status, attempts, max_attempts, priority, "
    "ordering_key, available_at, claimed_by, last_error, replication_targets, created_at, updated_at, "
    "dispatched_at, headers) FROM STDIN"
)
COPY_EVENTS = "COPY {evt} (" + _AUDIT_COLUMNS + ") FROM STDIN"
# When an id of the batch is stored already (the COPY fails on it): COPY'd into a temporary
# table, then stored by one statement like INSERT_MANY. Dropped at once (a second batch of the same transaction creates it again),
# and at commit whatever happens. ``n`` keeps the batch's order in the ids.
STAGE_CREATE = (
    "CREATE TEMPORARY TABLE zeroloss_staged (n int, mid text, q text, payload text, checksum text, "
    "max_attempts int, priority int, k text, headers text) ON COMMIT DROP"
)
STAGE_COPY = "COPY zeroloss_staged FROM STDIN"
INSERT_STAGED = _INSERT_SELECT_HEADERS + "zeroloss_staged b ORDER BY b.n ON CONFLICT (message_id) DO NOTHING"
STAGE_DROP = "DROP TABLE zeroloss_staged"
# -- PostgreSQL: each id claimed in the key table first ---------------------------------------
# A partitioned message table can have no unique index on message_id alone (docs/scaling.md),
# so on PostgreSQL each persisting statement above inserts its ids into the unpartitioned
# zeroloss_message_key first, in a CTE of the same statement, and stores only the messages
# whose key it inserted: the key's primary key serialises concurrent sends of one id, as the
# message table's unique index did. The message insert keeps ``ON CONFLICT DO NOTHING``: on an
# unpartitioned ledger the message table's unique index still refuses an id stored without a
# key row (by a 0.2 process during a rolling upgrade).
_KEY_OF_ONE = (
    "k AS (INSERT INTO {key} (message_id, created_at) VALUES (%s, {now}) ON CONFLICT DO NOTHING "
    "RETURNING message_id)"
)
# The batch's two scalars first, so that the parameters stay in the order of the statement above.
_BATCH_SCALARS = "p AS (SELECT CAST(%s AS double precision) AS delay, CAST(%s AS boolean) AS dispatched)"
_KEYS_OF = (
    "k AS (INSERT INTO {key} (message_id, created_at) SELECT mid, {now} FROM {source} ON CONFLICT DO NOTHING "
    "RETURNING message_id)"
)
# ``n``: the batch's order, which the ids keep (an ordering key's messages are claimed by id).
_BATCH = "b AS MATERIALIZED (SELECT row_number() OVER () AS n, * FROM {rows})"
_STORED_TAIL = " ON CONFLICT (message_id) DO NOTHING"


def _key_first_one(statement: str) -> str:
    body = statement.replace(") VALUES (%s, ", ") SELECT k.message_id, ", 1)
    if not body.endswith(")" + _STORED_TAIL):
        raise ValueError(f"not a one-row persisting statement: {statement}")
    return body[: -len(")" + _STORED_TAIL)] + " FROM k ON CONFLICT DO NOTHING"


def _key_first_select(select: str, source: str) -> str:
    body = select.replace("{after}", "({now} + p.delay * interval '1 second')", 1)
    body = body.replace("CASE WHEN %s THEN {now} END", "CASE WHEN p.dispatched THEN {now} END", 1)
    return body + f"p, {source} JOIN k ON k.message_id = b.mid ORDER BY b.n ON CONFLICT DO NOTHING"


#: PostgreSQL's persisting statements: ``name: (CTEs, the message insert)``; the engine puts the
#: CTEs before its own (the moved rows ``t`` and their audit rows).
KEY_FIRST: dict[str, tuple[str, str]] = {
    "INSERT_ONE": (_KEY_OF_ONE, _key_first_one(INSERT_ONE)),
    "INSERT_ONE_HEADERS": (_KEY_OF_ONE, _key_first_one(INSERT_ONE_HEADERS)),
    "INSERT_MANY": (
        f"{_BATCH_SCALARS}, {_BATCH}, " + _KEYS_OF.replace("{source}", "b"),
        _key_first_select(_INSERT_SELECT, "b"),
    ),
    "INSERT_MANY_HEADERS": (
        f"{_BATCH_SCALARS}, {_BATCH}, " + _KEYS_OF.replace("{source}", "b"),
        _key_first_select(_INSERT_SELECT_HEADERS, "b"),
    ),
    "INSERT_STAGED": (
        f"{_BATCH_SCALARS}, " + _KEYS_OF.replace("{source}", "zeroloss_staged"),
        _key_first_select(_INSERT_SELECT_HEADERS, "zeroloss_staged b"),
    ),
}
COPY_KEYS = "COPY {key} (message_id, created_at) FROM STDIN"


# -- ordering keys ----------------------------------------------------------------------


def head_of_key(alias: str = "") -> str:
    """The predicate of a key's head (its one claimable or processing message), of ``alias``."""
    return (
        f"{alias}ordering_key <> '' AND {alias}status IN ('pending', 'processing') "
        f"AND {alias}available_at IS NOT NULL"
    )


# Release the next message of each listed key that has no head (nothing claimable or
# processing). Run after every commit that may have left a key without one (SQLite; PostgreSQL
# runs PROMOTE_CLAIMING_HEAD in its place).
PROMOTE = (
    "UPDATE {msg} SET available_at = {now}, updated_at = {now} WHERE id IN (SELECT (SELECT min(w.id) "
    "FROM {msg} w WHERE w.queue_name = b.q AND w.ordering_key = b.k AND w.status = 'pending' "
    "AND w.available_at IS NULL) FROM {rows} WHERE NOT EXISTS (SELECT 1 FROM {msg} h WHERE h.queue_name = b.q "
    "AND h.ordering_key = b.k AND " + head_of_key("h.") + ")) RETURNING message_id, queue_name{notify}"
)


# -- PostgreSQL: a key's head held in zeroloss_ordering_head ---------------------------------
# (models.OrderingHead): a partitioned message table cannot have the one-head-per-key unique
# index, so a promotion claims the key's row there first, in the same statement, and releases
# only the message whose row it inserted; the statement finishing a head hands the row to the
# next message, or deletes it when none waits. A second head of a key is then refused by that
# table's unique index, whatever the layout.


def _next_waiting(queue: str, key: str, excluded: str = "") -> str:
    """The id of the key's first waiting message."""
    return (
        f"(SELECT min(w.id) FROM {{msg}} w WHERE w.queue_name = {queue} AND w.ordering_key = {key} "
        f"AND w.status = 'pending' AND w.available_at IS NULL{excluded})"
    )


#: PostgreSQL's PROMOTE: the head row of each key first (a conflict: the key has its head).
PROMOTE_CLAIMING_HEAD = (
    "WITH c AS (SELECT b.q, b.k, "
    + _next_waiting("b.q", "b.k")
    + " AS next FROM {rows} WHERE NOT EXISTS (SELECT 1 FROM {msg} h WHERE h.queue_name = b.q "
    "AND h.ordering_key = b.k AND "
    + head_of_key("h.")
    + ")), hn AS (INSERT INTO {head} (queue_name, ordering_key, message_pk, since) SELECT q, k, next, {now} "
    "FROM c WHERE next IS NOT NULL ON CONFLICT (queue_name, ordering_key) DO NOTHING RETURNING message_pk) "
    "UPDATE {msg} SET available_at = {now}, updated_at = {now} WHERE id IN (SELECT message_pk FROM hn) "
    "RETURNING message_id, queue_name{notify}"
)
# Inside a move (PostgreSQL's CTEs after its ``t``), for the keys of the messages it finished:
# ``nx`` the next message of each (none while another head is live), ``hn`` the head row handed
# to it (or inserted where the key had none), ``hd`` the row of a finished head deleted where no
# message waits, ``pr`` the next messages released. The rows of ``t`` are seen as they were.
PROMOTE_FINISHED = (
    "nx AS (SELECT t.queue_name AS q, t.ordering_key AS k, t.id AS old, CASE WHEN NOT EXISTS (SELECT 1 "
    "FROM {msg} h WHERE h.queue_name = t.queue_name AND h.ordering_key = t.ordering_key AND "
    + head_of_key("h.")
    + " AND h.id NOT IN (SELECT id FROM t)) THEN "
    + _next_waiting("t.queue_name", "t.ordering_key", " AND w.id NOT IN (SELECT id FROM t)")
    + " END AS next FROM t WHERE t.ordering_key <> '' AND t.status IN ('completed', 'dead', 'cancelled')), "
    "hn AS (INSERT INTO {head} (queue_name, ordering_key, message_pk, since) SELECT DISTINCT ON (q, k) "
    "q, k, next, {now} FROM nx WHERE next IS NOT NULL ON CONFLICT (queue_name, ordering_key) DO UPDATE SET "
    "message_pk = excluded.message_pk, since = excluded.since WHERE {head}.message_pk IN (SELECT old FROM nx) "
    "RETURNING message_pk), "
    "hd AS (DELETE FROM {head} h USING nx WHERE nx.next IS NULL AND h.queue_name = nx.q "
    "AND h.ordering_key = nx.k AND h.message_pk = nx.old), "
    "pr AS (UPDATE {msg} SET available_at = {now}, updated_at = {now} WHERE id IN (SELECT message_pk FROM hn) "
    "RETURNING message_id{notify})"
)


# -- written whole (WHOLE): the operator's moves (sql/operator.sql); the clock, deduplication
# windows, dispatch bookkeeping (sql/persist.sql); what blocks a key and the sweep's key repairs
# (sql/keys.sql).

#: The batch each statement's ``{rows}`` carries, as ``b(column, ...)`` with PostgreSQL types.
#: PostgreSQL passes one array per column (``unnest``); SQLite one JSON array of rows.
ROWS: dict[str, tuple[tuple[str, str], ...]] = {
    "INSERT_MANY": (
        ("mid", "text"),
        ("q", "text"),
        ("payload", "text"),
        ("checksum", "text"),
        ("max_attempts", "int"),
        ("priority", "int"),
        ("k", "text"),
    ),
    "INSERT_MANY_HEADERS": (
        ("mid", "text"),
        ("q", "text"),
        ("payload", "text"),
        ("checksum", "text"),
        ("max_attempts", "int"),
        ("priority", "int"),
        ("k", "text"),
        ("headers", "text"),
    ),
    "PROMOTE": (("q", "text"), ("k", "text")),
    "PROMOTE_CLAIMING_HEAD": (("q", "text"), ("k", "text")),
    **statements_leases.LEASE_ROWS,
}

# Persisting hands back each new row's ``available_at`` (and wakes idle workers, PostgreSQL).
_PERSISTED = (edge("", S.PENDING, Reason.PERSISTED),)
_STORED = Moving("producer", _PERSISTED, returning=", available_at{notify}", result=("id", "message_id"))
# One message: its audit detail is no parameter (one less to send).
_STORED_ONE = Moving(
    "producer",
    _PERSISTED,
    detail="''",
    returning=", available_at{notify}",
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
