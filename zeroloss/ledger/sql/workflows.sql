-- Workflows (zeroloss.ledger.statements_workflows, part of the ledger's catalogue; read by
-- zeroloss.ledger.workflows): a workflow's row, its steps (messages with workflow_id set), the
-- dependencies between them (zeroloss_dependency: one row an edge) and their fan-in groups
-- (zeroloss_fanin: how many of a group of up to 100 dependencies are unsettled).
--
-- A step's release runs in the transaction of the outcome that settled its last dependency,
-- after that outcome's fenced statement, and settles only the rows that statement moved:
-- SETTLE (the upstream's edges, once each), FANIN_DECREMENT (their groups, locked in order),
-- STEP_DECREMENT (the steps whose group emptied, locked in order), STEP_RELEASE (those with
-- nothing left). Each counter is decremented under its row lock (READ COMMITTED applies an
-- UPDATE to the row's latest version), so exactly one transaction takes it to zero.

-- The workflow's row: the first send of its id stores it; a second finds it (WORKFLOW_OF).
-- name: WORKFLOW_INSERT [postgresql]
INSERT INTO zeroloss_workflow (workflow_id, fingerprint, steps, created_at)
VALUES (%(wf)s, %(fingerprint)s, %(steps)s, statement_timestamp())
ON CONFLICT (workflow_id) DO NOTHING RETURNING id

-- name: WORKFLOW_INSERT [sqlite]
INSERT INTO zeroloss_workflow (workflow_id, fingerprint, steps, created_at)
VALUES (%(wf)s, %(fingerprint)s, %(steps)s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
ON CONFLICT (workflow_id) DO NOTHING RETURNING id

-- name: WORKFLOW_OF
SELECT fingerprint, steps FROM zeroloss_workflow WHERE workflow_id = %(wf)s

-- The steps' ids, claimed in the message-id key table (PostgreSQL: a partitioned message table
-- holds its message ids unique there). An id taken already is a conflict (the caller raises).
-- name: STEP_KEYS [postgresql]
INSERT INTO zeroloss_message_key (message_id, created_at)
SELECT b.mid, statement_timestamp() FROM unnest(%(mid)s::text[]) AS b(mid)
ON CONFLICT DO NOTHING RETURNING message_id

-- The steps: pending when they wait for nothing, else waiting (waiting_on: their unsettled
-- fan-in groups). Not claimable until pending; a keyed one joins its key (promoted after).
-- name: STEP_INSERT [postgresql]
INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts,
  priority, ordering_key, available_at, claimed_by, last_error, replication_targets, created_at,
  updated_at, headers, workflow_id, step_name, waiting_on, on_upstream_failure)
SELECT b.mid, b.q, b.payload::jsonb, b.checksum, b.status,
  0, b.max_attempts, b.priority, b.k,
  CASE WHEN b.waiting_on > 0 OR b.k <> '' THEN NULL ELSE statement_timestamp() END, '', '', '[]'::jsonb,
  statement_timestamp(), statement_timestamp(), b.headers::jsonb, %(wf)s, b.name, b.waiting_on, b.policy
FROM unnest(%(mid)s::text[], %(q)s::text[], %(payload)s::text[], %(checksum)s::text[], %(max_attempts)s::int[],
  %(priority)s::int[], %(k)s::text[], %(headers)s::text[], %(name)s::text[], %(waiting_on)s::int[],
  %(policy)s::text[], %(status)s::text[]) WITH ORDINALITY AS b(mid, q, payload, checksum, max_attempts, priority, k,
  headers, name, waiting_on, policy, status, n)
ORDER BY b.n
RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
  'persisted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: STEP_INSERT [sqlite]
INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts,
  priority, ordering_key, available_at, claimed_by, last_error, replication_targets, created_at,
  updated_at, headers, workflow_id, step_name, waiting_on, on_upstream_failure)
