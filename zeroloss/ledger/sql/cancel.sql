-- Cancel and abort by an operator (zeroloss.ledger.statements_cancel, part of the ledger's
-- catalogue), in chunks of ids (``ids``). A pending message is cancelled at once. A
-- processing one is not moved: an abort request is recorded on it (an annotation audit row:
-- it stays processing); its worker polls for it, and the fenced outcome statements record
-- nothing but cancelled for it. The RETURNING columns name each move's declared edge (see
-- sql/operator.sql).

-- Pending (claimable, delayed, or waiting behind its ordering key's head) -> cancelled.
-- name: CANCEL [postgresql]
UPDATE zeroloss_message SET status = 'cancelled', updated_at = statement_timestamp()
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid)) AND status = 'pending'
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'cancelled_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: CANCEL [sqlite]
UPDATE zeroloss_message SET status = 'cancelled', updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(ids)s)) AS b) AND status = 'pending'
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'cancelled_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- An abort request recorded on a processing message (an annotation: it stays processing).
-- name: ABORT_REQUEST [postgresql]
UPDATE zeroloss_message SET abort_requested_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid)) AND status = 'processing'
  AND abort_requested_at IS NULL
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'abort_requested' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: ABORT_REQUEST [sqlite]
UPDATE zeroloss_message SET abort_requested_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(ids)s)) AS b) AND status = 'processing'
  AND abort_requested_at IS NULL
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'abort_requested' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- What the cancel command reports for the ids it did not move.
-- name: STATUS_OF [postgresql]
SELECT message_id, status, abort_requested_at FROM zeroloss_message
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid))

-- name: STATUS_OF [sqlite]
SELECT message_id, status, abort_requested_at FROM zeroloss_message
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(ids)s)) AS b)

-- ---------------------------------------------------------------------------------------
-- The lease holder's side (fenced like its other outcomes; see sql/outcomes.sql).

-- The lease keeper: which of the leases in hand have an abort request.
-- name: ABORTS_REQUESTED [postgresql]
SELECT zeroloss_message.message_id FROM zeroloss_message, unnest(%(mid)s::text[], %(tok)s::uuid[]) AS b(mid, tok)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok AND zeroloss_message.status = 'processing'
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz) AND zeroloss_message.abort_requested_at IS NOT NULL

-- name: ABORTS_REQUESTED [sqlite]
SELECT zeroloss_message.message_id FROM zeroloss_message, (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NOT NULL

-- The lease holder's outcome of an aborted message (CANCEL_ABORTED_LOCKED: inside a
-- transactional batch whose rows this transaction locked, as ACK_LOCKED).
-- name: CANCEL_ABORTED [postgresql]
UPDATE zeroloss_message SET status = 'cancelled', lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[]) AS b(mid, tok)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok AND zeroloss_message.status = 'processing'
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)
  AND zeroloss_message.abort_requested_at IS NOT NULL AND zeroloss_message.lease_expires_at > clock_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'aborted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: CANCEL_ABORTED [sqlite]
UPDATE zeroloss_message SET status = 'cancelled', lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NOT NULL AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'aborted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: CANCEL_ABORTED_LOCKED [postgresql]
UPDATE zeroloss_message SET status = 'cancelled', lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[]) AS b(mid, tok)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok AND zeroloss_message.status = 'processing'
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz) AND zeroloss_message.abort_requested_at IS NOT NULL
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'aborted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: CANCEL_ABORTED_LOCKED [sqlite]
UPDATE zeroloss_message SET status = 'cancelled', lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NOT NULL
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'aborted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at
