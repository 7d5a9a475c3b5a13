"""The statements of a partitioned ledger (PostgreSQL; :mod:`.partitions`), by name.

Table and partition names are formatted in (``{table}``, ``{part}``: zeroloss's own names, never
input); every value is a parameter.
"""

from __future__ import annotations

import re

# -- reading the layout ---------------------------------------------------------------------

IS_PARTITIONED = "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(%s))"
#: Each partition of a table: its name, its bounds (``FOR VALUES FROM (...) TO (...)``), and
#: whether a ``DETACH ... CONCURRENTLY`` of it was cut off.
PARTITIONS = (
    "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending FROM pg_inherits i "
    "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)"
)
#: Message partitions a drop detached and did not drop (tables named as partitions, attached to nothing).
DETACHED = (
    "SELECT c.relname FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE %s "
    "AND c.relnamespace = to_regnamespace(current_schema()) AND NOT c.relispartition ORDER BY 1"
)
INDEXES = (
    "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisunique, i.indisprimary FROM pg_index i "
    "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass(%s) ORDER BY c.relname"
)
#: The CHECK constraints of a detached partition (its bounds among them, added by the detach).
CHECKS = (
    "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'c'"
)
#: Each partition's rows as the planner estimates them (-1: never analysed).
PARTITION_ROWS = "SELECT c.relname, c.reltuples::bigint FROM pg_class c WHERE c.relname = ANY(%s)"
SERIAL_SEQUENCE = "SELECT pg_get_serial_sequence(%s, 'id')"
HOLDS_ROWS = "SELECT EXISTS (SELECT 1 FROM {table})"
NOW = "SELECT statement_timestamp()"
#: One sweeper at a time creates partitions (the others skip, until their next round).
TRY_DDL_LOCK = "SELECT pg_try_advisory_xact_lock(%s)"
#: One drop at a time (a session lock: a drop's detaches commit on their own); the others skip.
TRY_DROP_LOCK = "SELECT pg_try_advisory_lock(%s)"
DROP_UNLOCK = "SELECT pg_advisory_unlock(%s)"
#: A send whose period is missing waits for the process creating it (bounded by LOCK_TIMEOUT).
DDL_LOCK_WAIT = "SELECT pg_advisory_xact_lock(%s)"
#: DDL never queues the ledger behind a long transaction: it gives up, and is tried again.
LOCK_TIMEOUT = "SET LOCAL lock_timeout = {ms}"
#: A conversion's transactions that hold locks workers wait for (its copied rows FOR SHARE, the
#: swap's ACCESS EXCLUSIVE) are ended by the server if the converting process stalls or dies
#: mid-way, whatever its client does (milliseconds).
BOUND_IDLE = "SET LOCAL idle_in_transaction_session_timeout = {ms}"
BOUND_STATEMENT = "SET LOCAL statement_timeout = {ms}"

# -- a new install's tables made partitioned (empty) ----------------------------------------------

CREATE_PARTITIONED = (
    "CREATE TABLE {table}_partitioned (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
    "INCLUDING STORAGE) PARTITION BY RANGE ({key})"
)
DROP = "DROP TABLE {table}"
DROP_IF_EXISTS = "DROP TABLE IF EXISTS {table}"
RENAME_PARTITIONED = "ALTER TABLE {table}_partitioned RENAME TO {table}"
# Identity columns cannot be partitioned before PostgreSQL 17: a sequence of its own, owned by
# the column (``pg_get_serial_sequence`` finds it as it found the identity's).
CREATE_SEQUENCE = "CREATE SEQUENCE {sequence}"
ID_FROM_SEQUENCE = "ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{sequence}')"
OWN_SEQUENCE = "ALTER SEQUENCE {sequence} OWNED BY {table}.id"
KEY_NOT_NULL = "ALTER TABLE {table} ALTER COLUMN {key} SET NOT NULL"
PRIMARY_KEY = "ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY {columns}"

# -- partitions ------------------------------------------------------------------------------------

#: A partition is created as a table of its own, its indexes named after the parent's
#: (``zeroloss_msg_claim_idx_p20261203``), then attached: ``ATTACH`` takes a ``SHARE UPDATE
#: EXCLUSIVE`` lock on the parent (writes go on), ``CREATE TABLE ... PARTITION OF`` an
#: ``ACCESS EXCLUSIVE`` one.
CREATE_LIKE = "CREATE TABLE {part} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)"
ATTACH = "ALTER TABLE {table} ATTACH PARTITION {part} FOR VALUES FROM (%s) TO (%s)"
DETACH_CONCURRENTLY = "ALTER TABLE {table} DETACH PARTITION {part} CONCURRENTLY"
DETACH_FINALIZE = "ALTER TABLE {table} DETACH PARTITION {part} FINALIZE"

