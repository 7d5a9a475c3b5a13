-- Claims and the recovery sweep (zeroloss.ledger.statements_leases, part of the ledger's
-- catalogue). Read by zeroloss.ledger.catalogue; run as written. Each is a moving statement:
-- its RETURNING columns name its declared edges (statements_leases.LEASE_MOVES), and the
-- engine writes each moved message's audit row from them, with the actor (PostgreSQL: in a
-- CTE around the statement, postgres.PostgresEngine.audit_wrapper; SQLite: in the same transaction).
--
-- Lease times always come from the database's clock: a lease is set with clock_timestamp()
-- (read when the row is written, after any wait for its lock), so a claim that waited for a
-- lock never hands out a lease that has already run out. ``ack_timeout``: the lease's seconds.

-- A claim by queue: up to ``limit`` pending, available messages, highest priority first, then
-- oldest; rows another claimer holds are skipped.
--
-- The claim index holds every version a claim moved out of it (one per message): while
-- anything holds the xmin horizon back (an idle transaction, a long report), none is removed,
-- and a claim that starts at the head of the queue visits them all, oldest first: at 800
-- msg/s, 48,000 a minute, each a heap visit (measured: 51 ms a claim after 90 s). So a claimer
-- starts where its previous claim ended: three ranges of the claim index, read in its order,
-- each only as far as the claim's LIMIT needs: higher priorities than the remembered one
-- (``priority``) from their head (exact priority order), the remembered priority from its
-- remembered ``since`` (an ``available_at`` rewound a little, for messages whose sending
-- transaction committed after a later one was claimed), then lower priorities from their
-- head. A priority below -100 (none is) with ``since`` NULL makes the first range the whole
-- queue: the claim from the head, which every claimer also makes every few seconds for what
-- committed further behind (leases.CLAIM_FROM_HEAD_EVERY).
--
-- The status is checked once, where the rows are chosen and locked (a row changed meanwhile
-- is checked again, locked): the UPDATE finds them by id alone. Checked again there, a
-- partition whose statistics predate its rows (a backlog sent since its last ANALYZE) was
-- planned to find them through every pending row of the partition (the status index,
-- rechecked for the ids): 45 ms a claim of 100 from 20,000 pending, 2 ms by id (EXPLAIN
-- ANALYZE).
--
-- PostgreSQL: ``created_at <= statement_timestamp()`` prunes the partitions of periods to come
-- (the sweep keeps PARTITIONS_AHEAD of them, all empty) when the statement starts; a row
-- visible to the claim was stored by a statement that began before it. ``id = ANY(ARRAY(...))``
-- evaluates the locking subquery exactly once; a plain IN (...) may be re-planned as a join
-- that re-runs it and locks more rows than its LIMIT. Run in a transaction planned by
-- PLAN_CLAIM (sql/leases.sql).
-- name: CLAIM [postgresql]
UPDATE zeroloss_message SET status = 'processing', attempts = attempts + 1, lease_token = gen_random_uuid(),
  lease_expires_at = (clock_timestamp() + %(ack_timeout)s * interval '1 second'), claimed_by = %(claimed_by)s,
  started_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = ANY(ARRAY(
    SELECT id FROM (
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s AND available_at <= statement_timestamp()
          AND zeroloss_message.created_at <= statement_timestamp() AND priority > %(priority)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) a
      UNION ALL
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s AND available_at <= statement_timestamp()
          AND zeroloss_message.created_at <= statement_timestamp() AND priority = %(priority)s
          AND available_at >= %(since)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) r
      UNION ALL
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s AND available_at <= statement_timestamp()
          AND zeroloss_message.created_at <= statement_timestamp() AND priority < %(priority)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) z
    ) c LIMIT %(limit)s))
  AND zeroloss_message.created_at <= statement_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'claimed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at,
  lease_token, lease_expires_at, payload, max_attempts, priority, headers, available_at, workflow_id

