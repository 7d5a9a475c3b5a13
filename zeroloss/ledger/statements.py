"""Every SQL statement the ledger runs, by name.

Each is a template; an engine (:mod:`.postgres`, :mod:`.sqlite`) renders it once with its own
spelling of the few things the two databases say differently: the database clock
(``{now}``, fixed for a statement, so an index can search by it; ``{clock}``, read when a row
is written), "now plus %s seconds" (``{after}``, ``{clock_after}``), a new lease token, a JSON
cast, how a batch of rows is passed (``{rows}``: ``unnest`` of arrays, or ``json_each`` of one
JSON array), and row locking. Lease times always come from the database's clock: a lease is
set and checked with ``{clock}``, so a statement that waited for a lock neither hands out a
lease that has already run out nor accepts one that ran out while it waited.

Statements that move a message end in ``RETURNING {moved}``: the columns its audit row is
built from. The engine's ``transition()`` writes that row in the same statement
(PostgreSQL) or transaction (SQLite). Which edge of the state machine each one performs is
listed in :data:`zeroloss.states.TRANSITIONS`.
"""

from __future__ import annotations

from . import statements_cancel
from .statements_cancel import (  # noqa: F401  (named statements of the catalogue)
    ABORT_REQUEST,
    ABORTS_REQUESTED,
    CANCEL,
    CANCEL_ABORTED,
    CANCEL_ABORTED_LOCKED,
    STATUS_OF,
)
from .statements_cancel import NOT_ABORTED as _NOT_ABORTED

# The columns every moving statement returns (the audit row needs the first eight).
MOVED = (
    "id, message_id, status, attempts, updated_at, {from_status} AS from_status, {reason} AS reason, "
    "{detail} AS detail, queue_name, ordering_key"
)
MOVED_COUNT = 10

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
COPY_EVENTS = (
    "COPY {evt} (message_id, from_status, to_status, reason, actor, attempt, detail, created_at) FROM STDIN"
)
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
# A deduplication window: claimed when new or expired; otherwise it names the first message.
DEDUP_CLAIM = (
    "INSERT INTO {dedup} (queue_name, dedup_key, message_id, expires_at, created_at) "
    "VALUES (%s, %s, %s, {after}, {now}) ON CONFLICT (queue_name, dedup_key) DO UPDATE SET "
    "message_id = excluded.message_id, expires_at = excluded.expires_at, created_at = excluded.created_at "
    "WHERE {dedup}.expires_at <= {now} RETURNING message_id"
)
DEDUP_HOLDER = "SELECT message_id FROM {dedup} WHERE queue_name = %s AND dedup_key = %s"
DEDUP_TAKE_OVER = (
    "UPDATE {dedup} SET message_id = %s, expires_at = {after}, created_at = {now} "
    "WHERE queue_name = %s AND dedup_key = %s"
)
DEDUP_PURGE = "DELETE FROM {dedup} WHERE expires_at < {now}"
# An annotation, not a transition: the status is repeated (see states.ANNOTATIONS).
ABSORBED = (
    "INSERT INTO {evt} (message_id, from_status, to_status, reason, actor, attempt, detail, created_at) "
    "SELECT id, status, status, 'duplicate_absorbed', %s, attempts, %s, {now} FROM {msg} WHERE message_id = %s"
)

# -- ordering keys ----------------------------------------------------------------------

# Release the next message of each listed key that has no head (nothing claimable or
# processing). Run after every commit that may have left a key without one.
PROMOTE = (
    "UPDATE {msg} SET available_at = {now}, updated_at = {now} WHERE id IN (SELECT (SELECT min(w.id) "
    "FROM {msg} w WHERE w.queue_name = b.q AND w.ordering_key = b.k "
    "AND w.status = 'pending' AND w.available_at IS NULL) FROM {rows} WHERE NOT EXISTS (SELECT 1 FROM {msg} h "
    "WHERE h.queue_name = b.q AND h.ordering_key = b.k "
    "AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL)) "
    "RETURNING message_id, queue_name{notify}"
)
# The sweep's safety net: keys whose head finished while no promotion could see their next
# message (a process died between commit and promotion). Waiting rows younger than %s
# seconds are left to their own sender's promotion.
REPAIR_KEYS = (
    "SELECT DISTINCT w.queue_name, w.ordering_key FROM {msg} w WHERE w.status = 'pending' "
    "AND w.available_at IS NULL AND w.updated_at < {after} AND NOT EXISTS (SELECT 1 FROM {msg} h "
    "WHERE h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key "
    "AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL) LIMIT %s"
)

