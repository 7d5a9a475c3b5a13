-- The lease holder's outcomes (zeroloss.ledger.statements_leases, part of the ledger's
-- catalogue): acknowledge, fail, snooze, release. Read by zeroloss.ledger.catalogue; run as
-- written. Each moving statement's RETURNING columns name its declared edges
-- (statements_leases.LEASE_MOVES: the source status, the reason by the new status); a test
-- keeps them equal to what the declaration derives. The engine writes each moved message's
-- audit row from them, with the actor: PostgreSQL in a CTE around the statement (with the
-- release of a finished ordering key's next message when the batch has keys), SQLite in the
-- same transaction.

-- Every lease-holder statement is fenced: the current token, still processing, lease
-- unexpired, no abort requested (an aborted message's outcome is recorded by CANCEL_ABORTED
-- only). PostgreSQL also bounds it below by the UTC day of the batch's earliest message
-- (created_from), so that it is planned without the partitions of earlier periods
-- (docs/scaling.md#retention-by-partition). A batch travels as one array per column
-- (PostgreSQL) or one JSON array of rows (SQLite).
--
-- The acknowledged state, with each message's stored result.
-- name: ACK [postgresql]
UPDATE zeroloss_message SET status = 'completed', completed_at = statement_timestamp(), last_error = '',
  result = b.res::jsonb, lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[], %(res)s::text[]) AS b(mid, tok, res)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz) AND zeroloss_message.lease_expires_at > clock_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'acknowledged' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: ACK [sqlite]
UPDATE zeroloss_message SET status = 'completed',
  completed_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), last_error = '', result = b.res,
  lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok, json_extract(value, '$.res') AS res FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'acknowledged' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- Inside a transactional batch whose rows this transaction locked after a fenced check
-- (LOCK_HELD): nobody else can have moved them since, whatever the clock says now. So for
-- every _LOCKED statement below.
-- name: ACK_LOCKED [postgresql]
UPDATE zeroloss_message SET status = 'completed', completed_at = statement_timestamp(), last_error = '',
  result = b.res::jsonb, lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[], %(res)s::text[]) AS b(mid, tok, res)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'acknowledged' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: ACK_LOCKED [sqlite]
UPDATE zeroloss_message SET status = 'completed',
  completed_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), last_error = '', result = b.res,
  lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok, json_extract(value, '$.res') AS res FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'acknowledged' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- One acknowledgement (acknowledge): scalar parameters, no batch to unpack.
-- name: ACK_ONE [postgresql]
UPDATE zeroloss_message SET status = 'completed', completed_at = statement_timestamp(), last_error = '',
  result = %(result)s::jsonb, lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
WHERE message_id = %(mid)s AND lease_token = %(tok)s AND status = 'processing'
  AND zeroloss_message.abort_requested_at IS NULL AND zeroloss_message.lease_expires_at > clock_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'acknowledged' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: ACK_ONE [sqlite]
UPDATE zeroloss_message SET status = 'completed',
  completed_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), last_error = '', result = %(result)s,
  lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id = %(mid)s AND lease_token = %(tok)s AND status = 'processing'
  AND zeroloss_message.abort_requested_at IS NULL AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'acknowledged' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- A failed attempt: dead once its attempts are spent, else pending again after its delay.
-- name: FAIL [postgresql]
UPDATE zeroloss_message SET status = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN 'dead' ELSE 'pending' END,
  dead_at = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN statement_timestamp() END,
  available_at = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN zeroloss_message.available_at ELSE (statement_timestamp() + b.delay * interval '1 second') END,
  last_error = b.err, lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[], %(err)s::text[], %(delay)s::float8[]) AS b(mid, tok, err, delay)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz) AND zeroloss_message.lease_expires_at > clock_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  CASE WHEN status = 'dead' THEN 'dead_lettered' ELSE 'failed' END AS reason, last_error AS detail,
  queue_name, ordering_key, created_at

-- name: FAIL [sqlite]
UPDATE zeroloss_message SET status = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN 'dead' ELSE 'pending' END,
  dead_at = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END,
  available_at = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN zeroloss_message.available_at ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', b.delay)) END,
  last_error = b.err, lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok, json_extract(value, '$.err') AS err, json_extract(value, '$.delay') AS delay FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  CASE WHEN status = 'dead' THEN 'dead_lettered' ELSE 'failed' END AS reason, last_error AS detail,
  queue_name, ordering_key, created_at

-- name: FAIL_LOCKED [postgresql]
UPDATE zeroloss_message SET status = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN 'dead' ELSE 'pending' END,
  dead_at = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN statement_timestamp() END,
  available_at = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN zeroloss_message.available_at ELSE (statement_timestamp() + b.delay * interval '1 second') END,
  last_error = b.err, lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[], %(err)s::text[], %(delay)s::float8[]) AS b(mid, tok, err, delay)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  CASE WHEN status = 'dead' THEN 'dead_lettered' ELSE 'failed' END AS reason, last_error AS detail,
  queue_name, ordering_key, created_at

