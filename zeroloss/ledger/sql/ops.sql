-- The operator's bulk statements outside the moves (zeroloss.ledger.statements_ops): the
-- purge, the payload sizes that bound management batches, a maintenance duty's turn, and
-- the sessions of idle workers. Read by zeroloss.ledger.catalogue; run as written.

-- ---------------------------------------------------------------------------------------
-- The purge: the oldest finished messages of a status, by the time of their last move (a
-- cancelled message's last move is its cancellation: nothing moves it after), ``age``
-- seconds before the database clock at most; of one queue (_OF_QUEUE), or of every queue
-- but those with a retention of their own (_EXCEPT_QUEUES: a batch of names). A workflow's
-- steps are not picked: a workflow goes whole (zeroloss.ledger.workflow_retention).
-- PostgreSQL locks what it picks, skipping what another purge holds; SQLite's purge holds
-- the database's one write lock.

-- name: PURGE_PICK_COMPLETED [postgresql]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND completed_at < (statement_timestamp() + %(age)s * interval '1 second')
ORDER BY completed_at LIMIT %(size)s FOR UPDATE SKIP LOCKED

-- name: PURGE_PICK_COMPLETED [sqlite]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND completed_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))
ORDER BY completed_at LIMIT %(size)s

-- name: PURGE_PICK_COMPLETED_OF_QUEUE [postgresql]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND completed_at < (statement_timestamp() + %(age)s * interval '1 second')
  AND queue_name = %(queue)s
ORDER BY completed_at LIMIT %(size)s FOR UPDATE SKIP LOCKED

-- name: PURGE_PICK_COMPLETED_OF_QUEUE [sqlite]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND completed_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))
  AND queue_name = %(queue)s
ORDER BY completed_at LIMIT %(size)s

-- name: PURGE_PICK_COMPLETED_EXCEPT_QUEUES [postgresql]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND completed_at < (statement_timestamp() + %(age)s * interval '1 second')
  AND queue_name NOT IN (SELECT b.q FROM unnest(%(queues)s::text[]) AS b(q))
ORDER BY completed_at LIMIT %(size)s FOR UPDATE SKIP LOCKED

-- name: PURGE_PICK_COMPLETED_EXCEPT_QUEUES [sqlite]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND completed_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))
  AND queue_name NOT IN (SELECT b.q FROM (SELECT value AS q FROM json_each(%(queues)s)) AS b)
ORDER BY completed_at LIMIT %(size)s

-- name: PURGE_PICK_DEAD [postgresql]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND dead_at < (statement_timestamp() + %(age)s * interval '1 second')
ORDER BY dead_at LIMIT %(size)s FOR UPDATE SKIP LOCKED

-- name: PURGE_PICK_DEAD [sqlite]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND dead_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))
ORDER BY dead_at LIMIT %(size)s

-- name: PURGE_PICK_DEAD_OF_QUEUE [postgresql]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND dead_at < (statement_timestamp() + %(age)s * interval '1 second')
  AND queue_name = %(queue)s
ORDER BY dead_at LIMIT %(size)s FOR UPDATE SKIP LOCKED

-- name: PURGE_PICK_DEAD_OF_QUEUE [sqlite]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND dead_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))
  AND queue_name = %(queue)s
ORDER BY dead_at LIMIT %(size)s

-- name: PURGE_PICK_DEAD_EXCEPT_QUEUES [postgresql]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND dead_at < (statement_timestamp() + %(age)s * interval '1 second')
  AND queue_name NOT IN (SELECT b.q FROM unnest(%(queues)s::text[]) AS b(q))
ORDER BY dead_at LIMIT %(size)s FOR UPDATE SKIP LOCKED

-- name: PURGE_PICK_DEAD_EXCEPT_QUEUES [sqlite]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND dead_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))
  AND queue_name NOT IN (SELECT b.q FROM (SELECT value AS q FROM json_each(%(queues)s)) AS b)
ORDER BY dead_at LIMIT %(size)s

-- name: PURGE_PICK_CANCELLED [postgresql]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND updated_at < (statement_timestamp() + %(age)s * interval '1 second')
ORDER BY updated_at LIMIT %(size)s FOR UPDATE SKIP LOCKED

-- name: PURGE_PICK_CANCELLED [sqlite]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND updated_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))
ORDER BY updated_at LIMIT %(size)s

-- name: PURGE_PICK_CANCELLED_OF_QUEUE [postgresql]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND updated_at < (statement_timestamp() + %(age)s * interval '1 second')
  AND queue_name = %(queue)s
ORDER BY updated_at LIMIT %(size)s FOR UPDATE SKIP LOCKED

-- name: PURGE_PICK_CANCELLED_OF_QUEUE [sqlite]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND updated_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))
  AND queue_name = %(queue)s
ORDER BY updated_at LIMIT %(size)s

-- name: PURGE_PICK_CANCELLED_EXCEPT_QUEUES [postgresql]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND updated_at < (statement_timestamp() + %(age)s * interval '1 second')
  AND queue_name NOT IN (SELECT b.q FROM unnest(%(queues)s::text[]) AS b(q))
ORDER BY updated_at LIMIT %(size)s FOR UPDATE SKIP LOCKED

-- name: PURGE_PICK_CANCELLED_EXCEPT_QUEUES [sqlite]
SELECT id, queue_name FROM zeroloss_message
WHERE status = %(status)s AND workflow_id = '' AND updated_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))
  AND queue_name NOT IN (SELECT b.q FROM (SELECT value AS q FROM json_each(%(queues)s)) AS b)