# What blocks a key: for each (queue, key) with messages waiting behind a head, that head (if it
# has one) and the database clock. Read from the waiting index, then one probe of the one-head
# index per key. Blocked: the head is processing, backing off before a retry, or missing.
_KEY_COLUMNS = (
    "SELECT w.queue_name, w.ordering_key, w.waiting, w.waiting_since, h.message_id, h.status, h.attempts, "
    "h.max_attempts, h.claimed_by, h.started_at, h.updated_at, h.available_at, h.lease_expires_at, "
    "h.last_error, {now} FROM "
)
_KEY_HEAD_JOIN = (
    " LEFT JOIN {msg} h ON h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key "
    "AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL"
)
_WAITING_KEYS = (
    "(SELECT queue_name, ordering_key, count(*) AS waiting, min(updated_at) AS waiting_since FROM {msg} "
    "WHERE status = 'pending' AND available_at IS NULL"
)
_BLOCKED = (
    " WHERE h.id IS NULL OR h.status = 'processing' OR h.available_at > {now} "
    "ORDER BY COALESCE(CASE WHEN h.status = 'processing' THEN h.started_at ELSE h.updated_at END, "
    "w.waiting_since), w.queue_name, w.ordering_key LIMIT %s"
)
BLOCKED_KEYS = (
    _KEY_COLUMNS + _WAITING_KEYS + " GROUP BY queue_name, ordering_key) w" + _KEY_HEAD_JOIN + _BLOCKED
)
BLOCKED_KEYS_OF_QUEUE = (
    _KEY_COLUMNS
    + _WAITING_KEYS
    + " AND queue_name = %s GROUP BY queue_name, ordering_key) w"
    + _KEY_HEAD_JOIN
    + _BLOCKED
)
# One key, blocked or not (one row even when the key has no message at all).
KEY_HEAD = (
    _KEY_COLUMNS
    + "(SELECT CAST(%s AS TEXT) AS queue_name, CAST(%s AS TEXT) AS ordering_key, count(*) AS waiting, "
    "min(updated_at) AS waiting_since FROM {msg} WHERE status = 'pending' AND available_at IS NULL "
    "AND queue_name = %s AND ordering_key = %s) w" + _KEY_HEAD_JOIN
)
# The head of one key, locked until the operator's move on it commits (PostgreSQL).
KEY_HEAD_LOCK = (
    "SELECT message_id, status FROM {msg} WHERE queue_name = %s AND ordering_key = %s AND ordering_key <> '' "
    "AND status IN ('pending', 'processing') AND available_at IS NOT NULL{for_update}"
)

# -- leases ---------------------------------------------------------------------------

