"""The statements of a partitioned ledger (PostgreSQL; :mod:`.partitions`), by name.

Table and partition names are formatted in (``{table}``, ``{part}``: zeroloss's own names, never
input); every value is a parameter.
"""

from __future__ import annotations

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
SERIAL_SEQUENCE = "SELECT pg_get_serial_sequence(%s, 'id')"
HOLDS_ROWS = "SELECT EXISTS (SELECT 1 FROM {table})"
NOW = "SELECT statement_timestamp()"
#: One sweeper at a time creates partitions (the others skip, until their next round).
TRY_DDL_LOCK = "SELECT pg_try_advisory_xact_lock(%s)"
#: DDL never queues the ledger behind a long transaction: it gives up, and is tried again.
LOCK_TIMEOUT = "SET LOCAL lock_timeout = {ms}"

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

#: A period's messages by queue and status, and how many a drop may not take (``{eligible}``).
CENSUS = (
    "SELECT queue_name, status, count(*), count(*) FILTER (WHERE NOT ({eligible})) FROM {part} "
    "GROUP BY queue_name, status"
)
#: What a drop may take: finished, and past the retention of its status (parameters: the
#: completed messages' cut-off, twice; then the dead letters', with ELIGIBLE_DEAD).
ELIGIBLE = "(status = 'completed' AND completed_at < %s) OR (status = 'cancelled' AND updated_at < %s)"
ELIGIBLE_DEAD = " OR (status = 'dead' AND dead_at < %s)"
#: The dropped messages' ids, out of the key table (a resend stores the message again).
DELETE_KEYS = "DELETE FROM {keys} WHERE message_id IN (SELECT message_id FROM {part})"
