-- The reads of the snapshot, verify, the admin, the health checks and the system checks
-- (zeroloss.ledger.statements_reads). Read by zeroloss.ledger.catalogue; run as written.

-- ---------------------------------------------------------------------------------------
-- Planner statistics (PostgreSQL; run where Engine.has_statistics). A partitioned table's
-- own entry holds no rows: its partitions' are summed (a plain table has none, and counts
-- alone). Autovacuum analyses partitions, never their parent. ``table``: its name.

-- A table's rows as the planner would estimate them now (its last density times its size).
-- name: TABLE_ROWS
SELECT SUM(CASE WHEN c.relpages > 0 AND c.reltuples >= 0
                THEN c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::bigint) END)
FROM pg_class c, (SELECT %(table)s::regclass AS oid) t
WHERE c.oid = t.oid OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = t.oid)

-- The last analysed row count of a table (-1: never analysed).
-- name: TABLE_ROWS_ANALYSED
SELECT COALESCE(SUM(c.reltuples) FILTER (WHERE c.reltuples >= 0 AND c.relkind <> 'p'), -1)::bigint
FROM pg_class c, (SELECT %(table)s::regclass AS oid) t
WHERE c.oid = t.oid OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = t.oid)

-- The most common queues of a table and their shares.
-- name: QUEUE_SHARES
SELECT s.most_common_vals::text::text[], s.most_common_freqs, s.n_distinct, s.null_frac
FROM pg_stats s
JOIN pg_class c ON c.relname = s.tablename
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname
WHERE c.oid = %(table)s::regclass AND s.attname = 'queue_name'

-- ---------------------------------------------------------------------------------------
-- Verify's conservation counts. One statement, one snapshot: a transition commits its
-- message row and its audit row together, so these counts are mutually consistent even
-- under load. The messages persisted (their audit rows), those purged, then the messages of
-- each status, in the order of statements_reads.CONSERVATION_STATUSES (a test keeps them
-- equal).

-- name: CONSERVATION
SELECT (SELECT COUNT(*) FROM zeroloss_messageevent WHERE reason = 'persisted'),
       (SELECT COALESCE(SUM(count), 0) FROM zeroloss_purgerecord),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'pending'),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'processing'),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'completed'),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'dead'),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'cancelled'),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'waiting')

-- name: CONSERVATION_OF_QUEUE
SELECT (SELECT COUNT(*) FROM zeroloss_messageevent e JOIN zeroloss_message m ON m.id = e.message_id
        WHERE e.reason = 'persisted' AND m.queue_name = %(queue)s),
       (SELECT COALESCE(SUM(count), 0) FROM zeroloss_purgerecord WHERE queue_name = %(queue)s),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'pending' AND queue_name = %(queue)s),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'processing' AND queue_name = %(queue)s),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'completed' AND queue_name = %(queue)s),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'dead' AND queue_name = %(queue)s),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'cancelled' AND queue_name = %(queue)s),
       (SELECT COUNT(*) FROM zeroloss_message WHERE status = 'waiting' AND queue_name = %(queue)s)

-- ---------------------------------------------------------------------------------------
-- Liveness, and the system checks' readings (all but PING: PostgreSQL).

-- name: PING
SELECT 1

-- Whether the database's disk takes new data: with work_mem lowered for the probe
-- (STORAGE_PROBE_MEMORY returns the value to restore with STORAGE_PROBE_RESTORE), a sort
-- spilled to temporary files of about 400 kB in the data directory, refused with SQLSTATE
-- 53100 when the disk is full. Nothing is kept, nothing is logged to WAL.
-- name: STORAGE_PROBE
SELECT count(*) FROM (SELECT g FROM generate_series(1, 10000) g ORDER BY g DESC) s

-- name: STORAGE_PROBE_MEMORY
SELECT current_setting('work_mem'), set_config('work_mem', '64kB', true)

-- name: STORAGE_PROBE_RESTORE
SELECT set_config('work_mem', %(work_mem)s, true)

-- The stall probe's transaction: a transactional logical-decoding message is a WAL record,
-- so its COMMIT is flushed (fsync) like any write's; no table is written.
-- name: COMMIT_PROBE
SELECT pg_logical_emit_message(true, 'zeroloss', 'commit probe')

-- The process id of the backend that runs this query (a pooler hands out another one).
-- name: BACKEND_PID
SELECT pg_backend_pid()

-- name: SERVER_SETTINGS
SELECT current_setting('server_version_num')::int, current_setting('fsync'), current_setting('synchronous_commit')
