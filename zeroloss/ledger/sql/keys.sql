-- Ordering keys (zeroloss.ledger.statements, part of the ledger's catalogue): what blocks a
-- key, a key's head, and the sweep's repairs. A key's head is its one claimable or processing
-- message: ordering_key <> '' AND status IN ('pending', 'processing') AND available_at IS NOT
-- NULL.

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

-- ---------------------------------------------------------------------------------------
-- Promotions: release the next message of each listed key that has no head (nothing
-- claimable or processing). Run after every commit that may have left a key without one
-- (Ledger.promote_keys; SQLite's transitions after a move that finished a key's head).
--
-- PostgreSQL: a key's head held in zeroloss_ordering_head (models.OrderingHead). A partitioned
-- message table cannot have the one-head-per-key unique index, so a promotion claims the key's
-- row there first, in the same statement (``hn``; a conflict: the key has its head), and
-- releases only the message whose row it inserted; the statement finishing a head hands the
-- row to the next message, or deletes it when none waits (PROMOTE_FINISHED). A second head of a
-- key is then refused by that table's unique index, whatever the layout.
-- name: PROMOTE [postgresql]
WITH c AS (SELECT b.q, b.k,
                  (SELECT min(w.id) FROM zeroloss_message w
                   WHERE w.queue_name = b.q AND w.ordering_key = b.k AND w.status = 'pending'
                     AND w.available_at IS NULL) AS next
           FROM unnest(%(q)s::text[], %(k)s::text[]) AS b(q, k)
           WHERE NOT EXISTS (SELECT 1 FROM zeroloss_message h
                             WHERE h.queue_name = b.q AND h.ordering_key = b.k AND h.ordering_key <> ''
                               AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL)),
hn AS (INSERT INTO zeroloss_ordering_head (queue_name, ordering_key, message_pk, since)
       SELECT q, k, next, statement_timestamp() FROM c WHERE next IS NOT NULL
       ON CONFLICT (queue_name, ordering_key) DO NOTHING RETURNING message_pk)
UPDATE zeroloss_message SET available_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE id IN (SELECT message_pk FROM hn)
RETURNING message_id, queue_name, pg_notify('zeroloss_wakeup', queue_name)

-- SQLite: the message table's one-head-per-key unique index refuses a second head.
-- name: PROMOTE [sqlite]
UPDATE zeroloss_message SET available_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id IN (SELECT (SELECT min(w.id) FROM zeroloss_message w
                     WHERE w.queue_name = b.q AND w.ordering_key = b.k AND w.status = 'pending'
                       AND w.available_at IS NULL)
             FROM (SELECT json_extract(value, '$.q') AS q, json_extract(value, '$.k') AS k
                   FROM json_each(%(rows)s)) AS b
             WHERE NOT EXISTS (SELECT 1 FROM zeroloss_message h
                               WHERE h.queue_name = b.q AND h.ordering_key = b.k AND h.ordering_key <> ''
                                 AND h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL))
RETURNING message_id, queue_name

-- Not a statement: the CTEs PostgreSQL's audit wrapper (postgres.PostgresEngine.audit_wrapper) adds after
-- the audit rows of a move that may finish a key's head (its variant NAME+PROMOTE), for the
-- keys of the messages it finished (``t``: the moved rows, seen as they were). ``nx``: the next
-- message of each (none while another head is live); ``hn``: the head row handed to it (or
-- inserted where the key had none); ``hd``: the row of a finished head deleted where no message
-- waits; ``pr``: the next messages released.
-- name: PROMOTE_FINISHED [postgresql]
nx AS (SELECT t.queue_name AS q, t.ordering_key AS k, t.id AS old,
              CASE WHEN NOT EXISTS (SELECT 1 FROM zeroloss_message h
                                    WHERE h.queue_name = t.queue_name AND h.ordering_key = t.ordering_key
                                      AND h.ordering_key <> '' AND h.status IN ('pending', 'processing')
                                      AND h.available_at IS NOT NULL AND h.id NOT IN (SELECT id FROM t))
                   THEN (SELECT min(w.id) FROM zeroloss_message w
                         WHERE w.queue_name = t.queue_name AND w.ordering_key = t.ordering_key
                           AND w.status = 'pending' AND w.available_at IS NULL AND w.id NOT IN (SELECT id FROM t))
              END AS next
       FROM t WHERE t.ordering_key <> '' AND t.status IN ('completed', 'dead', 'cancelled')),
hn AS (INSERT INTO zeroloss_ordering_head (queue_name, ordering_key, message_pk, since)
       SELECT DISTINCT ON (q, k) q, k, next, statement_timestamp() FROM nx WHERE next IS NOT NULL
       ON CONFLICT (queue_name, ordering_key) DO UPDATE SET message_pk = excluded.message_pk, since = excluded.since
       WHERE zeroloss_ordering_head.message_pk IN (SELECT old FROM nx)
       RETURNING message_pk),
hd AS (DELETE FROM zeroloss_ordering_head h USING nx
       WHERE nx.next IS NULL AND h.queue_name = nx.q AND h.ordering_key = nx.k AND h.message_pk = nx.old),
pr AS (UPDATE zeroloss_message SET available_at = statement_timestamp(), updated_at = statement_timestamp()
       WHERE id IN (SELECT message_pk FROM hn)
       RETURNING message_id, pg_notify('zeroloss_wakeup', queue_name))

-- Tell idle workers of these queues, at commit, that messages became claimable (a move back
-- to pending; persisting and the promotions say it in their RETURNING).
-- name: WAKE [postgresql]
SELECT pg_notify('zeroloss_wakeup', q) FROM unnest(%(queues)s::text[]) AS q