-- SQLite: one writer at a time, so the claim locks by writing (no row locks to skip).
-- name: CLAIM [sqlite]
UPDATE zeroloss_message SET status = 'processing', attempts = attempts + 1, lease_token = lower(hex(randomblob(16))),
  lease_expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(ack_timeout)s)),
  claimed_by = %(claimed_by)s, started_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id IN (
    SELECT id FROM (
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s
          AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') AND priority > %(priority)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s) a
      UNION ALL
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s
          AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') AND priority = %(priority)s
          AND available_at >= %(since)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s) r
      UNION ALL
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s
          AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') AND priority < %(priority)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s) z
    ) c LIMIT %(limit)s)
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'claimed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at,
  lease_token, lease_expires_at, payload, max_attempts, priority, headers, available_at, workflow_id

-- A claim of a queue under a concurrency limit, inside the transaction that locked the
-- queue's control row (control.py): CLAIM, claiming at most ``most`` (the limit) less what is
-- processing, counted in this statement (it starts after the lock was granted, so it sees
-- every earlier claim), and never more than ``limit``.
-- name: CLAIM_LIMITED [postgresql]
UPDATE zeroloss_message SET status = 'processing', attempts = attempts + 1, lease_token = gen_random_uuid(),
  lease_expires_at = (clock_timestamp() + %(ack_timeout)s * interval '1 second'), claimed_by = %(claimed_by)s,
  started_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = ANY(ARRAY(
    SELECT id FROM (
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s AND available_at <= statement_timestamp()
          AND zeroloss_message.created_at <= statement_timestamp() AND priority > %(priority)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) a
      UNION ALL
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s AND available_at <= statement_timestamp()
          AND zeroloss_message.created_at <= statement_timestamp() AND priority = %(priority)s
          AND available_at >= %(since)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) r
      UNION ALL
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s AND available_at <= statement_timestamp()
          AND zeroloss_message.created_at <= statement_timestamp() AND priority < %(priority)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) z
    ) c
    LIMIT (SELECT CASE WHEN r < 0 THEN 0 WHEN r > %(limit)s THEN %(limit)s ELSE r END
           FROM (SELECT %(most)s - count(*) AS r FROM zeroloss_message
                 WHERE queue_name = %(queue)s AND status = 'processing') room)))
  AND zeroloss_message.created_at <= statement_timestamp()
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'claimed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at,
  lease_token, lease_expires_at, payload, max_attempts, priority, headers, available_at, workflow_id

-- name: CLAIM_LIMITED [sqlite]
UPDATE zeroloss_message SET status = 'processing', attempts = attempts + 1, lease_token = lower(hex(randomblob(16))),
  lease_expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(ack_timeout)s)),
  claimed_by = %(claimed_by)s, started_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id IN (
    SELECT id FROM (
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s
          AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') AND priority > %(priority)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s) a
      UNION ALL
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s
          AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') AND priority = %(priority)s
          AND available_at >= %(since)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s) r
      UNION ALL
      SELECT id FROM (SELECT id FROM zeroloss_message
        WHERE status = 'pending' AND queue_name = %(queue)s
          AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') AND priority < %(priority)s
        ORDER BY priority DESC, available_at, id LIMIT %(limit)s) z
    ) c
    LIMIT (SELECT CASE WHEN r < 0 THEN 0 WHEN r > %(limit)s THEN %(limit)s ELSE r END
           FROM (SELECT %(most)s - count(*) AS r FROM zeroloss_message
                 WHERE queue_name = %(queue)s AND status = 'processing') room))
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'claimed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at,
  lease_token, lease_expires_at, payload, max_attempts, priority, headers, available_at, workflow_id

-- One pending, available message by its id.
-- name: CLAIM_BY_ID [postgresql]
UPDATE zeroloss_message SET status = 'processing', attempts = attempts + 1, lease_token = gen_random_uuid(),
  lease_expires_at = (clock_timestamp() + %(ack_timeout)s * interval '1 second'), claimed_by = %(claimed_by)s,
  started_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = ANY(ARRAY(SELECT id FROM zeroloss_message
                     WHERE message_id = %(mid)s AND status = 'pending' AND available_at <= statement_timestamp()
                     FOR UPDATE SKIP LOCKED))
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'claimed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at,
  lease_token, lease_expires_at, payload, max_attempts, priority, headers, available_at, workflow_id

