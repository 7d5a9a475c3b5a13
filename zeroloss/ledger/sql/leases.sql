-- Leases beside their claims (sql/claims.sql) and outcomes (sql/outcomes.sql), part of the
-- ledger's catalogue (zeroloss.ledger.statements_leases): their renewals and revival, the
-- release of a lost claim's leases, what a lease holder reads, its transactions' settings
-- (PostgreSQL), and what the sweep and an idle worker ask. Read by
-- zeroloss.ledger.catalogue; run as written.

-- The attempt a lease holder is on (its failure's backoff depends on it); fenced.
-- name: LEASED_ATTEMPT
SELECT attempts FROM zeroloss_message WHERE message_id = %(mid)s AND lease_token = %(tok)s AND status = 'processing'

-- A transactional batch locks its rows, fenced, before running any handler (PostgreSQL:
-- bounded below by the day of the batch's earliest message, as the outcomes are).
-- name: LOCK_HELD [postgresql]
SELECT zeroloss_message.message_id
FROM zeroloss_message, unnest(%(mid)s::text[], %(tok)s::uuid[]) AS b(mid, tok)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.lease_expires_at > clock_timestamp()
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)
ORDER BY zeroloss_message.id FOR UPDATE OF zeroloss_message

-- name: LOCK_HELD [sqlite]
SELECT zeroloss_message.message_id
FROM zeroloss_message, (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok
                        FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
ORDER BY zeroloss_message.id

-- Did this actor's transition land? (asked after a commit whose outcome was lost): its
-- outcomes' audit rows for the leases' messages and attempts.
-- name: OWN_EVENTS [postgresql]
SELECT m.message_id, e.reason
FROM zeroloss_messageevent e
JOIN zeroloss_message m ON m.id = e.message_id
JOIN unnest(%(mid)s::text[], %(att)s::int[]) AS b(mid, att) ON m.message_id = b.mid AND e.attempt = b.att
WHERE e.actor = %(actor)s
  AND e.reason IN ('acknowledged', 'failed', 'dead_lettered', 'released', 'aborted', 'snoozed', 'dead_lettered_by_handler')

-- name: OWN_EVENTS [sqlite]
SELECT m.message_id, e.reason
FROM zeroloss_messageevent e
JOIN zeroloss_message m ON m.id = e.message_id
JOIN (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.att') AS att FROM json_each(%(rows)s)) AS b
  ON m.message_id = b.mid AND e.attempt = b.att
WHERE e.actor = %(actor)s
  AND e.reason IN ('acknowledged', 'failed', 'dead_lettered', 'released', 'aborted', 'snoozed', 'dead_lettered_by_handler')

-- The keeper's renewal of live leases: ``ttl`` seconds from the database clock when each row
-- is taken, fenced by the token, the status and an unexpired lease, re-checked under the
-- row's lock. It never waits for a row lock: a row locked elsewhere (a transactional batch
-- recording its outcome, an operator's move) is skipped, and RENEW_BUSY tells it apart from a
-- lease that is lost. PostgreSQL: bounded below by the day of the batch's earliest message
-- (created_from, as the outcomes); ARRAY(...) runs the locking subquery once.
-- name: RENEW [postgresql]
UPDATE zeroloss_message SET lease_expires_at = (clock_timestamp() + %(ttl)s * interval '1 second'),
  updated_at = clock_timestamp()
WHERE id = ANY(ARRAY(
    SELECT zeroloss_message.id
    FROM zeroloss_message, unnest(%(mid)s::text[], %(tok)s::uuid[]) AS b(mid, tok)
    WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
      AND zeroloss_message.status = 'processing' AND zeroloss_message.lease_expires_at > clock_timestamp()
      AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)
    FOR UPDATE OF zeroloss_message SKIP LOCKED))
  AND status = 'processing' AND lease_expires_at > clock_timestamp()
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)
RETURNING message_id

-- name: RENEW [sqlite]
UPDATE zeroloss_message SET lease_expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(ttl)s)),
  updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id IN (
    SELECT zeroloss_message.id
    FROM zeroloss_message, (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok FROM json_each(%(rows)s)) AS b
    WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
      AND zeroloss_message.status = 'processing' AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
  AND status = 'processing' AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
RETURNING message_id

-- Of leases a renewal skipped, those still held and unexpired: locked elsewhere, not lost.
-- name: RENEW_BUSY [postgresql]
SELECT zeroloss_message.message_id
FROM zeroloss_message, unnest(%(mid)s::text[], %(tok)s::uuid[]) AS b(mid, tok)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.lease_expires_at > clock_timestamp()
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)

