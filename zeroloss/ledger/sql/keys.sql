-- Ordering keys (zeroloss.ledger.statements, part of the ledger's catalogue): what blocks a
-- key, a key's head, and the sweep's repairs. A key's head is its one claimable or processing
-- message: ordering_key <> '' AND status IN ('pending', 'processing') AND available_at IS NOT
-- NULL. The promotions (PROMOTE, PROMOTE_CLAIMING_HEAD, PROMOTE_FINISHED) are still templates
-- in statements.py.

-- What blocks a key: for each (queue, key) with messages waiting behind a head, that head (if
-- it has one) and the database clock. Read from the waiting index, then one probe of the
-- one-head index per key. Blocked: the head is processing, backing off before a retry, or
-- missing. BLOCKED_KEYS_OF_QUEUE: of one queue.
-- name: BLOCKED_KEYS [postgresql]
SELECT w.queue_name, w.ordering_key, w.waiting, w.waiting_since, h.message_id, h.status, h.attempts, h.max_attempts,
       h.claimed_by, h.started_at, h.updated_at, h.available_at, h.lease_expires_at, h.last_error, statement_timestamp()
FROM (SELECT queue_name, ordering_key, count(*) AS waiting, min(updated_at) AS waiting_since FROM zeroloss_message
      WHERE status = 'pending' AND available_at IS NULL GROUP BY queue_name, ordering_key) w
LEFT JOIN zeroloss_message h ON h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key
  AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL
WHERE h.id IS NULL OR h.status = 'processing' OR h.available_at > statement_timestamp()
ORDER BY COALESCE(CASE WHEN h.status = 'processing' THEN h.started_at ELSE h.updated_at END, w.waiting_since),
  w.queue_name, w.ordering_key
LIMIT %(limit)s

-- name: BLOCKED_KEYS [sqlite]
SELECT w.queue_name, w.ordering_key, w.waiting, w.waiting_since, h.message_id, h.status, h.attempts, h.max_attempts,
       h.claimed_by, h.started_at, h.updated_at, h.available_at, h.lease_expires_at, h.last_error,
       strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT queue_name, ordering_key, count(*) AS waiting, min(updated_at) AS waiting_since FROM zeroloss_message
      WHERE status = 'pending' AND available_at IS NULL GROUP BY queue_name, ordering_key) w
LEFT JOIN zeroloss_message h ON h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key
  AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL
WHERE h.id IS NULL OR h.status = 'processing' OR h.available_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
ORDER BY COALESCE(CASE WHEN h.status = 'processing' THEN h.started_at ELSE h.updated_at END, w.waiting_since),
  w.queue_name, w.ordering_key
LIMIT %(limit)s

-- name: BLOCKED_KEYS_OF_QUEUE [postgresql]
SELECT w.queue_name, w.ordering_key, w.waiting, w.waiting_since, h.message_id, h.status, h.attempts, h.max_attempts,
       h.claimed_by, h.started_at, h.updated_at, h.available_at, h.lease_expires_at, h.last_error, statement_timestamp()
FROM (SELECT queue_name, ordering_key, count(*) AS waiting, min(updated_at) AS waiting_since FROM zeroloss_message
      WHERE status = 'pending' AND available_at IS NULL AND queue_name = %(queue)s GROUP BY queue_name, ordering_key) w
LEFT JOIN zeroloss_message h ON h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key
  AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL
WHERE h.id IS NULL OR h.status = 'processing' OR h.available_at > statement_timestamp()
ORDER BY COALESCE(CASE WHEN h.status = 'processing' THEN h.started_at ELSE h.updated_at END, w.waiting_since),
  w.queue_name, w.ordering_key
LIMIT %(limit)s

-- name: BLOCKED_KEYS_OF_QUEUE [sqlite]
SELECT w.queue_name, w.ordering_key, w.waiting, w.waiting_since, h.message_id, h.status, h.attempts, h.max_attempts,
       h.claimed_by, h.started_at, h.updated_at, h.available_at, h.lease_expires_at, h.last_error,
       strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT queue_name, ordering_key, count(*) AS waiting, min(updated_at) AS waiting_since FROM zeroloss_message
      WHERE status = 'pending' AND available_at IS NULL AND queue_name = %(queue)s GROUP BY queue_name, ordering_key) w
LEFT JOIN zeroloss_message h ON h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key
  AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL
WHERE h.id IS NULL OR h.status = 'processing' OR h.available_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
ORDER BY COALESCE(CASE WHEN h.status = 'processing' THEN h.started_at ELSE h.updated_at END, w.waiting_since),
  w.queue_name, w.ordering_key
LIMIT %(limit)s

-- One key, blocked or not (one row even when the key has no message at all).
-- name: KEY_HEAD [postgresql]
SELECT w.queue_name, w.ordering_key, w.waiting, w.waiting_since, h.message_id, h.status, h.attempts, h.max_attempts,
       h.claimed_by, h.started_at, h.updated_at, h.available_at, h.lease_expires_at, h.last_error, statement_timestamp()
