-- The audit rows of a move (zeroloss.ledger.statements, part of the ledger's catalogue), one
-- per moved message, with the columns every moving statement returns (statements_moves.MOVED:
-- the source status, the reason and the detail its declared edges derive) and the actor.
-- Read by zeroloss.ledger.catalogue; run as written.

-- Not a statement: the audit rows' CTE (``ev``) PostgreSQL's audit wrapper
-- (postgres.PostgresEngine.audit_wrapper) puts after a moving statement's moved rows ``t``,
-- in the same statement.
-- name: AUDIT_ROWS [postgresql]
INSERT INTO zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at)
SELECT id, from_status, status, reason, %(actor)s, attempts, detail, updated_at, created_at FROM t

-- SQLite: in the move's transaction, from the moved rows as the engine derived them
-- (statements_moves.audit_row, in MessageEvent's column order), one JSON array of rows.
-- name: AUDIT_ROWS [sqlite]
INSERT INTO zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), json_extract(value, '$[3]'),
  json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]'), json_extract(value, '$[7]'),
  json_extract(value, '$[8]')
FROM json_each(%(rows)s)
