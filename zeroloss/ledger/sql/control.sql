-- Queue control (pause, resume, limits): zeroloss.ledger.statements_control, part of the
-- ledger's catalogue. Read by zeroloss.ledger.catalogue; run as written. None of them moves
-- a message: a paused or limited queue's messages stay pending (no transition, no audit
-- row); what limits them is which claims run (zeroloss.ledger.control).

-- Queues with anything to enforce (paused, or a limit override): read at most twice a second
-- by each process, so a claim of any other queue costs no statement more.
-- name: CONTROLLED_QUEUES
SELECT queue_name, concurrency, rate FROM zeroloss_queuecontrol WHERE paused OR concurrency IS NOT NULL OR rate <> ''

-- A queue's operator part, unlocked: a paused queue is not claimed, whatever its limits.
-- name: CONTROL_READ
SELECT paused, concurrency, rate FROM zeroloss_queuecontrol WHERE queue_name = %(queue)s

-- A claim of a limited queue starts by locking its row. Every such claim of the queue waits
-- here for the one before it to commit, so each counts what the others claimed; the clock is
-- read after the wait (in the outer query: the inner one's projection runs below its lock),
-- and times the rate's bucket. PostgreSQL: a row lock, no new row version (no WAL); no row
-- yet (a limit from the settings alone), CONTROL_LOCK_UPSERT creates it. SQLite: the claim's
-- transaction holds the database's one write lock.
-- name: CONTROL_LOCK [postgresql]
SELECT paused, concurrency, rate, tokens, refilled_at, clock_timestamp()
FROM (SELECT paused, concurrency, rate, tokens, refilled_at FROM zeroloss_queuecontrol
      WHERE queue_name = %(queue)s FOR UPDATE) locked

-- name: CONTROL_LOCK [sqlite]
SELECT paused, concurrency, rate, tokens, refilled_at, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT paused, concurrency, rate, tokens, refilled_at FROM zeroloss_queuecontrol
      WHERE queue_name = %(queue)s) locked