FROM (SELECT CAST(%(queue)s AS TEXT) AS queue_name, CAST(%(key)s AS TEXT) AS ordering_key, count(*) AS waiting,
             min(updated_at) AS waiting_since FROM zeroloss_message
      WHERE status = 'pending' AND available_at IS NULL AND queue_name = %(queue)s AND ordering_key = %(key)s) w
LEFT JOIN zeroloss_message h ON h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key
  AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL

-- name: KEY_HEAD [sqlite]
SELECT w.queue_name, w.ordering_key, w.waiting, w.waiting_since, h.message_id, h.status, h.attempts, h.max_attempts,
       h.claimed_by, h.started_at, h.updated_at, h.available_at, h.lease_expires_at, h.last_error,
       strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT CAST(%(queue)s AS TEXT) AS queue_name, CAST(%(key)s AS TEXT) AS ordering_key, count(*) AS waiting,
             min(updated_at) AS waiting_since FROM zeroloss_message
      WHERE status = 'pending' AND available_at IS NULL AND queue_name = %(queue)s AND ordering_key = %(key)s) w
LEFT JOIN zeroloss_message h ON h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key
  AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL

-- The head of one key, locked until the operator's move on it commits (PostgreSQL; SQLite's
-- transaction holds the database's one write lock).
-- name: KEY_HEAD_LOCK [postgresql]
SELECT message_id, status FROM zeroloss_message
WHERE queue_name = %(queue)s AND ordering_key = %(key)s
  AND ordering_key <> '' AND status IN ('pending', 'processing') AND available_at IS NOT NULL
FOR UPDATE OF zeroloss_message

-- name: KEY_HEAD_LOCK [sqlite]
SELECT message_id, status FROM zeroloss_message
WHERE queue_name = %(queue)s AND ordering_key = %(key)s
  AND ordering_key <> '' AND status IN ('pending', 'processing') AND available_at IS NOT NULL

-- ---------------------------------------------------------------------------------------
-- The sweep's repairs.

-- Its safety net: keys whose head finished while no promotion could see their next message
-- (a process died between commit and promotion). Waiting rows younger than ``after``
-- (negative seconds) are left to their own sender's promotion.
-- name: REPAIR_KEYS [postgresql]
SELECT DISTINCT w.queue_name, w.ordering_key FROM zeroloss_message w
WHERE w.status = 'pending' AND w.available_at IS NULL
  AND w.updated_at < (statement_timestamp() + %(after)s * interval '1 second')
  AND NOT EXISTS (SELECT 1 FROM zeroloss_message h WHERE h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key
                  AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL)
LIMIT %(limit)s

-- name: REPAIR_KEYS [sqlite]
SELECT DISTINCT w.queue_name, w.ordering_key FROM zeroloss_message w
WHERE w.status = 'pending' AND w.available_at IS NULL
  AND w.updated_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(after)s))
  AND NOT EXISTS (SELECT 1 FROM zeroloss_message h WHERE h.queue_name = w.queue_name AND h.ordering_key = w.ordering_key
                  AND h.ordering_key <> '' AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL)
LIMIT %(limit)s

-- A key whose head row outlived its head (its status changed outside the ledger's
-- statements): the keys' rows locked first, then, in a statement whose snapshot is taken
-- after the locks were granted (so that it sees every promotion that committed before),
-- those naming no head deleted, so that a promotion can take them.
-- name: HEAD_LOCK [postgresql]
SELECT id FROM zeroloss_ordering_head
WHERE queue_name || ' ' || ordering_key IN (SELECT b.q || ' ' || b.k FROM unnest(%(q)s::text[], %(k)s::text[]) AS b(q, k))
FOR UPDATE

-- name: HEAD_LOCK [sqlite]
SELECT id FROM zeroloss_ordering_head
WHERE queue_name || ' ' || ordering_key IN (
  SELECT b.q || ' ' || b.k FROM (SELECT json_extract(value, '$.q') AS q, json_extract(value, '$.k') AS k
                                 FROM json_each(%(rows)s)) AS b)

-- name: HEAD_STALE [postgresql]
DELETE FROM zeroloss_ordering_head
WHERE queue_name || ' ' || ordering_key IN (SELECT b.q || ' ' || b.k FROM unnest(%(q)s::text[], %(k)s::text[]) AS b(q, k))
  AND NOT EXISTS (SELECT 1 FROM zeroloss_message m WHERE m.id = zeroloss_ordering_head.message_pk
                  AND m.ordering_key <> '' AND m.status IN ('pending', 'processing') AND m.available_at IS NOT NULL)

-- name: HEAD_STALE [sqlite]
DELETE FROM zeroloss_ordering_head
WHERE queue_name || ' ' || ordering_key IN (
  SELECT b.q || ' ' || b.k FROM (SELECT json_extract(value, '$.q') AS q, json_extract(value, '$.k') AS k
                                 FROM json_each(%(rows)s)) AS b)
  AND NOT EXISTS (SELECT 1 FROM zeroloss_message m WHERE m.id = zeroloss_ordering_head.message_pk
                  AND m.ordering_key <> '' AND m.status IN ('pending', 'processing') AND m.available_at IS NOT NULL)