-- name: CLAIM_BY_ID [sqlite]
UPDATE zeroloss_message SET status = 'processing', attempts = attempts + 1, lease_token = lower(hex(randomblob(16))),
  lease_expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(ack_timeout)s)),
  claimed_by = %(claimed_by)s, started_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id IN (SELECT id FROM zeroloss_message
             WHERE message_id = %(mid)s AND status = 'pending'
               AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
RETURNING id, message_id, status, attempts, updated_at, CAST('pending' AS TEXT) AS from_status,
  'claimed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at,
  lease_token, lease_expires_at, payload, max_attempts, priority, headers, available_at, workflow_id

-- ---------------------------------------------------------------------------------------
-- The recovery sweep: up to ``limit`` leases that expired, back to pending (dead once their
-- attempts are spent; cancelled when an abort was requested and the worker died: never run
-- again, statements_cancel).
--
-- The lease index keeps the processing version of every message acknowledged since the xmin
-- horizon was last free (at 800 msg/s, 48,000 a minute): a probe from the head of expired
-- leases visits them all. So a sweep examines the leases that expired since a little before
-- its previous complete sweep (``since``), and every sweep.SWEEP_FROM_HEAD_EVERY seconds all
-- of them (``since``: the start of time). The bound is repeated outside: PostgreSQL may find
-- the chosen ids through the lease index too (a bitmap of every expired entry).
-- name: SWEEP [postgresql]
UPDATE zeroloss_message SET
  status = CASE WHEN abort_requested_at IS NOT NULL THEN 'cancelled'
                WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
  dead_at = CASE WHEN abort_requested_at IS NULL AND attempts >= max_attempts THEN statement_timestamp() END,
  available_at = statement_timestamp(),
  last_error = 'Lease expired: ' || claimed_by || ' neither acknowledged nor renewed it',
  lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()
WHERE id = ANY(ARRAY(SELECT id FROM zeroloss_message
                     WHERE status = 'processing' AND lease_expires_at < statement_timestamp()
                       AND lease_expires_at >= %(since)s
                     ORDER BY lease_expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
  AND status = 'processing' AND lease_expires_at < statement_timestamp() AND lease_expires_at >= %(since)s
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  CASE WHEN status = 'cancelled' THEN 'aborted' WHEN status = 'dead' THEN 'dead_lettered' ELSE 'lease_expired' END AS reason,
  'lease held by ' || claimed_by || ' expired' AS detail, queue_name, ordering_key, created_at

-- name: SWEEP [sqlite]
UPDATE zeroloss_message SET
  status = CASE WHEN abort_requested_at IS NOT NULL THEN 'cancelled'
                WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
  dead_at = CASE WHEN abort_requested_at IS NULL AND attempts >= max_attempts
                 THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END,
  available_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  last_error = 'Lease expired: ' || claimed_by || ' neither acknowledged nor renewed it',
  lease_token = NULL, lease_expires_at = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id IN (SELECT id FROM zeroloss_message
             WHERE status = 'processing' AND lease_expires_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
               AND lease_expires_at >= %(since)s
             ORDER BY lease_expires_at LIMIT %(limit)s)
  AND status = 'processing' AND lease_expires_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
  AND lease_expires_at >= %(since)s
RETURNING id, message_id, status, attempts, updated_at, CAST('processing' AS TEXT) AS from_status,
  CASE WHEN status = 'cancelled' THEN 'aborted' WHEN status = 'dead' THEN 'dead_lettered' ELSE 'lease_expired' END AS reason,
  'lease held by ' || claimed_by || ' expired' AS detail, queue_name, ordering_key, created_at