SELECT b.mid, b.q, b.payload, b.checksum, b.status,
  0, b.max_attempts, b.priority, b.k,
  CASE WHEN b.waiting_on > 0 OR b.k <> '' THEN NULL ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END,
  '', '', '[]', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  b.headers, %(wf)s, b.name, b.waiting_on, b.policy
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.q') AS q,
  json_extract(value, '$.payload') AS payload, json_extract(value, '$.checksum') AS checksum,
  json_extract(value, '$.max_attempts') AS max_attempts, json_extract(value, '$.priority') AS priority,
  json_extract(value, '$.k') AS k, json_extract(value, '$.headers') AS headers,
  json_extract(value, '$.name') AS name, json_extract(value, '$.waiting_on') AS waiting_on,
  json_extract(value, '$.policy') AS policy, json_extract(value, '$.status') AS status, key AS n
  FROM json_each(%(rows)s)) AS b
WHERE true ORDER BY b.n
RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
  'persisted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- The dependencies (downstream, by its primary key, waits for upstream, by its message id).
-- name: DEPENDENCY_INSERT [postgresql]
INSERT INTO zeroloss_dependency (workflow_id, downstream, upstream, fanin)
SELECT %(wf)s, b.down, b.up, b.fanin
FROM unnest(%(down)s::bigint[], %(up)s::text[], %(fanin)s::int[]) AS b(down, up, fanin)

-- name: DEPENDENCY_INSERT [sqlite]
INSERT INTO zeroloss_dependency (workflow_id, downstream, upstream, fanin)
SELECT %(wf)s, json_extract(value, '$.down'), json_extract(value, '$.up'), json_extract(value, '$.fanin')
FROM json_each(%(rows)s)

-- name: FANIN_INSERT [postgresql]
INSERT INTO zeroloss_fanin (downstream, fanin, remaining)
SELECT b.down, b.fanin, b.n FROM unnest(%(down)s::bigint[], %(fanin)s::int[], %(n)s::int[]) AS b(down, fanin, n)

-- name: FANIN_INSERT [sqlite]
INSERT INTO zeroloss_fanin (downstream, fanin, remaining)
SELECT json_extract(value, '$.down'), json_extract(value, '$.fanin'), json_extract(value, '$.n')
FROM json_each(%(rows)s)

-- Settle the edges of upstream steps that ended (st: completed, dead or cancelled), once each.
-- A completion settles every edge; a failure only the edges whose downstream does not wait
-- for a redrive (on_upstream_failure "run" or "cancel"), and every edge of a cancelled step
-- (it cannot be redriven). The caller counts "completed" and the "run" ones, and cancels the
-- others' downstream steps.
-- name: SETTLE [postgresql]
UPDATE zeroloss_dependency SET settled_status = b.status
FROM unnest(%(up)s::text[], %(status)s::text[]) AS b(up, status)
WHERE zeroloss_dependency.upstream = b.up AND zeroloss_dependency.settled_status IS NULL
  AND (b.status <> 'dead' OR EXISTS (SELECT 1 FROM zeroloss_message d
    WHERE d.id = zeroloss_dependency.downstream AND d.on_upstream_failure <> 'wait'))
RETURNING zeroloss_dependency.downstream, zeroloss_dependency.fanin, zeroloss_dependency.settled_status

-- name: SETTLE [sqlite]
UPDATE zeroloss_dependency SET settled_status = b.status
FROM (SELECT json_extract(value, '$.up') AS up, json_extract(value, '$.status') AS status FROM json_each(%(rows)s)) AS b
WHERE zeroloss_dependency.upstream = b.up AND zeroloss_dependency.settled_status IS NULL
  AND (b.status <> 'dead' OR EXISTS (SELECT 1 FROM zeroloss_message d
    WHERE d.id = zeroloss_dependency.downstream AND d.on_upstream_failure <> 'wait'))
RETURNING zeroloss_dependency.downstream, zeroloss_dependency.fanin, zeroloss_dependency.settled_status

-- The same for upstream steps that all completed (the common case): every edge settles, and no
-- dependent's policy needs reading.
-- name: SETTLE_COMPLETED [postgresql]
UPDATE zeroloss_dependency SET settled_status = 'completed'
WHERE upstream = ANY(%(up)s::text[]) AND settled_status IS NULL
RETURNING downstream, fanin, settled_status

