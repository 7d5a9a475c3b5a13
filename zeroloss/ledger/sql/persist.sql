-- Around persisting (zeroloss.ledger.statements, part of the ledger's catalogue): the
-- database clock, deduplication windows, a duplicate's annotation, what a send stored.
-- The persisting statements themselves are in sql/inserts.sql.

-- The database clock: every lease time is computed from it, never from a worker's.
-- name: NOW [postgresql]
SELECT statement_timestamp()

-- name: NOW [sqlite]
SELECT strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')

-- When a message was stored (a batch's rows share one created_at).
-- name: CREATED_AT
SELECT created_at FROM zeroloss_message WHERE id = %(id)s

-- The stored rows of ids whose insert conflicted (a resent batch): one read a chunk.
-- name: STORED_ROWS [postgresql]
SELECT * FROM zeroloss_message WHERE message_id IN (SELECT b.mid FROM unnest(%(mid)s::text[]) AS b(mid))

-- name: STORED_ROWS [sqlite]
SELECT * FROM zeroloss_message WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(mid)s)) AS b)

-- A deduplication window (``window`` seconds): claimed when new or expired; otherwise it
-- names the first message.
-- name: DEDUP_CLAIM [postgresql]
INSERT INTO zeroloss_dedupkey (queue_name, dedup_key, message_id, expires_at, created_at)
VALUES (%(queue)s, %(dedup_key)s, %(mid)s, (statement_timestamp() + %(window)s * interval '1 second'), statement_timestamp())
ON CONFLICT (queue_name, dedup_key) DO UPDATE SET message_id = excluded.message_id, expires_at = excluded.expires_at,
  created_at = excluded.created_at
WHERE zeroloss_dedupkey.expires_at <= statement_timestamp()
RETURNING message_id

-- name: DEDUP_CLAIM [sqlite]
INSERT INTO zeroloss_dedupkey (queue_name, dedup_key, message_id, expires_at, created_at)
VALUES (%(queue)s, %(dedup_key)s, %(mid)s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(window)s)),
  strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
ON CONFLICT (queue_name, dedup_key) DO UPDATE SET message_id = excluded.message_id, expires_at = excluded.expires_at,
  created_at = excluded.created_at
WHERE zeroloss_dedupkey.expires_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING message_id

-- name: DEDUP_HOLDER
SELECT message_id FROM zeroloss_dedupkey WHERE queue_name = %(queue)s AND dedup_key = %(dedup_key)s

-- name: DEDUP_TAKE_OVER [postgresql]
UPDATE zeroloss_dedupkey SET message_id = %(mid)s, expires_at = (statement_timestamp() + %(window)s * interval '1 second'),
  created_at = statement_timestamp()
WHERE queue_name = %(queue)s AND dedup_key = %(dedup_key)s

-- name: DEDUP_TAKE_OVER [sqlite]
UPDATE zeroloss_dedupkey SET message_id = %(mid)s,
  expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(window)s)),
  created_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE queue_name = %(queue)s AND dedup_key = %(dedup_key)s

-- name: DEDUP_PURGE [postgresql]
DELETE FROM zeroloss_dedupkey WHERE expires_at < statement_timestamp()

-- name: DEDUP_PURGE [sqlite]
DELETE FROM zeroloss_dedupkey WHERE expires_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')

-- A duplicate absorbed by the first message's window: an annotation, not a transition (its
-- status is repeated; see states.ANNOTATIONS).
-- name: ABSORBED [postgresql]
INSERT INTO zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at)
SELECT id, status, status, 'duplicate_absorbed', %(actor)s, attempts, %(detail)s, statement_timestamp(), created_at
FROM zeroloss_message WHERE message_id = %(mid)s

-- name: ABSORBED [sqlite]
INSERT INTO zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at)
SELECT id, status, status, 'duplicate_absorbed', %(actor)s, attempts, %(detail)s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), created_at
FROM zeroloss_message WHERE message_id = %(mid)s

-- ---------------------------------------------------------------------------------------
-- The Celery transport's dispatch bookkeeping: no transition, no audit row.

-- Pending, available messages no live broker message is known to carry: never published for
-- longer than ``grace`` (negative seconds), changed since the last publish, or published
-- more than ``redispatch`` (negative seconds) ago and still unclaimed.
-- name: DISPATCH_CANDIDATES [postgresql]
SELECT message_id, queue_name FROM zeroloss_message
WHERE status = 'pending' AND available_at <= statement_timestamp()
  AND ((dispatched_at IS NULL AND updated_at < (statement_timestamp() + %(grace)s * interval '1 second'))
       OR dispatched_at < updated_at OR dispatched_at < (statement_timestamp() + %(redispatch)s * interval '1 second'))
ORDER BY priority DESC, available_at, id LIMIT %(limit)s

-- name: DISPATCH_CANDIDATES [sqlite]
SELECT message_id, queue_name FROM zeroloss_message
WHERE status = 'pending' AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
  AND ((dispatched_at IS NULL AND updated_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(grace)s)))
       OR dispatched_at < updated_at
       OR dispatched_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(redispatch)s)))
ORDER BY priority DESC, available_at, id LIMIT %(limit)s

-- name: MARK_DISPATCHED [postgresql]
UPDATE zeroloss_message SET dispatched_at = statement_timestamp()
WHERE message_id IN (SELECT b.mid FROM unnest(%(mid)s::text[]) AS b(mid))

-- name: MARK_DISPATCHED [sqlite]
UPDATE zeroloss_message SET dispatched_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(mid)s)) AS b)

-- name: MARK_UNDISPATCHED [postgresql]
UPDATE zeroloss_message SET dispatched_at = NULL WHERE message_id IN (SELECT b.mid FROM unnest(%(mid)s::text[]) AS b(mid))

-- name: MARK_UNDISPATCHED [sqlite]
UPDATE zeroloss_message SET dispatched_at = NULL
WHERE message_id IN (SELECT b.mid FROM (SELECT value AS mid FROM json_each(%(mid)s)) AS b)