ORDER BY updated_at LIMIT %(size)s

-- The picked messages deleted: their audit rows, their ids out of the key table
-- (models.MessageKey; empty on SQLite: a resend after the purge stores the message again,
-- as it did before the key table), then the messages.

-- name: PURGE_EVENTS [postgresql]
DELETE FROM zeroloss_messageevent WHERE message_id IN (SELECT b.id FROM unnest(%(ids)s::bigint[]) AS b(id))

-- name: PURGE_EVENTS [sqlite]
DELETE FROM zeroloss_messageevent WHERE message_id IN (SELECT b.id FROM (SELECT value AS id FROM json_each(%(ids)s)) AS b)

-- name: PURGE_KEYS [postgresql]
DELETE FROM zeroloss_message_key WHERE message_id IN (
  SELECT m.message_id FROM zeroloss_message m WHERE m.id IN (SELECT b.id FROM unnest(%(ids)s::bigint[]) AS b(id)))

-- name: PURGE_KEYS [sqlite]
DELETE FROM zeroloss_message_key WHERE message_id IN (
  SELECT m.message_id FROM zeroloss_message m WHERE m.id IN (SELECT b.id FROM (SELECT value AS id FROM json_each(%(ids)s)) AS b))

-- name: PURGE_MESSAGES [postgresql]
DELETE FROM zeroloss_message WHERE id IN (SELECT b.id FROM unnest(%(ids)s::bigint[]) AS b(id))

-- name: PURGE_MESSAGES [sqlite]
DELETE FROM zeroloss_message WHERE id IN (SELECT b.id FROM (SELECT value AS id FROM json_each(%(ids)s)) AS b)

-- ---------------------------------------------------------------------------------------
-- Payload sizes (bytes of the stored JSON text), for byte-bounded management batches: a
-- page of ``size`` after id ``after`` (of one queue), or of a batch of ids. PostgreSQL
-- detoasts the text server-side: nothing is sent.

-- name: PAYLOAD_SIZES [postgresql]
SELECT id, octet_length(payload::text) FROM zeroloss_message WHERE id > %(after)s ORDER BY id LIMIT %(size)s

-- name: PAYLOAD_SIZES [sqlite]
SELECT id, length(CAST(payload AS BLOB)) FROM zeroloss_message WHERE id > %(after)s ORDER BY id LIMIT %(size)s

-- name: PAYLOAD_SIZES_OF_QUEUE [postgresql]
SELECT id, octet_length(payload::text) FROM zeroloss_message
WHERE id > %(after)s AND queue_name = %(queue)s ORDER BY id LIMIT %(size)s

-- name: PAYLOAD_SIZES_OF_QUEUE [sqlite]
SELECT id, length(CAST(payload AS BLOB)) FROM zeroloss_message
WHERE id > %(after)s AND queue_name = %(queue)s ORDER BY id LIMIT %(size)s

-- name: PAYLOAD_SIZES_OF [postgresql]
SELECT id, octet_length(payload::text) FROM zeroloss_message
WHERE id IN (SELECT b.id FROM unnest(%(ids)s::bigint[]) AS b(id)) ORDER BY id

-- name: PAYLOAD_SIZES_OF [sqlite]
SELECT id, length(CAST(payload AS BLOB)) FROM zeroloss_message
WHERE id IN (SELECT b.id FROM (SELECT value AS id FROM json_each(%(ids)s)) AS b) ORDER BY id

-- ---------------------------------------------------------------------------------------
-- A maintenance duty's turn (models.MaintenanceTurn).

-- Taken when due, by ``holder`` for ``hold`` seconds: the holder's row if taken.
-- name: TAKE_TURN [postgresql]
INSERT INTO zeroloss_maintenance (name, holder, due_at)
VALUES (%(name)s, %(holder)s, (statement_timestamp() + %(hold)s * interval '1 second'))
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, due_at = excluded.due_at
WHERE zeroloss_maintenance.due_at <= statement_timestamp()
RETURNING holder

-- name: TAKE_TURN [sqlite]
INSERT INTO zeroloss_maintenance (name, holder, due_at)
VALUES (%(name)s, %(holder)s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(hold)s)))
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, due_at = excluded.due_at
WHERE zeroloss_maintenance.due_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING holder

-- Held longer, or left due again later: ``after`` seconds from now.
-- name: HOLD_TURN [postgresql]
UPDATE zeroloss_maintenance SET due_at = (statement_timestamp() + %(after)s * interval '1 second')
WHERE name = %(name)s AND holder = %(holder)s

-- name: HOLD_TURN [sqlite]
UPDATE zeroloss_maintenance SET due_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(after)s))
WHERE name = %(name)s AND holder = %(holder)s

-- ---------------------------------------------------------------------------------------
-- Sessions (PostgreSQL): idle workers' wake-up, dead peers.

-- The channel a moving statement's pg_notify sends a queue's name on.
-- name: LISTEN [postgresql]
LISTEN zeroloss_wakeup

-- TCP keepalive idle, interval and count, and the user timeout (ms), for this session.
-- name: KEEPALIVES [postgresql]
SELECT set_config('tcp_keepalives_idle', %(idle)s, false), set_config('tcp_keepalives_interval', %(interval)s, false),
  set_config('tcp_keepalives_count', %(count)s, false), set_config('tcp_user_timeout', %(user_timeout)s, false)