-- name: SETTLE_COMPLETED [sqlite]
UPDATE zeroloss_dependency SET settled_status = 'completed'
WHERE upstream IN (SELECT value FROM json_each(%(up)s)) AND settled_status IS NULL
RETURNING downstream, fanin, settled_status

-- What each of these steps does when a dependency fails.
-- name: STEP_POLICIES [postgresql]
SELECT id, on_upstream_failure FROM zeroloss_message WHERE id IN (SELECT b.id FROM unnest(%(ids)s::bigint[]) AS b(id))

-- name: STEP_POLICIES [sqlite]
SELECT id, on_upstream_failure FROM zeroloss_message WHERE id IN (SELECT value FROM json_each(%(ids)s))

-- Decrement the fan-in groups of the settled edges (n of each), locked in (downstream, group)
-- order so that two batches never wait for each other; returns what each has left.
-- name: FANIN_DECREMENT [postgresql]
WITH b AS (SELECT * FROM unnest(%(down)s::bigint[], %(fanin)s::int[], %(n)s::int[]) AS b(down, fanin, n)),
l AS MATERIALIZED (SELECT f.id FROM zeroloss_fanin f JOIN b ON f.downstream = b.down AND f.fanin = b.fanin
  ORDER BY f.downstream, f.fanin FOR UPDATE OF f)
UPDATE zeroloss_fanin SET remaining = zeroloss_fanin.remaining - b.n FROM b, l
WHERE l.id = zeroloss_fanin.id AND zeroloss_fanin.downstream = b.down AND zeroloss_fanin.fanin = b.fanin
RETURNING zeroloss_fanin.downstream, zeroloss_fanin.remaining

-- name: FANIN_DECREMENT [sqlite]
UPDATE zeroloss_fanin SET remaining = remaining - b.n
FROM (SELECT json_extract(value, '$.down') AS down, json_extract(value, '$.fanin') AS fanin,
  json_extract(value, '$.n') AS n FROM json_each(%(rows)s)) AS b
WHERE zeroloss_fanin.downstream = b.down AND zeroloss_fanin.fanin = b.fanin
RETURNING downstream, remaining

-- Decrement the steps whose groups emptied (n of each), locked in id order; returns what each
-- waits on still, and its status.
-- name: STEP_DECREMENT [postgresql]
WITH b AS (SELECT * FROM unnest(%(down)s::bigint[], %(n)s::int[]) AS b(down, n)),
l AS MATERIALIZED (SELECT m.id FROM zeroloss_message m JOIN b ON m.id = b.down ORDER BY m.id FOR UPDATE OF m)
UPDATE zeroloss_message SET waiting_on = zeroloss_message.waiting_on - b.n FROM b, l
WHERE l.id = zeroloss_message.id AND zeroloss_message.id = b.down
RETURNING zeroloss_message.id, zeroloss_message.waiting_on

-- name: STEP_DECREMENT [sqlite]
UPDATE zeroloss_message SET waiting_on = waiting_on - b.n
FROM (SELECT json_extract(value, '$.down') AS down, json_extract(value, '$.n') AS n FROM json_each(%(rows)s)) AS b
WHERE zeroloss_message.id = b.down
RETURNING id, waiting_on