# -- a period dropped ---------------------------------------------------------------------------

#: The census reads a whole period: from its ``(queue_name, status)`` index (deduplicated, a
#: small part of the heap: 800 pages for a million messages of one queue; in order, so counted as
#: it is read) and without parallel workers, so that on a small
#: machine it takes one core and little I/O from the claims (a parallel scan of the heap took
#: every core). Set for the drop's transaction, the scan's setting put back after the census.
CENSUS_PLAN = "SELECT set_config('max_parallel_workers_per_gather', '0', true), set_config('enable_seqscan', 'off', true)"
CENSUS_PLAN_DONE = "SET LOCAL enable_seqscan TO DEFAULT"
#: A detached period's messages by queue and status.
CENSUS = "SELECT queue_name, status, count(*) FROM {part} GROUP BY queue_name, status"
#: Whether a period holds a message a drop may not take, read from the partial indexes (no scan
#: of the period): asked before the detach, and again of the detached table, where nothing
#: changes it any more, with the census (which keeps a period holding a status the ledger does
#: not write, a status no probe names: looking for it here would scan the period). A period
#: holding a workflow's step is kept whatever its status: a workflow goes whole, by the purge of
#: finished workflows (:mod:`.workflow_retention`), never with a period. ``{dead}``: ``DEAD_KEPT`` or,
#: with a dead letters' retention, ``DEAD_KEPT_BEFORE`` (parameters: the completed messages'
#: cut-off, twice; then the dead letters').
HOLDS_KEPT = (
    "SELECT EXISTS (SELECT 1 FROM {part} WHERE status = 'pending' AND available_at IS NOT NULL) "
    "OR EXISTS (SELECT 1 FROM {part} WHERE status = 'pending' AND available_at IS NULL) "
    "OR EXISTS (SELECT 1 FROM {part} WHERE status = 'processing') "
    "OR EXISTS (SELECT 1 FROM {part} WHERE status = 'completed' AND (completed_at >= %s OR completed_at IS NULL)) "
    "OR EXISTS (SELECT 1 FROM {part} WHERE status = 'cancelled' AND updated_at >= %s) "
    "OR EXISTS (SELECT 1 FROM {part} WHERE status = 'dead'{dead}) "
    "OR EXISTS (SELECT 1 FROM {part} WHERE workflow_id <> '' AND status = 'waiting') "
    "OR EXISTS (SELECT 1 FROM {part} WHERE workflow_id <> '')"
)
#: The statuses HOLDS_KEPT decides about, read from its text: the census keeps a period holding
#: any other (one a later version adds and these probes do not know yet), whatever ``Status`` says.
PROBED_STATUSES = frozenset(re.findall(r"status = '(\w+)'", HOLDS_KEPT))
DEAD_KEPT = ""
DEAD_KEPT_BEFORE = " AND (dead_at >= %s OR dead_at IS NULL)"
#: The detached message partition kept as the list of ids whose keys go (models.DroppedPeriod).
DROPPED_PERIOD = (
    "INSERT INTO {dropped} (table_name, starts_at, ends_at, cleaned_to, dropped_at) "
    "VALUES (%s, %s, %s, 0, statement_timestamp())"
)
DROPPED_PERIODS = "SELECT table_name, starts_at, ends_at, cleaned_to FROM {dropped} ORDER BY starts_at"
#: One purger at a time deletes a period's keys (another one, cron beside the beat task, skips it).
DROPPED_LOCK = "SELECT cleaned_to FROM {dropped} WHERE table_name = %s FOR UPDATE SKIP LOCKED"
#: One batch of a dropped period's keys deleted, in the order of its ids (parameters: the last
#: id done, the batch size, the period's bounds): the highest id of the batch, its size and the
#: keys deleted. A key stored again since (a resend took it over) has a later ``created_at`` and
#: stays.
DELETE_KEYS_BATCH = (
    "WITH d AS (SELECT id, message_id FROM {part} WHERE id > %s ORDER BY id LIMIT %s), "
    "gone AS (DELETE FROM {keys} k USING d WHERE k.message_id = d.message_id "
    "AND k.created_at >= %s AND k.created_at < %s RETURNING 1) "
    "SELECT (SELECT max(id) FROM d), (SELECT count(*) FROM d), (SELECT count(*) FROM gone)"
)
DROPPED_CLEANED_TO = "UPDATE {dropped} SET cleaned_to = %s WHERE table_name = %s"
DROPPED_DONE = "DELETE FROM {dropped} WHERE table_name = %s"
#: Keys of these ids that belong to no message any more (their period was dropped, the keys not
#: yet deleted): deleted, so that a resend stores its message again, as after a row-by-row purge.
FREE_STALE_KEYS = (
    "DELETE FROM {keys} k WHERE k.message_id = ANY(%s) AND EXISTS (SELECT 1 FROM {dropped} d "
    "WHERE k.created_at >= d.starts_at AND k.created_at < d.ends_at) RETURNING k.message_id"
)