-- name: RENEW_BUSY [sqlite]
SELECT zeroloss_message.message_id
FROM zeroloss_message, (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')

-- The revival of leases that ran out while nobody else took them: a claim whose commit took
-- longer than its lease (an fsync stall) hands its worker leases already expired by the
-- database clock, before any handler ran. Fenced by the token (any other claim drew a new
-- one; the sweep and every outcome clear it) and the status, under the row's lock, NOT by the
-- expiry: a row still processing under this worker's token has had no other holder since its
-- claim. An aborted message is left to the sweep, which cancels it. It waits for a row lock
-- (the sweep's requeue, an operator's move): the one that commits first decides, and this
-- statement re-checks its fences on the row as that one left it. Its worker runs no handler
-- before it commits; a lease it revives runs ``ttl`` seconds from the clock when the row is
-- taken, like any renewal's.
-- name: REVIVE [postgresql]
UPDATE zeroloss_message SET lease_expires_at = (clock_timestamp() + %(ttl)s * interval '1 second'),
  updated_at = clock_timestamp()
FROM unnest(%(mid)s::text[], %(tok)s::uuid[]) AS b(mid, tok)
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
  AND zeroloss_message.created_at >= CAST(%(created_from)s AS timestamptz)
RETURNING message_id

-- name: REVIVE [sqlite]
UPDATE zeroloss_message SET lease_expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(ttl)s)),
  updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.tok') AS tok FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.message_id = b.mid AND zeroloss_message.lease_token = b.tok
  AND zeroloss_message.status = 'processing' AND zeroloss_message.abort_requested_at IS NULL
RETURNING message_id

-- A claim whose commit outcome was lost with its connection: give back whatever this claimer
-- (``owner``) holds, unexpired, that it does not know of (``tok``: the tokens it holds; it
-- cannot know the lost claim's). The attempt is not counted. An expired lease is the sweep's,
-- which counts it.
-- name: RELEASE_UNKNOWN [postgresql]
UPDATE zeroloss_message SET status = 'pending', attempts = attempts - 1, available_at = statement_timestamp(),
  lease_token = NULL, lease_expires_at = NULL, started_at = NULL, updated_at = statement_timestamp()
WHERE status = 'processing' AND claimed_by = %(owner)s AND lease_expires_at > statement_timestamp()
  AND NOT EXISTS (SELECT 1 FROM unnest(%(tok)s::uuid[]) AS b(tok) WHERE b.tok = lease_token)
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'released' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: RELEASE_UNKNOWN [sqlite]
UPDATE zeroloss_message SET status = 'pending', attempts = attempts - 1,
  available_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), lease_token = NULL, lease_expires_at = NULL,
  started_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE status = 'processing' AND claimed_by = %(owner)s AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
  AND NOT EXISTS (SELECT 1 FROM (SELECT json_extract(value, '$.tok') AS tok FROM json_each(%(rows)s)) AS b WHERE b.tok = lease_token)
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  'released' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- The earliest available_at of the queues' pending messages, and the clock: how long an idle
-- worker may sleep (each queue one probe of the claim index, as an empty claim is).
-- name: NEXT_AVAILABLE [postgresql]
SELECT min(n.at), statement_timestamp()
FROM (SELECT (SELECT min(available_at) FROM zeroloss_message
              WHERE status = 'pending' AND queue_name = b.q AND available_at IS NOT NULL) AS at
      FROM unnest(%(queues)s::text[]) AS b(q)) n