-- Waiting steps with nothing left to wait on -> pending (a keyed one joins its key's line).
-- name: STEP_RELEASE [postgresql]
UPDATE zeroloss_message SET status = 'pending',
  available_at = CASE WHEN ordering_key <> '' THEN NULL ELSE statement_timestamp() END, updated_at = statement_timestamp()
WHERE id IN (SELECT b.id FROM unnest(%(ids)s::bigint[]) AS b(id)) AND status = 'waiting' AND waiting_on = 0
RETURNING id, message_id, status, attempts, updated_at, CAST('waiting' AS TEXT) AS from_status,
  'dependencies_completed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: STEP_RELEASE [sqlite]
UPDATE zeroloss_message SET status = 'pending',
  available_at = CASE WHEN ordering_key <> '' THEN NULL ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END,
  updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND status = 'waiting' AND waiting_on = 0
RETURNING id, message_id, status, attempts, updated_at, CAST('waiting' AS TEXT) AS from_status,
  'dependencies_completed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- Waiting steps whose dependency failed -> cancelled, the reason in last_error.
-- name: STEP_CANCEL [postgresql]
UPDATE zeroloss_message SET status = 'cancelled', last_error = %(detail)s, updated_at = statement_timestamp()
WHERE id IN (SELECT b.id FROM unnest(%(ids)s::bigint[]) AS b(id)) AND status = 'waiting'
RETURNING id, message_id, status, attempts, updated_at, CAST('waiting' AS TEXT) AS from_status,
  'upstream_failed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: STEP_CANCEL [sqlite]
UPDATE zeroloss_message SET status = 'cancelled', last_error = %(detail)s,
  updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND status = 'waiting'
RETURNING id, message_id, status, attempts, updated_at, CAST('waiting' AS TEXT) AS from_status,
  'upstream_failed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- An operator cancels waiting steps (zeroloss.cancel, cancel_workflow), in chunks of ids.
-- name: STEP_CANCEL_BY_OPERATOR [postgresql]
UPDATE zeroloss_message SET status = 'cancelled', updated_at = statement_timestamp()
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid)) AND status = 'waiting'
RETURNING id, message_id, status, attempts, updated_at, CAST('waiting' AS TEXT) AS from_status,
  'cancelled_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: STEP_CANCEL_BY_OPERATOR [sqlite]
UPDATE zeroloss_message SET status = 'cancelled', updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE message_id IN (SELECT value FROM json_each(%(ids)s)) AND status = 'waiting'
RETURNING id, message_id, status, attempts, updated_at, CAST('waiting' AS TEXT) AS from_status,
  'cancelled_by_operator' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- Which of these messages (just moved by a sweep or an operator) are steps of a workflow.
-- name: STEPS_AMONG [postgresql]
SELECT message_id, status FROM zeroloss_message
WHERE message_id IN (SELECT b.mid FROM unnest(%(ids)s::text[]) AS b(mid)) AND workflow_id <> ''

-- name: STEPS_AMONG [sqlite]
SELECT message_id, status FROM zeroloss_message WHERE message_id IN (SELECT value FROM json_each(%(ids)s))
  AND workflow_id <> ''

-- A step's steps: its workflow's, in the order they were stored.
-- name: WORKFLOW_STEPS
SELECT id, message_id, step_name, queue_name, status, attempts, max_attempts, result, last_error, waiting_on,
  on_upstream_failure
FROM zeroloss_message WHERE workflow_id = %(wf)s ORDER BY id

-- name: WORKFLOW_EDGES
SELECT downstream, upstream, settled_status FROM zeroloss_dependency WHERE workflow_id = %(wf)s ORDER BY id

-- What a step's handler sees of its dependencies (delivery.upstream).
-- name: UPSTREAM_OF
SELECT u.message_id, u.step_name, u.status, u.result, d.settled_status FROM zeroloss_dependency d
JOIN zeroloss_message u ON u.message_id = d.upstream
WHERE d.downstream = (SELECT id FROM zeroloss_message WHERE message_id = %(mid)s) ORDER BY u.id

-- A running step's dependents that still wait for it (its fan-out is added to them).
-- name: DEPENDENTS_OF
SELECT DISTINCT downstream FROM zeroloss_dependency WHERE upstream = %(mid)s AND settled_status IS NULL

-- The next fan-in group of a step that gets more dependencies, and the step counted for it.
-- name: NEXT_FANIN
SELECT coalesce(max(fanin), -1) + 1 FROM zeroloss_fanin WHERE downstream = %(id)s

-- name: STEP_WAIT_MORE
UPDATE zeroloss_message SET waiting_on = waiting_on + %(n)s WHERE id = %(id)s AND status = 'waiting'
RETURNING id