-- The lock that creates the row at the queue's first claim; SQLite's every lock (a write, so
-- the claim holds the database's write lock from its start: no snapshot read before it).
-- name: CONTROL_LOCK_UPSERT [postgresql]
INSERT INTO zeroloss_queuecontrol (queue_name, paused, concurrency, rate, tokens, refilled_at, changed_by, changed_at)
VALUES (%(queue)s, false, NULL, '', 0, NULL, '', statement_timestamp())
ON CONFLICT (queue_name) DO UPDATE SET tokens = zeroloss_queuecontrol.tokens
RETURNING paused, concurrency, rate, tokens, refilled_at, clock_timestamp()

-- name: CONTROL_LOCK_UPSERT [sqlite]
INSERT INTO zeroloss_queuecontrol (queue_name, paused, concurrency, rate, tokens, refilled_at, changed_by, changed_at)
VALUES (%(queue)s, false, NULL, '', 0, NULL, '', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
ON CONFLICT (queue_name) DO UPDATE SET tokens = zeroloss_queuecontrol.tokens
RETURNING paused, concurrency, rate, tokens, refilled_at, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')

-- What the concurrency limit counts: every message of the queue processing, expired leases
-- included until the sweep puts them back (a dead worker's slots return once, with the sweep).
-- name: CONTROL_IN_FLIGHT
SELECT count(*) FROM zeroloss_message WHERE queue_name = %(queue)s AND status = 'processing'

-- The bucket after a claim: its tokens left, at the clock the claim read under the lock.
-- name: CONTROL_SPEND
UPDATE zeroloss_queuecontrol SET tokens = %(tokens)s, refilled_at = %(refilled_at)s WHERE queue_name = %(queue)s

-- The operator's moves (changed_by: the actor).
-- name: CONTROL_PAUSE [postgresql]
INSERT INTO zeroloss_queuecontrol (queue_name, paused, concurrency, rate, tokens, refilled_at, changed_by, changed_at)
VALUES (%(queue)s, %(paused)s, NULL, '', 0, NULL, %(who)s, statement_timestamp())
ON CONFLICT (queue_name) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by,
  changed_at = excluded.changed_at

-- name: CONTROL_PAUSE [sqlite]
INSERT INTO zeroloss_queuecontrol (queue_name, paused, concurrency, rate, tokens, refilled_at, changed_by, changed_at)
VALUES (%(queue)s, %(paused)s, NULL, '', 0, NULL, %(who)s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
ON CONFLICT (queue_name) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by,
  changed_at = excluded.changed_at

-- A new limit starts with a full bucket (refilled_at NULL).
-- name: CONTROL_LIMIT [postgresql]
INSERT INTO zeroloss_queuecontrol (queue_name, paused, concurrency, rate, tokens, refilled_at, changed_by, changed_at)
VALUES (%(queue)s, false, %(concurrency)s, %(rate)s, 0, NULL, %(who)s, statement_timestamp())
ON CONFLICT (queue_name) DO UPDATE SET concurrency = excluded.concurrency, rate = excluded.rate, tokens = 0,
  refilled_at = NULL, changed_by = excluded.changed_by, changed_at = excluded.changed_at

-- name: CONTROL_LIMIT [sqlite]
INSERT INTO zeroloss_queuecontrol (queue_name, paused, concurrency, rate, tokens, refilled_at, changed_by, changed_at)
VALUES (%(queue)s, false, %(concurrency)s, %(rate)s, 0, NULL, %(who)s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
ON CONFLICT (queue_name) DO UPDATE SET concurrency = excluded.concurrency, rate = excluded.rate, tokens = 0,
  refilled_at = NULL, changed_by = excluded.changed_by, changed_at = excluded.changed_at

-- name: CONTROL_ALL
SELECT queue_name, paused, concurrency, rate, changed_by, changed_at FROM zeroloss_queuecontrol ORDER BY queue_name

-- What zeroloss_queue show reports next to each queue's control.
-- name: CONTROL_COUNTS
SELECT queue_name, status, count(*) FROM zeroloss_message WHERE status IN ('pending', 'processing')
GROUP BY queue_name, status

-- Which queue a message is in (a claim by id of a controlled ledger asks first).
-- name: MESSAGE_QUEUE
SELECT queue_name FROM zeroloss_message WHERE message_id = %(message_id)s

-- ---------------------------------------------------------------------------------------
-- PostgreSQL's concurrent path (zeroloss.ledger.control, docs/control.md "How each guarantee
-- holds"): a claim far from its queue's limits holds one of the queue's ``slots`` advisory
-- locks (the first it can take, from slot ``first`` on; none: NULL) instead of the row. The
-- row is read unlocked, as a hint only: a missing row tries no slot.
-- name: CONTROL_SLOT
SELECT paused, concurrency, rate,
       (SELECT s FROM generate_series(0, %(slots)s::int - 1) s
        WHERE pg_try_advisory_xact_lock(hashtext('zeroloss.limit:' || %(queue)s), (s + %(first)s::int) %% %(slots)s::int)
        LIMIT 1)
FROM zeroloss_queuecontrol WHERE queue_name = %(queue)s

-- Every slot was taken: wait for slot ``first`` (never for the exact path's lock, which waits
-- for the slots; queueing there would turn one exact claim into a convoy of them).
-- name: CONTROL_SLOT_WAIT
SELECT %(first)s FROM pg_advisory_xact_lock(hashtext('zeroloss.limit:' || %(queue)s), %(first)s)

-- Read after the slot was granted (a statement of its own, so its snapshot sees every claim
-- that committed before): the row, what of the queue is processing, and the slot's share of
-- the rate's bucket (no row: a full share).
-- name: CONTROL_SLOT_READ [postgresql]
SELECT c.paused, c.concurrency, c.rate, b.tokens, b.refilled_at, clock_timestamp(),
       (SELECT count(*) FROM zeroloss_message WHERE queue_name = %(queue)s AND status = 'processing')
FROM zeroloss_queuecontrol c
LEFT JOIN zeroloss_rate_bucket b ON b.queue_name = c.queue_name AND b.slot = %(slot)s
WHERE c.queue_name = %(queue)s

-- name: CONTROL_SLOT_READ [sqlite]
SELECT c.paused, c.concurrency, c.rate, b.tokens, b.refilled_at, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
       (SELECT count(*) FROM zeroloss_message WHERE queue_name = %(queue)s AND status = 'processing')
FROM zeroloss_queuecontrol c
LEFT JOIN zeroloss_rate_bucket b ON b.queue_name = c.queue_name AND b.slot = %(slot)s
WHERE c.queue_name = %(queue)s

-- The exact path's and the operator's lock: every slot of the queue from ``first``, in order
-- (so two of them never hold each other's), held to the commit; no slot claim runs
-- meanwhile. Never waits: the first slot another transaction holds is returned (NULL: all
-- taken), and the caller tries again from it, for a bounded time (a frozen worker's claim
-- may hold a slot until the server ends its session).
-- name: CONTROL_SLOTS_TRY
SELECT (SELECT s FROM generate_series(%(first)s::int, %(slots)s::int - 1) s
        WHERE NOT pg_try_advisory_xact_lock(hashtext('zeroloss.limit:' || %(queue)s), s) LIMIT 1)

-- A slot claim's tokens, from its own slot's share of the bucket, which no other claim writes
-- (each holds its own slot; the exact path and an operator's change hold all of them): what
-- the share held at the read's clock, less what was claimed. The row the queue's other
-- claims wait for is never written on this path.
-- name: CONTROL_BUCKET_SPEND
INSERT INTO zeroloss_rate_bucket (queue_name, slot, tokens, refilled_at)
VALUES (%(queue)s, %(slot)s, %(tokens)s, %(refilled_at)s)
ON CONFLICT (queue_name, slot) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at

-- The exact path of a rate kept in slot shares (holding every slot): all of the queue's shares.
-- name: CONTROL_BUCKETS
SELECT slot, tokens, refilled_at FROM zeroloss_rate_bucket WHERE queue_name = %(queue)s

-- ... and every share after its claim: refilled to the clock, less its part of what was claimed.
-- name: CONTROL_BUCKETS_SPEND
INSERT INTO zeroloss_rate_bucket (queue_name, slot, tokens, refilled_at)
SELECT %(queue)s, u.s, u.t, u.r FROM unnest(%(slot)s::int[], %(tokens)s::float8[], %(refilled_at)s::timestamptz[]) AS u(s, t, r)
ON CONFLICT (queue_name, slot) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at

-- A changed limit starts full shares (as it starts a full bucket).
-- name: CONTROL_BUCKETS_RESET
DELETE FROM zeroloss_rate_bucket WHERE queue_name = %(queue)s

-- The Celery transport at a resume or a limit change: the queue's waiting messages were
-- published and their tasks absorbed (paused, at a limit); no broker message carries them
-- any more, so they are marked for the redispatch that follows the change's commit.
-- name: CONTROL_UNDISPATCH [postgresql]
UPDATE zeroloss_message SET dispatched_at = NULL
WHERE queue_name = %(queue)s AND status = 'pending' AND available_at <= statement_timestamp() AND dispatched_at IS NOT NULL

-- name: CONTROL_UNDISPATCH [sqlite]
UPDATE zeroloss_message SET dispatched_at = NULL
WHERE queue_name = %(queue)s AND status = 'pending' AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') AND dispatched_at IS NOT NULL