# -- a populated ledger converted online (conversion.py) -------------------------------------------

#: A table's columns, in order.
COLUMNS = (
    "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped "
    "ORDER BY attnum"
)
TABLE_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"
#: Where a conversion stands, one row per table: the highest id stored before its mirror
#: trigger existed (what the copy must reach), and how far the copy got.
PROGRESS_CREATE = (
    "CREATE TABLE IF NOT EXISTS {progress} (table_name text PRIMARY KEY, high_water bigint NOT NULL, "
    "copied_to bigint NOT NULL)"
)
PROGRESS = "SELECT table_name, high_water, copied_to FROM {progress}"
PROGRESS_START = "INSERT INTO {progress} VALUES (%s, %s, %s) ON CONFLICT (table_name) DO NOTHING"
PROGRESS_COPIED = "UPDATE {progress} SET copied_to = %s WHERE table_name = %s"
PROGRESS_DROP = "DROP TABLE IF EXISTS {progress}"
SEQUENCE_LAST = "SELECT last_value FROM {sequence}"
SEQUENCE_SET = "SELECT setval(%s, %s)"
MIN_ID = "SELECT coalesce(min(id), 1) FROM {table}"
#: Every change of a row of the old table made to its copy in the new one, in the changing
#: transaction: an update is the old version deleted and the new one inserted (``{fill}``: the
#: audit rows' ``message_created_at``, NULL on rows written before 0.3, from their message).
MIRROR_FUNCTION = (
    "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $body$ "
    "DECLARE r {source}%ROWTYPE; BEGIN "
    "IF TG_OP <> 'INSERT' THEN DELETE FROM {target} WHERE id = OLD.id; END IF; "
    "IF TG_OP <> 'DELETE' THEN r := NEW;{fill} INSERT INTO {target} SELECT (r).*; END IF; "
    "RETURN NULL; END $body$"
)
MIRROR_FILL = (
    " IF r.message_created_at IS NULL THEN r.message_created_at := coalesce("
    "(SELECT m.created_at FROM {messages} m WHERE m.id = r.message_id), r.created_at); END IF;"
)
MIRROR_TRIGGER_DROP = "DROP TRIGGER IF EXISTS {function} ON {source}"
MIRROR_TRIGGER = (
    "CREATE TRIGGER {function} AFTER INSERT OR UPDATE OR DELETE ON {source} FOR EACH ROW "
    "EXECUTE FUNCTION {function}()"
)
MIRROR_FUNCTION_DROP = "DROP FUNCTION IF EXISTS {function}()"
#: One range of ids copied. ``FOR SHARE``: a transition or purge of a row being copied waits
#: for the copy's commit (its mirror then replaces the copy), and a row changed after the copy's
#: snapshot is copied as it is now, or skipped when its mirror stored it already.
COPY_RANGE = (
    "INSERT INTO {target} SELECT {columns} FROM {source} s WHERE s.id >= %s AND s.id < %s FOR SHARE OF s "
    "ON CONFLICT DO NOTHING"
)
COPY_FILL = "coalesce(s.message_created_at, (SELECT m.created_at FROM {messages} m WHERE m.id = s.message_id), s.created_at)"
#: A table and its copy, compared in one snapshot (every transaction changed both or neither).
FINGERPRINT = "SELECT count(*), coalesce(sum(hashtextextended(ROW({columns})::text, 0)), 0) FROM {table}"
REPEATABLE_READ = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"
LOCK_EXCLUSIVE = "LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE"
RENAME_TABLE = "ALTER TABLE {table} RENAME TO {name}"
RENAME_CONSTRAINT = "ALTER TABLE {table} RENAME CONSTRAINT {old} TO {name}"
RENAME_INDEX = "ALTER INDEX {index} RENAME TO {name}"
RENAME_SEQUENCE = "ALTER SEQUENCE {sequence} RENAME TO {name}"
ANALYZE = "ANALYZE {table}"
#: The periods (numbered from the epoch) a table's rows were created in.
PERIODS_HELD = "SELECT DISTINCT floor(extract(epoch FROM created_at) / %s)::bigint FROM {table}"