-- Invariants (zeroloss_verify, and the sweep's safety net): waiting steps none of whose
-- dependencies is unsettled or failed-and-not-run (they should have been released: stranded),
-- and steps that left waiting other than by a cancel (pending, processing, completed or dead)
-- while a dependency is unsettled (released early). Each as a list (at most ``limit``) and a
-- count; ``queue``: of one queue's steps, or NULL for every queue.
-- name: STRANDED_STEPS
SELECT m.id, m.message_id FROM zeroloss_message m WHERE m.workflow_id <> '' AND m.status = 'waiting'
  AND NOT EXISTS (SELECT 1 FROM zeroloss_dependency d WHERE d.downstream = m.id
    AND (d.settled_status IS NULL OR (d.settled_status <> 'completed' AND m.on_upstream_failure <> 'run')))
ORDER BY m.id LIMIT %(limit)s

-- name: STRANDED_OF
SELECT m.message_id FROM zeroloss_message m WHERE m.workflow_id <> '' AND m.status = 'waiting'
  AND (m.queue_name = %(queue)s OR %(queue)s IS NULL)
  AND NOT EXISTS (SELECT 1 FROM zeroloss_dependency d WHERE d.downstream = m.id
    AND (d.settled_status IS NULL OR (d.settled_status <> 'completed' AND m.on_upstream_failure <> 'run')))
ORDER BY m.id LIMIT %(limit)s

-- name: STRANDED_COUNT
SELECT count(*) FROM zeroloss_message m WHERE m.workflow_id <> '' AND m.status = 'waiting'
  AND (m.queue_name = %(queue)s OR %(queue)s IS NULL)
  AND NOT EXISTS (SELECT 1 FROM zeroloss_dependency d WHERE d.downstream = m.id
    AND (d.settled_status IS NULL OR (d.settled_status <> 'completed' AND m.on_upstream_failure <> 'run')))

-- name: RELEASED_EARLY
SELECT m.message_id, min(d.upstream), m.status FROM zeroloss_message m
JOIN zeroloss_dependency d ON d.downstream = m.id
WHERE m.workflow_id <> '' AND m.status <> 'waiting' AND m.status <> 'cancelled' AND d.settled_status IS NULL
  AND (m.queue_name = %(queue)s OR %(queue)s IS NULL)
GROUP BY m.id, m.message_id, m.status ORDER BY m.id LIMIT %(limit)s

-- name: RELEASED_EARLY_COUNT
SELECT count(*) FROM zeroloss_message m WHERE m.workflow_id <> '' AND m.status <> 'waiting'
  AND m.status <> 'cancelled' AND (m.queue_name = %(queue)s OR %(queue)s IS NULL)
  AND EXISTS (SELECT 1 FROM zeroloss_dependency d WHERE d.downstream = m.id AND d.settled_status IS NULL)

-- The sweep's safety net: a stranded waiting step released (expected never to happen); the
-- condition read again under the row's lock, so a step that gained a dependency since stays.
-- name: STEP_RELEASE_STRANDED [postgresql]
UPDATE zeroloss_message SET status = 'pending', waiting_on = 0,
  available_at = CASE WHEN ordering_key <> '' THEN NULL ELSE statement_timestamp() END, updated_at = statement_timestamp()
WHERE id IN (SELECT b.id FROM unnest(%(ids)s::bigint[]) AS b(id)) AND status = 'waiting'
  AND NOT EXISTS (SELECT 1 FROM zeroloss_dependency d WHERE d.downstream = zeroloss_message.id
    AND (d.settled_status IS NULL OR (d.settled_status <> 'completed' AND zeroloss_message.on_upstream_failure <> 'run')))
RETURNING id, message_id, status, attempts, updated_at, CAST('waiting' AS TEXT) AS from_status,
  'dependencies_completed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: STEP_RELEASE_STRANDED [sqlite]
UPDATE zeroloss_message SET status = 'pending', waiting_on = 0,
  available_at = CASE WHEN ordering_key <> '' THEN NULL ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END,
  updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND status = 'waiting'
  AND NOT EXISTS (SELECT 1 FROM zeroloss_dependency d WHERE d.downstream = zeroloss_message.id
    AND (d.settled_status IS NULL OR (d.settled_status <> 'completed' AND zeroloss_message.on_upstream_failure <> 'run')))
RETURNING id, message_id, status, attempts, updated_at, CAST('waiting' AS TEXT) AS from_status,
  'dependencies_completed' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- Retention (zeroloss.ledger.workflow_retention): a workflow goes whole once finished. The
-- candidates after workflow ``after``: every step finished, none of them within ``age`` seconds
-- (a negative number: the shortest retention that applies) of the database clock.
-- name: WORKFLOW_PURGE_CANDIDATES [postgresql]
SELECT w.id, w.workflow_id FROM zeroloss_workflow w
WHERE w.id > %(after)s AND NOT EXISTS (SELECT 1 FROM zeroloss_message m WHERE m.workflow_id = w.workflow_id
  AND (m.status IN ('pending', 'processing', 'waiting')
    OR coalesce(CASE WHEN m.status = 'completed' THEN m.completed_at WHEN m.status = 'dead' THEN m.dead_at END,
      m.updated_at) >= statement_timestamp() + %(age)s * interval '1 second'))
ORDER BY w.id LIMIT %(size)s

-- name: WORKFLOW_PURGE_CANDIDATES [sqlite]
SELECT w.id, w.workflow_id FROM zeroloss_workflow w
WHERE w.id > %(after)s AND NOT EXISTS (SELECT 1 FROM zeroloss_message m WHERE m.workflow_id = w.workflow_id
  AND (m.status IN ('pending', 'processing', 'waiting')
    OR coalesce(CASE WHEN m.status = 'completed' THEN m.completed_at WHEN m.status = 'dead' THEN m.dead_at END,
      m.updated_at) >= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(age)s))))
