-- The operator's moves by message id (zeroloss.ledger.statements, part of the ledger's
-- catalogue), in chunks of ids (``ids``: one column, unnest or json_each). Read by
-- zeroloss.ledger.catalogue; run as written, the audit rows derived from each statement's
-- declared edge (statements.MOVES): its RETURNING columns name the source status and the
-- reason (a test keeps them equal to the declaration); the engine writes the audit row of
-- each moved message from them, with the actor, in the same statement (PostgreSQL: a CTE
-- around it) or transaction (SQLite).

-- An operator's requeue of a processing message (REQUEUE: a live lease revoked too, whose
-- holder's outcome fencing then refuses; REQUEUE_STUCK: only an expired one). It also
-- withdraws an abort request (the message runs again).
-- name: REQUEUE [postgresql]
UPDATE zeroloss_message SET status = 'pending', attempts = 0, available_at = statement_timestamp(), lease_token = NULL,
  lease_expires_at = NULL, started_at = NULL, abort_requested_at = NULL, updated_at = statement_timestamp()
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid)) AND status = 'processing'
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'requeued_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: REQUEUE [sqlite]
UPDATE zeroloss_message SET status = 'pending', attempts = 0, available_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), lease_token = NULL,
  lease_expires_at = NULL, started_at = NULL, abort_requested_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(ids)s)) AS b) AND status = 'processing'
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'requeued_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: REQUEUE_STUCK [postgresql]
UPDATE zeroloss_message SET status = 'pending', attempts = 0, available_at = statement_timestamp(), lease_token = NULL,
  lease_expires_at = NULL, started_at = NULL, abort_requested_at = NULL, updated_at = statement_timestamp()
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid)) AND status = 'processing'
  AND lease_expires_at < statement_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'requeued_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: REQUEUE_STUCK [sqlite]
UPDATE zeroloss_message SET status = 'pending', attempts = 0, available_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), lease_token = NULL,
  lease_expires_at = NULL, started_at = NULL, abort_requested_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(ids)s)) AS b) AND status = 'processing'
  AND lease_expires_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'requeued_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- A dead message runs again: claimable now, or behind its ordering key's head.
-- name: REDRIVE [postgresql]
UPDATE zeroloss_message SET status = 'pending', attempts = 0,
  available_at = CASE WHEN ordering_key <> '' THEN NULL ELSE statement_timestamp() END, dead_at = NULL,
  abort_requested_at = NULL, updated_at = statement_timestamp()
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid)) AND status = 'dead'
RETURNING id, message_id, status, attempts, updated_at, CAST('dead' AS TEXT) AS from_status,
  'redriven_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: REDRIVE [sqlite]
UPDATE zeroloss_message SET status = 'pending', attempts = 0,
  available_at = CASE WHEN ordering_key <> '' THEN NULL ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END, dead_at = NULL,
  abort_requested_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(ids)s)) AS b) AND status = 'dead'
RETURNING id, message_id, status, attempts, updated_at, CAST('dead' AS TEXT) AS from_status,
  'redriven_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- Dead-lettered by an operator, with ``error`` as its last error: one statement per source
-- status, each declaring its own edge.
-- name: DEAD_LETTER_PENDING [postgresql]
UPDATE zeroloss_message SET status = 'dead', dead_at = statement_timestamp(), lease_token = NULL, lease_expires_at = NULL,
  last_error = %(error)s, updated_at = statement_timestamp()
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid)) AND status = 'pending'
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'dead_lettered_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: DEAD_LETTER_PENDING [sqlite]
UPDATE zeroloss_message SET status = 'dead', dead_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), lease_token = NULL, lease_expires_at = NULL,
  last_error = %(error)s, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(ids)s)) AS b) AND status = 'pending'
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'dead_lettered_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: DEAD_LETTER_PROCESSING [postgresql]
UPDATE zeroloss_message SET status = 'dead', dead_at = statement_timestamp(), lease_token = NULL, lease_expires_at = NULL,
  last_error = %(error)s, updated_at = statement_timestamp()
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid)) AND status = 'processing'
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'dead_lettered_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: DEAD_LETTER_PROCESSING [sqlite]
UPDATE zeroloss_message SET status = 'dead', dead_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), lease_token = NULL, lease_expires_at = NULL,
  last_error = %(error)s, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(ids)s)) AS b) AND status = 'processing'
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'dead_lettered_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- Which of the ids are stored (every id of an operator's action is checked first).
-- name: KNOWN_IDS [postgresql]
SELECT message_id FROM zeroloss_message WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid))

-- name: KNOWN_IDS [sqlite]
SELECT message_id FROM zeroloss_message WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(ids)s)) AS b)
