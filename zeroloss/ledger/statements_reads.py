"""The reads of the snapshot, verify and the admin, by name (rendered by the engine, as
:mod:`.statements`). Those that read PostgreSQL's statistics run where
``Engine.has_statistics``."""

from __future__ import annotations

from ..models import PurgeRecord, Status

_PURGE = PurgeRecord._meta.db_table

# -- planner statistics (PostgreSQL) --------------------------------------------------------

# A partitioned table's own entry holds no rows: its partitions' are summed (a plain table has
# none, and counts alone). Autovacuum analyses partitions, never their parent.
_TABLE_AND_PARTITIONS = (
    "FROM pg_class c, (SELECT %s::regclass AS oid) t WHERE c.oid = t.oid "
    "OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = t.oid)"
)
#: A table's rows as the planner would estimate them now (its last density times its size).
TABLE_ROWS = (
    "SELECT SUM(CASE WHEN c.relpages > 0 AND c.reltuples >= 0 THEN c.reltuples / c.relpages * "
    "(pg_relation_size(c.oid) / current_setting('block_size')::bigint) END) " + _TABLE_AND_PARTITIONS
)
#: The last analysed row count of a table (-1: never analysed).
TABLE_ROWS_ANALYSED = (
    "SELECT COALESCE(SUM(c.reltuples) FILTER (WHERE c.reltuples >= 0 AND c.relkind <> 'p'), -1)::bigint "
    + _TABLE_AND_PARTITIONS
)
QUEUE_SHARES = (
    "SELECT s.most_common_vals::text::text[], s.most_common_freqs, s.n_distinct, s.null_frac FROM pg_stats s "
    "JOIN pg_class c ON c.relname = s.tablename JOIN pg_namespace n ON n.oid = c.relnamespace "
    "AND n.nspname = s.schemaname WHERE c.oid = %s::regclass AND s.attname = 'queue_name'"
)


def distinct_walk(table: str, column: str) -> str:
    """The first ``%s`` distinct values of an indexed column, in order, by a recursive walk (a
    "loose index scan"): each step is one probe of an index that starts with the column, for
    the smallest value above the previous one. ``table`` and ``column`` come quoted."""
    return (
        f"WITH RECURSIVE walk(value, n) AS (SELECT MIN({column}), 1 FROM {table} "
        f"UNION ALL SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > walk.value), n + 1 "
        "FROM walk WHERE walk.value IS NOT NULL AND n < %s) SELECT value FROM walk WHERE value IS NOT NULL"
    )


# -- verify's conservation counts -------------------------------------------------------------

# One statement, one snapshot: a transition commits its message row and its audit row
# together, so these counts are mutually consistent even under load. Parameters: the
# queue (twice, for the _OF_QUEUE form), then each status of ``CONSERVATION_STATUSES``
# (each followed by the queue).
CONSERVATION_STATUSES = tuple(s.value for s in Status)
CONSERVATION = (
    "SELECT (SELECT COUNT(*) FROM {evt} WHERE reason = 'persisted'), "
    f"(SELECT COALESCE(SUM(count), 0) FROM {_PURGE}), "
    + ", ".join("(SELECT COUNT(*) FROM {msg} WHERE status = %s)" for _ in CONSERVATION_STATUSES)
)
CONSERVATION_OF_QUEUE = (
    "SELECT (SELECT COUNT(*) FROM {evt} e JOIN {msg} m ON m.id = e.message_id "
    "WHERE e.reason = 'persisted' AND m.queue_name = %s), "
    f"(SELECT COALESCE(SUM(count), 0) FROM {_PURGE} WHERE queue_name = %s), "
    + ", ".join(
        "(SELECT COUNT(*) FROM {msg} WHERE status = %s AND queue_name = %s)" for _ in CONSERVATION_STATUSES
    )
)

# -- liveness, and the system checks' readings (PostgreSQL) ----------------------------------

PING = "SELECT 1"
#: Whether the database's disk takes new data (PostgreSQL): with ``work_mem`` lowered for the
#: probe (``STORAGE_PROBE_MEMORY`` returns the value to restore with ``STORAGE_PROBE_RESTORE``), a
#: sort spilled to temporary files of about 400 kB in the data directory, refused with SQLSTATE
#: 53100 when the disk is full. Nothing is kept, nothing is logged to WAL.
STORAGE_PROBE = "SELECT count(*) FROM (SELECT g FROM generate_series(1, 10000) g ORDER BY g DESC) s"
STORAGE_PROBE_MEMORY = "SELECT current_setting('work_mem'), set_config('work_mem', '64kB', true)"
STORAGE_PROBE_RESTORE = "SELECT set_config('work_mem', %s, true)"
#: The stall probe's transaction: a transactional logical-decoding message is a WAL record, so its
#: COMMIT is flushed (fsync) like any write's; no table is written.
COMMIT_PROBE = "SELECT pg_logical_emit_message(true, 'zeroloss', 'commit probe')"
#: The process id of the backend that runs this query (a pooler hands out another one).
BACKEND_PID = "SELECT pg_backend_pid()"
SERVER_SETTINGS = (
    "SELECT current_setting('server_version_num')::int, current_setting('fsync'), "
    "current_setting('synchronous_commit')"
)