_CLAIM_SET = (
    "UPDATE {msg} SET status = 'processing', attempts = attempts + 1, lease_token = {new_token}, "
    "lease_expires_at = {clock_after}, claimed_by = %s, started_at = {clock}, updated_at = {clock} WHERE "
)
CLAIM_RETURNING = ", lease_token, lease_expires_at, payload, max_attempts, priority, headers, available_at"
# The claim index holds every version a claim moved out of it (one per message): while anything
# holds the xmin horizon back (an idle transaction, a long report), none is removed, and a claim
# that starts at the head of the queue visits them all, oldest first: at 800 msg/s, 48,000 a
# minute, each a heap visit (measured: 51 ms a claim after 90 s). So a claimer starts where its
# previous claim ended: three ranges of the claim index, read in its order, each only as far as
# the claim's LIMIT needs: higher priorities than the remembered one from their head (exact
# priority order), the remembered priority from its remembered ``available_at`` (rewound a little,
# for messages whose sending transaction committed after a later one was claimed), then lower
# priorities from their head. A priority below -100 (none is) makes the first range the whole
# queue: the claim from the head, which every claimer also makes every few seconds for what
# committed further behind (leases.CLAIM_FROM_HEAD_EVERY).
_CLAIMABLE = "SELECT id FROM {msg} WHERE status = 'pending' AND queue_name = %s AND available_at <= {now}"
_CLAIM_ORDER = " ORDER BY priority DESC, available_at, id LIMIT %s{skip_locked}"
_HIGHER = "(" + _CLAIMABLE + " AND priority > %s" + _CLAIM_ORDER + ") a"
_AFTER = "(" + _CLAIMABLE + " AND priority = %s AND available_at >= %s" + _CLAIM_ORDER + ") r"
_LOWER = "(" + _CLAIMABLE + " AND priority < %s" + _CLAIM_ORDER + ") z"
CLAIM = (
    _CLAIM_SET
    + "{in_open}SELECT id FROM (SELECT id FROM "
    + _HIGHER
    + " UNION ALL SELECT id FROM "
    + _AFTER
    + " UNION ALL SELECT id FROM "
    + _LOWER
    + ") c LIMIT %s{in_close} AND status = 'pending'"
)
# A claim of a queue under a concurrency limit, inside the transaction that locked the queue's
# control row (control.py): CLAIM, claiming at most the limit less what is processing, counted
# in this statement (it starts after the lock was granted, so it sees every earlier claim).
CLAIM_LIMITED = CLAIM.replace(
    ") c LIMIT %s{in_close}",
    ") c LIMIT (SELECT CASE WHEN r < 0 THEN 0 WHEN r > %s THEN %s ELSE r END FROM (SELECT %s - count(*) "
    "AS r FROM {msg} WHERE queue_name = %s AND status = 'processing') room){in_close}",
)
CLAIM_BY_ID = (
    _CLAIM_SET + "{in_open}SELECT id FROM {msg} WHERE message_id = %s AND status = 'pending' "
    "AND available_at <= {now}{skip_locked}{in_close} AND status = 'pending'"
)
# The attempt a lease holder is on (its failure's backoff depends on it).
LEASED_ATTEMPT = (
    "SELECT attempts FROM {msg} WHERE message_id = %s AND lease_token = %s AND status = 'processing'"
)
# Every lease-holder statement is fenced: the current token, still processing, lease unexpired.
# (An aborted message's outcome is recorded by CANCEL_ABORTED only: NOT_ABORTED.)
_FENCE = (
    "FROM {rows} WHERE {msg}.message_id = b.mid AND {msg}.lease_token = b.tok AND {msg}.status = 'processing'"
    + _NOT_ABORTED
)
_UNEXPIRED = " AND {msg}.lease_expires_at > {clock}"
_FENCED_LEASE = (
    "{msg}.message_id = b.mid AND {msg}.lease_token = b.tok AND {msg}.status = 'processing'" + _UNEXPIRED
)
# The keeper's renewal never waits for a row lock: a row locked elsewhere (a transactional
# batch recording its outcome, an operator's move) is skipped, and RENEW_BUSY tells it apart
# from a lease that is lost.
RENEW = (
    "UPDATE {msg} SET lease_expires_at = {clock_after}, updated_at = {clock} WHERE {in_open}SELECT {msg}.id "
    "FROM {msg}, {rows} WHERE " + _FENCED_LEASE + "{skip_locked_of}{in_close} AND status = 'processing' "
    "AND lease_expires_at > {clock} RETURNING message_id"
)
RENEW_BUSY = "SELECT {msg}.message_id FROM {msg}, {rows} WHERE " + _FENCED_LEASE
# The acknowledged state; ``{{result}}`` is the stored result (a batch column or a parameter).
_ACK_SET = (
    "UPDATE {{msg}} SET status = 'completed', completed_at = {{now}}, last_error = '', result = {result}{{jsonb}}, "
    "lease_token = NULL, lease_expires_at = NULL, updated_at = {{now}} "
)
_ACK = _ACK_SET.format(result="b.res") + _FENCE
ACK = _ACK + _UNEXPIRED
# One acknowledgement (acknowledge_message): scalar parameters, no batch to unpack.
ACK_ONE = (
    _ACK_SET.format(result="%s")
    + "WHERE message_id = %s AND lease_token = %s AND status = 'processing'"
    + _NOT_ABORTED
    + _UNEXPIRED
)
# Inside a transactional batch whose rows this transaction locked after a fenced check
# (LOCK_HELD): nobody else can have moved them since, whatever the clock says now.
ACK_LOCKED = _ACK
_SPENT = "{msg}.attempts >= {msg}.max_attempts"
_FAIL = (
    "UPDATE {msg} SET status = CASE WHEN " + _SPENT + " THEN 'dead' ELSE 'pending' END, "
    "dead_at = CASE WHEN " + _SPENT + " THEN {now} END, "
    "available_at = CASE WHEN " + _SPENT + " THEN {msg}.available_at ELSE {after_delay} END, "
    "last_error = b.err, lease_token = NULL, lease_expires_at = NULL, updated_at = {now} " + _FENCE
)
FAIL = _FAIL + _UNEXPIRED
FAIL_LOCKED = _FAIL
RELEASE = (
    "UPDATE {msg} SET status = 'pending', attempts = {msg}.attempts - 1, available_at = {now}, "
    "lease_token = NULL, lease_expires_at = NULL, started_at = NULL, updated_at = {now} "
    + _FENCE
    + _UNEXPIRED
)
# A transactional batch locks its rows, fenced, before running any handler.
LOCK_HELD = (
    "SELECT {msg}.message_id FROM {msg}, {rows} WHERE {msg}.message_id = b.mid "
    "AND {msg}.lease_token = b.tok AND {msg}.status = 'processing' AND {msg}.lease_expires_at > {clock} "
    "ORDER BY {msg}.id{for_update}"
)
# A transactional batch's transaction: opened with a guard row that only zeroloss's own commit
# may commit (a handler's raw COMMIT fails on it), and with the server-side bounds derived from
# HANDLER_TIMEOUT (``%s`` milliseconds, 0: none); closed by BATCH_CLOSE, which authorises the
# commit and says whether the transaction is still the one BATCH_OPEN began (a handler's raw
# ROLLBACK or COMMIT ended it otherwise). PostgreSQL only; SQLite tells from its client.
BATCH_OPEN = (
    "INSERT INTO zeroloss_batch_guard (txid) VALUES (txid_current()) RETURNING txid, pg_backend_pid(), "
    "CASE WHEN %s > 0 THEN set_config('idle_in_transaction_session_timeout', %s, true) END, "
    "CASE WHEN %s > 0 THEN set_config('statement_timeout', %s, true) END"
)
# Bounds an idle gap of one of zeroloss's own multi-statement transactions (milliseconds).
BOUND_TRANSACTION = "SELECT set_config('idle_in_transaction_session_timeout', %s, true)"
BATCH_CLOSE = (
    "WITH d AS (DELETE FROM zeroloss_batch_guard WHERE txid = txid_current() RETURNING txid) "
    "SELECT (SELECT txid FROM d), set_config('zeroloss.batch_commit', txid_current()::text, true)"
)
# A claim whose commit outcome was lost with its connection: give back whatever this claimer
# holds that it does not know about (the attempt is not counted).
RELEASE_UNKNOWN = (
    "UPDATE {msg} SET status = 'pending', attempts = attempts - 1, available_at = {now}, lease_token = NULL, "
    "lease_expires_at = NULL, started_at = NULL, updated_at = {now} WHERE status = 'processing' "
    "AND claimed_by = %s AND lease_expires_at > {now} AND NOT EXISTS (SELECT 1 FROM {rows} "
    "WHERE b.tok = lease_token)"
)
# A session of ours that may still be running a statement whose outcome we lost (a network
# cut: the server has not noticed). End it, and wait until it is gone, before acting on what
# it may have committed.
END_SESSION = "SELECT pg_terminate_backend(%s)"
SESSION_ALIVE = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
# Did this actor's transition land? (asked after a commit whose outcome was lost)
OWN_EVENTS = (
    "SELECT m.message_id, e.reason FROM {evt} e JOIN {msg} m ON m.id = e.message_id JOIN {rows} "
    "ON m.message_id = b.mid AND e.attempt = b.att WHERE e.actor = %s "
    "AND e.reason IN ('acknowledged', 'failed', 'dead_lettered', 'released', 'aborted')"
)