-- name: NEXT_AVAILABLE [sqlite]
SELECT min(n.at), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT (SELECT min(available_at) FROM zeroloss_message
              WHERE status = 'pending' AND queue_name = b.q AND available_at IS NOT NULL) AS at
      FROM (SELECT value AS q FROM json_each(%(queues)s)) AS b) n

-- Whether any lease expired (SQLite's sweep looks with a read before it takes the write lock).
-- name: ANY_EXPIRED [postgresql]
SELECT 1 FROM zeroloss_message WHERE status = 'processing' AND lease_expires_at < statement_timestamp() LIMIT 1

-- name: ANY_EXPIRED [sqlite]
SELECT 1 FROM zeroloss_message WHERE status = 'processing' AND lease_expires_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') LIMIT 1

-- ---------------------------------------------------------------------------------------
-- The lease holder's transactions (PostgreSQL; SQLite tells from its client).

-- A transactional batch's transaction: opened with a guard row that only zeroloss's own
-- commit may commit (a handler's raw COMMIT fails on it), and with the server-side bounds
-- derived from HANDLER_TIMEOUT (``bound`` milliseconds as text, ``bound_ms`` as a number;
-- 0: none); closed by BATCH_CLOSE, which authorises the commit and says whether the
-- transaction is still the one BATCH_OPEN began (a handler's raw ROLLBACK or COMMIT ended it
-- otherwise).
-- name: BATCH_OPEN [postgresql]
INSERT INTO zeroloss_batch_guard (txid) VALUES (txid_current())
RETURNING txid, pg_backend_pid(),
  CASE WHEN %(bound_ms)s > 0 THEN set_config('idle_in_transaction_session_timeout', %(bound)s, true) END,
  CASE WHEN %(bound_ms)s > 0 THEN set_config('statement_timeout', %(bound)s, true) END

-- name: BATCH_CLOSE [postgresql]
WITH d AS (DELETE FROM zeroloss_batch_guard WHERE txid = txid_current() RETURNING txid)
SELECT (SELECT txid FROM d), set_config('zeroloss.batch_commit', txid_current()::text, true)

-- Bounds an idle gap of one of zeroloss's own multi-statement transactions (milliseconds).
-- name: BOUND_TRANSACTION [postgresql]
SELECT set_config('idle_in_transaction_session_timeout', %(bound)s, true)

-- A claim by queue reads each of its ranges in the claim index's order and stops at its
-- LIMIT; across partitions that order is a merge of their index scans. Beside a period of
-- many retained messages the planner estimates a queue's pending rows as one or two (queue,
-- status and time taken as independent) and sorts every pending message after the claim's
-- position instead: 14 ms a claim with 3 million retained and 14,000 pending, 0.3 ms merged
-- (docs/scaling.md). So the claim's transaction plans without sorts, and without JIT
-- compilation (a range the planner knows is empty still takes a sort, which then costs
-- enough to compile the statement: tens of milliseconds a claim); for that transaction only
-- (true: nothing outlives it, safe behind a transaction pooler). The settings before are
-- returned for UNPLAN_CLAIM; an idle gap is bounded as BOUND_TRANSACTION does (0: not).
-- name: PLAN_CLAIM [postgresql]
SELECT current_setting('enable_sort'), current_setting('jit'), set_config('enable_sort', 'off', true),
  set_config('jit', 'off', true),
  CASE WHEN %(bound_ms)s > 0 THEN set_config('idle_in_transaction_session_timeout', %(bound)s, true) END

-- name: UNPLAN_CLAIM [postgresql]
SELECT set_config('enable_sort', %(enable_sort)s, true), set_config('jit', %(jit)s, true)

-- A session of ours that may still be running a statement whose outcome we lost (a network
-- cut: the server has not noticed). End it, and wait until it is gone, before acting on what
-- it may have committed.
-- name: END_SESSION [postgresql]
SELECT pg_terminate_backend(%(pid)s)

-- name: SESSION_ALIVE [postgresql]
SELECT count(*) FROM pg_stat_activity WHERE pid = %(pid)s