-- name: FAIL_LOCKED [sqlite]
UPDATE zeroloss_message SET status = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN 'dead' ELSE 'pending' END,
  dead_at = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END,
  available_at = CASE WHEN zeroloss_message.attempts >= zeroloss_message.max_attempts THEN zeroloss_message.available_at ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', b.delay)) END,
  last_error = b.err, lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok, json_extract(value, '$.err') AS err, json_extract(value, '$.delay') AS delay FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  CASE WHEN status = 'dead' THEN 'dead_lettered' ELSE 'failed' END AS reason, last_error AS detail,
  queue_name, ordering_key, created_at

-- The handler raised zeroloss.Fail (or an error its retry policy does not retry): dead at once.
-- name: FAIL_FINAL [postgresql]
UPDATE zeroloss_message SET status = 'dead', dead_at = statement_timestamp(), last_error = b.err,
  lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[], %(err)s::text[]) AS b(mid, tok, err)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz) AND zeroloss_message.lease_expires_at > clock_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'dead_lettered_by_handler' AS reason, last_error AS detail, queue_name, ordering_key, created_at

-- name: FAIL_FINAL [sqlite]
UPDATE zeroloss_message SET status = 'dead', dead_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  last_error = b.err, lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok, json_extract(value, '$.err') AS err FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'dead_lettered_by_handler' AS reason, last_error AS detail, queue_name, ordering_key, created_at

-- name: FAIL_FINAL_LOCKED [postgresql]
UPDATE zeroloss_message SET status = 'dead', dead_at = statement_timestamp(), last_error = b.err,
  lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[], %(err)s::text[]) AS b(mid, tok, err)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'dead_lettered_by_handler' AS reason, last_error AS detail, queue_name, ordering_key, created_at

-- name: FAIL_FINAL_LOCKED [sqlite]
UPDATE zeroloss_message SET status = 'dead', dead_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  last_error = b.err, lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok, json_extract(value, '$.err') AS err FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'dead_lettered_by_handler' AS reason, last_error AS detail, queue_name, ordering_key, created_at

-- The handler raised zeroloss.Snooze: pending again after its delay, the attempt not counted;
-- last_error is left as it was (a snooze is no error). Its audit detail is a parameter: a
-- batch of snoozes runs one statement per detail.
-- name: SNOOZE [postgresql]
UPDATE zeroloss_message SET status = 'pending', attempts = zeroloss_message.attempts - 1,
  available_at = (statement_timestamp() + b.delay * interval '1 second'), lease_token = NULL,
  lease_expires_at = NULL, started_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[], %(delay)s::float8[]) AS b(mid, tok, delay)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz) AND zeroloss_message.lease_expires_at > clock_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'snoozed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: SNOOZE [sqlite]
UPDATE zeroloss_message SET status = 'pending', attempts = zeroloss_message.attempts - 1,
  available_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', b.delay)),
  lease_token = NULL, lease_expires_at = NULL, started_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok, json_extract(value, '$.delay') AS delay FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'snoozed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: SNOOZE_LOCKED [postgresql]
UPDATE zeroloss_message SET status = 'pending', attempts = zeroloss_message.attempts - 1,
  available_at = (statement_timestamp() + b.delay * interval '1 second'), lease_token = NULL,
  lease_expires_at = NULL, started_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[], %(delay)s::float8[]) AS b(mid, tok, delay)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'snoozed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: SNOOZE_LOCKED [sqlite]
UPDATE zeroloss_message SET status = 'pending', attempts = zeroloss_message.attempts - 1,
  available_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', b.delay)),
  lease_token = NULL, lease_expires_at = NULL, started_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok, json_extract(value, '$.delay') AS delay FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'snoozed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- A lease given back unprocessed (a worker stopping): pending now, the attempt not counted.
-- name: RELEASE [postgresql]
UPDATE zeroloss_message SET status = 'pending', attempts = zeroloss_message.attempts - 1,
  available_at = statement_timestamp(), lease_token = NULL, lease_expires_at = NULL, started_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[]) AS b(mid, tok)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz) AND zeroloss_message.lease_expires_at > clock_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'released' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: RELEASE [sqlite]
UPDATE zeroloss_message SET status = 'pending', attempts = zeroloss_message.attempts - 1,
  available_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), lease_token = NULL, lease_expires_at = NULL,
  started_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'released' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- How often each message was snoozed (its audit rows say). Not fenced: SNOOZE is, and only
-- the lease holder can add a snooze.
-- name: SNOOZE_COUNTS [postgresql]
SELECT zeroloss_message.message_id, (SELECT count(*) FROM zeroloss_messageevent e
WHERE e.message_id = zeroloss_message.id AND e.reason = 'snoozed') FROM zeroloss_message, unnest(%(mid)s::text[]) AS b(mid) WHERE zeroloss_message.message_id = b.mid

-- name: SNOOZE_COUNTS [sqlite]
SELECT zeroloss_message.message_id, (SELECT count(*) FROM zeroloss_messageevent e
WHERE e.message_id = zeroloss_message.id AND e.reason = 'snoozed') FROM zeroloss_message, (SELECT value AS mid FROM json_each(%(mid)s)) AS b WHERE zeroloss_message.message_id = b.mid