# -- the recovery sweep ---------------------------------------------------------------

_SWEEP_SPENT = "attempts >= max_attempts"
# The lease index keeps the processing version of every message acknowledged since the xmin
# horizon was last free (at 800 msg/s, 48,000 a minute): a probe from the head of expired leases
# visits them all. So a sweep examines the leases that expired since a little before its
# previous complete sweep (``lease_expires_at >= %s``), and every sweep.SWEEP_FROM_HEAD_EVERY
# seconds all of them (the bound: the start of time). The bound is repeated outside: PostgreSQL
# may find the chosen ids through the lease index too (a bitmap of every expired entry).
# An aborted message whose worker died is cancelled, not run again (statements_cancel).
SWEEP = (
    "UPDATE {msg} SET status = CASE WHEN abort_requested_at IS NOT NULL THEN 'cancelled' WHEN "
    + _SWEEP_SPENT
    + " THEN 'dead' ELSE 'pending' END, "
    "dead_at = CASE WHEN abort_requested_at IS NULL AND "
    + _SWEEP_SPENT
    + " THEN {now} END, available_at = {now}, "
    "last_error = 'Lease expired: ' || claimed_by || ' neither acknowledged nor renewed it', "
    "lease_token = NULL, lease_expires_at = NULL, updated_at = {now} "
    "WHERE {in_open}SELECT id FROM {msg} WHERE status = 'processing' AND lease_expires_at < {now} "
    "AND lease_expires_at >= %s ORDER BY lease_expires_at LIMIT %s{skip_locked}{in_close} AND status = 'processing' "
    "AND lease_expires_at < {now} AND lease_expires_at >= %s"
)
ANY_EXPIRED = "SELECT 1 FROM {msg} WHERE status = 'processing' AND lease_expires_at < {now} LIMIT 1"