ORDER BY w.id LIMIT %(size)s

-- The steps of these workflows, locked (a redrive waits for the purge, or the purge sees it):
-- each one's queue, status and seconds since it finished.
-- name: WORKFLOW_PURGE_STEPS [postgresql]
SELECT m.id, m.workflow_id, m.queue_name, m.status,
  extract(epoch FROM statement_timestamp() - coalesce(CASE WHEN m.status = 'completed' THEN m.completed_at
    WHEN m.status = 'dead' THEN m.dead_at END, m.updated_at))::float8
FROM zeroloss_message m WHERE m.workflow_id IN (SELECT b.wf FROM unnest(%(wf)s::text[]) AS b(wf))
ORDER BY m.id FOR UPDATE OF m

-- name: WORKFLOW_PURGE_STEPS [sqlite]
SELECT m.id, m.workflow_id, m.queue_name, m.status,
  (julianday('now') - julianday(coalesce(CASE WHEN m.status = 'completed' THEN m.completed_at
    WHEN m.status = 'dead' THEN m.dead_at END, m.updated_at))) * 86400.0
FROM zeroloss_message m WHERE m.workflow_id IN (SELECT value FROM json_each(%(wf)s))
ORDER BY m.id

-- A purged workflow's rows besides its steps: its fan-in groups (by their steps' ids), its
-- dependencies, itself.
-- name: FANIN_PURGE [postgresql]
DELETE FROM zeroloss_fanin WHERE downstream IN (SELECT b.id FROM unnest(%(ids)s::bigint[]) AS b(id))

-- name: FANIN_PURGE [sqlite]
DELETE FROM zeroloss_fanin WHERE downstream IN (SELECT value FROM json_each(%(ids)s))

-- name: DEPENDENCY_PURGE [postgresql]
DELETE FROM zeroloss_dependency WHERE workflow_id IN (SELECT b.wf FROM unnest(%(wf)s::text[]) AS b(wf))

-- name: DEPENDENCY_PURGE [sqlite]
DELETE FROM zeroloss_dependency WHERE workflow_id IN (SELECT value FROM json_each(%(wf)s))

-- name: WORKFLOW_PURGE [postgresql]
DELETE FROM zeroloss_workflow WHERE workflow_id IN (SELECT b.wf FROM unnest(%(wf)s::text[]) AS b(wf))

-- name: WORKFLOW_PURGE [sqlite]
DELETE FROM zeroloss_workflow WHERE workflow_id IN (SELECT value FROM json_each(%(wf)s))
