-- Replication's statements (zeroloss.replication.statements). Read by
-- zeroloss.ledger.catalogue; run as written. All but the node registry's read PostgreSQL's
-- WAL and walsenders: they run where Engine.supports_replication.

-- ---------------------------------------------------------------------------------------
-- Measuring (PostgreSQL).

-- name: IN_RECOVERY
SELECT pg_is_in_recovery()

-- Physical walsenders are not connected to a database; logical ones are.
-- name: STANDBYS
SELECT r.application_name, COALESCE(host(r.client_addr), 'local'), r.state, r.sync_state,
       (r.flush_lsn - '0/0'::pg_lsn)::bigint, (r.replay_lsn - '0/0'::pg_lsn)::bigint,
       a.datid IS NULL, r.state IS NOT NULL
FROM pg_stat_replication r LEFT JOIN pg_stat_activity a ON a.pid = r.pid
ORDER BY r.application_name, r.pid

-- name: INSERT_LSN
SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint,
       current_setting('wal_block_size')::bigint, pg_size_bytes(current_setting('wal_segment_size'))

-- name: HAS_WRITTEN
SELECT pg_current_xact_id_if_assigned() IS NOT NULL

-- ---------------------------------------------------------------------------------------
-- Recording a commit's position (PostgreSQL).

-- For this transaction: standbys report replay at once, and COMMIT (which may wait for
-- synchronous_standby_names) is bounded by a statement timeout of ``timeout_ms``.
-- name: REPORT_REPLAY
SELECT set_config('synchronous_commit', 'remote_apply', true), set_config('statement_timeout', %(timeout_ms)s, true)

-- name: RECORD_LSN
UPDATE zeroloss_message SET commit_lsn = %(lsn)s WHERE id = ANY(%(ids)s) AND commit_lsn IS NULL

-- A transaction id: a commit record even when nothing changed.
-- name: WRITE_COMMIT
SELECT pg_current_xact_id()

-- name: RECORDED_LSNS
SELECT id, commit_lsn FROM zeroloss_message WHERE id = ANY(%(ids)s)

-- ---------------------------------------------------------------------------------------
-- The node registry: an upsert counts as a heartbeat.

-- name: REGISTER_NODE [postgresql]
INSERT INTO zeroloss_replicationnode (node_id, address, role, metadata, state, sync_state, flush_lsn, replay_lsn,
                                      registered_at, last_seen_at)
VALUES (%(node_id)s, %(address)s, %(role)s, %(metadata)s::jsonb, %(state)s, %(sync_state)s, %(flush_lsn)s,
        %(replay_lsn)s, statement_timestamp(), statement_timestamp())
ON CONFLICT (node_id) DO UPDATE SET address = EXCLUDED.address, role = EXCLUDED.role, metadata = EXCLUDED.metadata,
  state = EXCLUDED.state, sync_state = EXCLUDED.sync_state, flush_lsn = EXCLUDED.flush_lsn,
  replay_lsn = EXCLUDED.replay_lsn, last_seen_at = EXCLUDED.last_seen_at

-- name: REGISTER_NODE [sqlite]
INSERT INTO zeroloss_replicationnode (node_id, address, role, metadata, state, sync_state, flush_lsn, replay_lsn,
                                      registered_at, last_seen_at)
VALUES (%(node_id)s, %(address)s, %(role)s, %(metadata)s, %(state)s, %(sync_state)s, %(flush_lsn)s,
        %(replay_lsn)s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
ON CONFLICT (node_id) DO UPDATE SET address = EXCLUDED.address, role = EXCLUDED.role, metadata = EXCLUDED.metadata,
  state = EXCLUDED.state, sync_state = EXCLUDED.sync_state, flush_lsn = EXCLUDED.flush_lsn,
  replay_lsn = EXCLUDED.replay_lsn, last_seen_at = EXCLUDED.last_seen_at

-- name: HEARTBEAT [postgresql]
UPDATE zeroloss_replicationnode SET last_seen_at = statement_timestamp() WHERE node_id = %(node_id)s

-- name: HEARTBEAT [sqlite]
UPDATE zeroloss_replicationnode SET last_seen_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') WHERE node_id = %(node_id)s