# -- operator actions (chunks of message ids) -----------------------------------------

_BY_IDS = "WHERE message_id IN (SELECT b.mid FROM {rows})"
# An operator's requeue or redrive also withdraws an abort request (the message runs again).
REQUEUE = (
    "UPDATE {msg} SET status = 'pending', attempts = 0, available_at = {now}, lease_token = NULL, "
    "lease_expires_at = NULL, started_at = NULL, abort_requested_at = NULL, updated_at = {now} "
    + _BY_IDS
    + " AND status = 'processing'"
)
REQUEUE_STUCK = REQUEUE + " AND lease_expires_at < {now}"
REDRIVE = (
    "UPDATE {msg} SET status = 'pending', attempts = 0, "
    "available_at = CASE WHEN ordering_key <> '' THEN NULL ELSE {now} END, dead_at = NULL, "
    "abort_requested_at = NULL, updated_at = {now} " + _BY_IDS + " AND status = 'dead'"
)
DEAD_LETTER = (
    "UPDATE {msg} SET status = 'dead', dead_at = {now}, lease_token = NULL, lease_expires_at = NULL, "
    "last_error = %s, updated_at = {now} " + _BY_IDS + " AND status = %s"
)
KNOWN_IDS = "SELECT message_id FROM {msg} " + _BY_IDS

# -- dispatch bookkeeping (Celery transport) ------------------------------------------

DISPATCH_CANDIDATES = (
    "SELECT message_id, queue_name FROM {msg} WHERE status = 'pending' AND available_at <= {now} "
    "AND ((dispatched_at IS NULL AND updated_at < {after}) OR dispatched_at < updated_at "
    "OR dispatched_at < {after}) ORDER BY priority DESC, available_at, id LIMIT %s"
)
MARK_DISPATCHED = "UPDATE {msg} SET dispatched_at = {now} " + _BY_IDS
MARK_UNDISPATCHED = "UPDATE {msg} SET dispatched_at = NULL " + _BY_IDS

# -- reads ----------------------------------------------------------------------------

NOW = "SELECT {now}"
CREATED_AT = "SELECT created_at FROM {msg} WHERE id = %s"

#: Fenced statements that join a batch (``unnest`` of its ids and tokens) to the ledger: they
#: run on the hot path's cursor but are planned for each call, never prepared. A prepared
#: statement's generic plan takes the batch for 10 rows and the partial lease index for 1, and
#: nests a loop that unpacks the whole batch again for every leased row of the table
#: (O(batch x leases held); measured: 2.8 of 4.1 ms an acknowledgement of 100, more with every
#: worker). Planned with the batch in hand, PostgreSQL hashes it once (0.2 ms of planning).
PLANNED_PER_CALL = frozenset({"ACK", "ACK_LOCKED", "FAIL", "FAIL_LOCKED", "RELEASE", "RENEW", "RENEW_BUSY"})

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
    "RENEW": (("mid", "text"), ("tok", "uuid")),
    "RENEW_BUSY": (("mid", "text"), ("tok", "uuid")),
    "ACK": (("mid", "text"), ("tok", "uuid"), ("res", "text")),
    "ACK_LOCKED": (("mid", "text"), ("tok", "uuid"), ("res", "text")),
    "FAIL": (("mid", "text"), ("tok", "uuid"), ("err", "text"), ("delay", "float8")),
    "FAIL_LOCKED": (("mid", "text"), ("tok", "uuid"), ("err", "text"), ("delay", "float8")),
    "RELEASE": (("mid", "text"), ("tok", "uuid")),
    "LOCK_HELD": (("mid", "text"), ("tok", "uuid")),
    "RELEASE_UNKNOWN": (("tok", "uuid"),),
    "OWN_EVENTS": (("mid", "text"), ("att", "int")),
    "REQUEUE": (("mid", "text"),),
    "REQUEUE_STUCK": (("mid", "text"),),
    "REDRIVE": (("mid", "text"),),
    "DEAD_LETTER": (("mid", "text"),),
    "KNOWN_IDS": (("mid", "text"),),
    "MARK_DISPATCHED": (("mid", "text"),),
    "MARK_UNDISPATCHED": (("mid", "text"),),
    **statements_cancel.ROWS,
}

# Queue control's statements (kept in their own module, rendered with these).
from .statements_control import *  # noqa: E402, F403
