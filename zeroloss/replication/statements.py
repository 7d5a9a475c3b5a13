"""Replication's statements, by name (rendered by the engine, as :mod:`zeroloss.ledger.statements`).

All but the node registry's read PostgreSQL's WAL and walsenders: they run where
``Engine.supports_replication``.
"""

from __future__ import annotations

from ..models import ReplicationNode

_NODE = ReplicationNode._meta.db_table

# -- measuring (PostgreSQL) -------------------------------------------------------------------

IN_RECOVERY = "SELECT pg_is_in_recovery()"
# Physical walsenders are not connected to a database; logical ones are.
STANDBYS = (
    "SELECT r.application_name, COALESCE(host(r.client_addr), 'local'), r.state, r.sync_state, "
    "(r.flush_lsn - '0/0'::pg_lsn)::bigint, (r.replay_lsn - '0/0'::pg_lsn)::bigint, "
    "a.datid IS NULL, r.state IS NOT NULL "
    "FROM pg_stat_replication r LEFT JOIN pg_stat_activity a ON a.pid = r.pid "
    "ORDER BY r.application_name, r.pid"
)
INSERT_LSN = (
    "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint, "
    "current_setting('wal_block_size')::bigint, pg_size_bytes(current_setting('wal_segment_size'))"
)
HAS_WRITTEN = "SELECT pg_current_xact_id_if_assigned() IS NOT NULL"

# -- recording a commit's position (PostgreSQL) -------------------------------------------------

#: For this transaction: standbys report replay at once, and COMMIT (which may wait for
#: ``synchronous_standby_names``) is bounded by a statement timeout of ``%s`` milliseconds.
REPORT_REPLAY = (
    "SELECT set_config('synchronous_commit', 'remote_apply', true), set_config('statement_timeout', %s, true)"
)
RECORD_LSN = "UPDATE {msg} SET commit_lsn = %s WHERE id = ANY(%s) AND commit_lsn IS NULL"
#: A transaction id: a commit record even when nothing changed.
WRITE_COMMIT = "SELECT pg_current_xact_id()"
RECORDED_LSNS = "SELECT id, commit_lsn FROM {msg} WHERE id = ANY(%s)"

# -- the node registry ----------------------------------------------------------------------------

REGISTER_NODE = (
    f"INSERT INTO {_NODE} (node_id, address, role, metadata, state, sync_state, flush_lsn, replay_lsn, "
    "registered_at, last_seen_at) VALUES (%s, %s, %s, %s{jsonb}, %s, %s, %s, %s, {now}, {now}) "
    "ON CONFLICT (node_id) DO UPDATE SET address = EXCLUDED.address, role = EXCLUDED.role, "
    "metadata = EXCLUDED.metadata, state = EXCLUDED.state, sync_state = EXCLUDED.sync_state, "
    "flush_lsn = EXCLUDED.flush_lsn, replay_lsn = EXCLUDED.replay_lsn, last_seen_at = EXCLUDED.last_seen_at"
)
HEARTBEAT = f"UPDATE {_NODE} SET last_seen_at = {{now}} WHERE node_id = %s"
