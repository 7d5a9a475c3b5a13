-- Persisting new messages (zeroloss.ledger.statements, part of the ledger's catalogue): one,
-- a batch, a staged batch, and PostgreSQL's COPY of a large one. Read by
-- zeroloss.ledger.catalogue; run as written. A new message is pending, or waiting (no
-- available_at) behind its ordering key's head; its audit row is its first (``persisted``).
--
-- PostgreSQL: each id claimed in the key table first. A partitioned message table can have no
-- unique index on message_id alone (docs/scaling.md), so each persisting statement inserts its
-- ids into the unpartitioned zeroloss_message_key first, in a CTE of the same statement (``k``),
-- and stores only the messages whose key it inserted: the key's primary key serialises
-- concurrent sends of one id, as the message table's unique index did. The message insert
-- keeps ``ON CONFLICT DO NOTHING``: on an unpartitioned ledger the message table's unique
-- index still refuses an id stored without a key row (by a 0.2 process during a rolling
-- upgrade). Since a data-modifying CTE must stand at the top of its statement, these are
-- written as PostgreSQL runs them, audit rows included: the message insert ``t``, the audit
-- rows ``ev`` (postgres.PostgresEngine.audit_wrapper's text, which a test keeps equal), the returned
-- columns (times as epoch seconds). The RETURNING of ``t`` adds pg_notify: it wakes idle
-- workers of the queue at commit.
--
-- SQLite: the message insert alone, with its RETURNING columns; the engine writes the audit rows
-- in the same transaction.

-- One message: scalar parameters (an array costs psycopg about 70 us more client CPU for one
-- row); ``key``: its ordering key ('' for none), ``delay``: seconds until it is available.
-- PostgreSQL: ``key`` is typed where it is stored (``::text``): one parameter in two places
-- takes one type, and the column alone would make it varchar, the comparison text.
-- name: INSERT_ONE [postgresql]
WITH k AS (INSERT INTO zeroloss_message_key (message_id, created_at) VALUES (%(mid)s, statement_timestamp())
           ON CONFLICT DO NOTHING RETURNING message_id),
t AS (INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts,
        priority, ordering_key, available_at, claimed_by, last_error, replication_targets, created_at,
        updated_at, dispatched_at)
      SELECT k.message_id, %(queue)s, %(payload)s::jsonb, %(checksum)s, 'pending', 0, %(max_attempts)s,
        %(priority)s, %(key)s::text,
        CASE WHEN %(key)s <> '' THEN NULL ELSE (statement_timestamp() + %(delay)s * interval '1 second') END,
        '', '', '[]'::jsonb, statement_timestamp(), statement_timestamp(),
        CASE WHEN %(dispatched)s THEN statement_timestamp() END
      FROM k ON CONFLICT DO NOTHING
      RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
        'persisted' AS reason, '' AS detail, queue_name, ordering_key, created_at, available_at,
        pg_notify('zeroloss_wakeup', queue_name)),
ev AS (INSERT INTO zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at)
       SELECT id, from_status, status, reason, %(actor)s, attempts, detail, updated_at, created_at FROM t)
SELECT id, extract(epoch FROM updated_at)::float8, extract(epoch FROM available_at)::float8 FROM t

-- name: INSERT_ONE [sqlite]
INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts, priority,
  ordering_key, available_at, claimed_by, last_error, replication_targets, created_at, updated_at, dispatched_at)
VALUES (%(mid)s, %(queue)s, %(payload)s, %(checksum)s, 'pending', 0, %(max_attempts)s, %(priority)s, %(key)s,
  CASE WHEN %(key)s <> '' THEN NULL
       ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(delay)s)) END,
  '', '', '[]', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  CASE WHEN %(dispatched)s THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END)
ON CONFLICT (message_id) DO NOTHING
RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
  'persisted' AS reason, '' AS detail, queue_name, ordering_key, created_at, available_at

-- The same, for a message sent with headers (a column of its own: the statements of messages
-- without any stay as they were, and cost what they did).
-- name: INSERT_ONE_HEADERS [postgresql]
WITH k AS (INSERT INTO zeroloss_message_key (message_id, created_at) VALUES (%(mid)s, statement_timestamp())
           ON CONFLICT DO NOTHING RETURNING message_id),
t AS (INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts,
        priority, ordering_key, available_at, claimed_by, last_error, replication_targets, created_at,
        updated_at, dispatched_at, headers)
      SELECT k.message_id, %(queue)s, %(payload)s::jsonb, %(checksum)s, 'pending', 0, %(max_attempts)s,
        %(priority)s, %(key)s::text,
        CASE WHEN %(key)s <> '' THEN NULL ELSE (statement_timestamp() + %(delay)s * interval '1 second') END,
        '', '', '[]'::jsonb, statement_timestamp(), statement_timestamp(),
        CASE WHEN %(dispatched)s THEN statement_timestamp() END, %(headers)s::jsonb
      FROM k ON CONFLICT DO NOTHING
      RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
        'persisted' AS reason, '' AS detail, queue_name, ordering_key, created_at, available_at,
        pg_notify('zeroloss_wakeup', queue_name)),
ev AS (INSERT INTO zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at)
       SELECT id, from_status, status, reason, %(actor)s, attempts, detail, updated_at, created_at FROM t)
SELECT id, extract(epoch FROM updated_at)::float8, extract(epoch FROM available_at)::float8 FROM t

-- name: INSERT_ONE_HEADERS [sqlite]
INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts, priority,
  ordering_key, available_at, claimed_by, last_error, replication_targets, created_at, updated_at, dispatched_at,
  headers)
VALUES (%(mid)s, %(queue)s, %(payload)s, %(checksum)s, 'pending', 0, %(max_attempts)s, %(priority)s, %(key)s,
  CASE WHEN %(key)s <> '' THEN NULL
       ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(delay)s)) END,
  '', '', '[]', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  CASE WHEN %(dispatched)s THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END, %(headers)s)
ON CONFLICT (message_id) DO NOTHING
RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
  'persisted' AS reason, '' AS detail, queue_name, ordering_key, created_at, available_at

-- A batch: one statement whatever its size (PostgreSQL: one array per column; SQLite: one
-- JSON array of rows). The batch's scalars first (``p``); ``n`` (``b``) keeps the batch's
-- order in the ids (an ordering key's messages are claimed by id).
-- name: INSERT_MANY [postgresql]
WITH p AS (SELECT CAST(%(delay)s AS double precision) AS delay, CAST(%(dispatched)s AS boolean) AS dispatched),
b AS MATERIALIZED (SELECT row_number() OVER () AS n, *
                   FROM unnest(%(mid)s::text[], %(q)s::text[], %(payload)s::text[], %(checksum)s::text[],
                               %(max_attempts)s::int[], %(priority)s::int[], %(k)s::text[])
                        AS b(mid, q, payload, checksum, max_attempts, priority, k)),
k AS (INSERT INTO zeroloss_message_key (message_id, created_at) SELECT mid, statement_timestamp() FROM b
      ON CONFLICT DO NOTHING RETURNING message_id),
t AS (INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts,
        priority, ordering_key, available_at, claimed_by, last_error, replication_targets, created_at,
        updated_at, dispatched_at)
      SELECT b.mid, b.q, b.payload::jsonb, b.checksum, 'pending', 0, b.max_attempts, b.priority, b.k,
        CASE WHEN b.k <> '' THEN NULL ELSE (statement_timestamp() + p.delay * interval '1 second') END,
        '', '', '[]'::jsonb, statement_timestamp(), statement_timestamp(),
        CASE WHEN p.dispatched THEN statement_timestamp() END
      FROM p, b JOIN k ON k.message_id = b.mid ORDER BY b.n ON CONFLICT DO NOTHING
      RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
        'persisted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at,
        available_at, pg_notify('zeroloss_wakeup', queue_name)),
ev AS (INSERT INTO zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at)
       SELECT id, from_status, status, reason, %(actor)s, attempts, detail, updated_at, created_at FROM t)
SELECT id, message_id FROM t

-- name: INSERT_MANY [sqlite]
INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts, priority,
  ordering_key, available_at, claimed_by, last_error, replication_targets, created_at, updated_at, dispatched_at)
SELECT b.mid, b.q, b.payload, b.checksum, 'pending', 0, b.max_attempts, b.priority, b.k,
  CASE WHEN b.k <> '' THEN NULL
       ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(delay)s)) END,
  '', '', '[]', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  CASE WHEN %(dispatched)s THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.q') AS q,
             json_extract(value, '$.payload') AS payload, json_extract(value, '$.checksum') AS checksum,
             json_extract(value, '$.max_attempts') AS max_attempts, json_extract(value, '$.priority') AS priority,
             json_extract(value, '$.k') AS k
      FROM json_each(%(rows)s)) AS b
WHERE true ON CONFLICT (message_id) DO NOTHING
RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
  'persisted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at, available_at

-- name: INSERT_MANY_HEADERS [postgresql]
WITH p AS (SELECT CAST(%(delay)s AS double precision) AS delay, CAST(%(dispatched)s AS boolean) AS dispatched),
b AS MATERIALIZED (SELECT row_number() OVER () AS n, *
                   FROM unnest(%(mid)s::text[], %(q)s::text[], %(payload)s::text[], %(checksum)s::text[],
                               %(max_attempts)s::int[], %(priority)s::int[], %(k)s::text[], %(headers)s::text[])
                        AS b(mid, q, payload, checksum, max_attempts, priority, k, headers)),
k AS (INSERT INTO zeroloss_message_key (message_id, created_at) SELECT mid, statement_timestamp() FROM b
      ON CONFLICT DO NOTHING RETURNING message_id),
t AS (INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts,
        priority, ordering_key, available_at, claimed_by, last_error, replication_targets, created_at,
        updated_at, dispatched_at, headers)
      SELECT b.mid, b.q, b.payload::jsonb, b.checksum, 'pending', 0, b.max_attempts, b.priority, b.k,
        CASE WHEN b.k <> '' THEN NULL ELSE (statement_timestamp() + p.delay * interval '1 second') END,
        '', '', '[]'::jsonb, statement_timestamp(), statement_timestamp(),
        CASE WHEN p.dispatched THEN statement_timestamp() END, b.headers::jsonb
      FROM p, b JOIN k ON k.message_id = b.mid ORDER BY b.n ON CONFLICT DO NOTHING
      RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
        'persisted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at,
        available_at, pg_notify('zeroloss_wakeup', queue_name)),
ev AS (INSERT INTO zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at)
       SELECT id, from_status, status, reason, %(actor)s, attempts, detail, updated_at, created_at FROM t)
SELECT id, message_id FROM t

-- name: INSERT_MANY_HEADERS [sqlite]
INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts, priority,
  ordering_key, available_at, claimed_by, last_error, replication_targets, created_at, updated_at, dispatched_at,
  headers)
SELECT b.mid, b.q, b.payload, b.checksum, 'pending', 0, b.max_attempts, b.priority, b.k,
  CASE WHEN b.k <> '' THEN NULL
       ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(delay)s)) END,
  '', '', '[]', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  CASE WHEN %(dispatched)s THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END, b.headers
FROM (SELECT json_extract(value, '$.mid') AS mid, json_extract(value, '$.q') AS q,
             json_extract(value, '$.payload') AS payload, json_extract(value, '$.checksum') AS checksum,
             json_extract(value, '$.max_attempts') AS max_attempts, json_extract(value, '$.priority') AS priority,
             json_extract(value, '$.k') AS k, json_extract(value, '$.headers') AS headers
      FROM json_each(%(rows)s)) AS b
WHERE true ON CONFLICT (message_id) DO NOTHING
RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
  'persisted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at, available_at

-- ---------------------------------------------------------------------------------------
-- A large batch (PostgreSQL, Engine.stage_from messages or more, bulk.py).

-- All new: ids drawn in the batch's order and one clock reading, then the message rows, their
-- keys and their audit rows COPY'd. (The ids as one text: 100,000 load in a few ms, where
-- 100,000 rows took a tenth of the batch; the sequence looked up once, not once a row: 4x
-- faster.)
-- name: RESERVE_IDS [postgresql]
SELECT statement_timestamp(),
  string_agg(nextval((SELECT pg_get_serial_sequence('zeroloss_message', 'id')::regclass))::text, ',')
FROM generate_series(1, %(count)s)

-- name: COPY_MESSAGES [postgresql]
COPY zeroloss_message (id, message_id, queue_name, payload, checksum, status, attempts, max_attempts, priority,
  ordering_key, available_at, claimed_by, last_error, replication_targets, created_at, updated_at, dispatched_at,
  headers) FROM STDIN

-- name: COPY_KEYS [postgresql]
COPY zeroloss_message_key (message_id, created_at) FROM STDIN

-- name: COPY_EVENTS [postgresql]
COPY zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at,
  message_created_at) FROM STDIN

-- When an id of the batch is stored already (the COPY fails on it): COPY'd into a temporary
-- table, then stored by one statement like INSERT_MANY's (INSERT_STAGED). Dropped at once (a
-- second batch of the same transaction creates it again), and at commit whatever happens.
-- ``n`` keeps the batch's order in the ids.
-- name: STAGE_CREATE [postgresql]
CREATE TEMPORARY TABLE zeroloss_staged (n int, mid text, q text, payload text, checksum text, max_attempts int,
  priority int, k text, headers text) ON COMMIT DROP

-- name: STAGE_COPY [postgresql]
COPY zeroloss_staged FROM STDIN

-- It names a table each batch creates again: never prepared (statements.MOVES).
-- name: INSERT_STAGED [postgresql]
WITH p AS (SELECT CAST(%(delay)s AS double precision) AS delay, CAST(%(dispatched)s AS boolean) AS dispatched),
k AS (INSERT INTO zeroloss_message_key (message_id, created_at) SELECT mid, statement_timestamp() FROM zeroloss_staged
      ON CONFLICT DO NOTHING RETURNING message_id),
t AS (INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts,
        priority, ordering_key, available_at, claimed_by, last_error, replication_targets, created_at,
        updated_at, dispatched_at, headers)
      SELECT b.mid, b.q, b.payload::jsonb, b.checksum, 'pending', 0, b.max_attempts, b.priority, b.k,
        CASE WHEN b.k <> '' THEN NULL ELSE (statement_timestamp() + p.delay * interval '1 second') END,
        '', '', '[]'::jsonb, statement_timestamp(), statement_timestamp(),
        CASE WHEN p.dispatched THEN statement_timestamp() END, b.headers::jsonb
      FROM p, zeroloss_staged b JOIN k ON k.message_id = b.mid ORDER BY b.n ON CONFLICT DO NOTHING
      RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
        'persisted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at),
ev AS (INSERT INTO zeroloss_messageevent (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, message_created_at)
       SELECT id, from_status, status, reason, %(actor)s, attempts, detail, updated_at, created_at FROM t)
SELECT id, message_id FROM t

-- SQLite never stages (Engine.stage_from is 0 there); written for the conformance of MOVES.
-- name: INSERT_STAGED [sqlite]
INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, max_attempts, priority,
  ordering_key, available_at, claimed_by, last_error, replication_targets, created_at, updated_at, dispatched_at,
  headers)
SELECT b.mid, b.q, b.payload, b.checksum, 'pending', 0, b.max_attempts, b.priority, b.k,
  CASE WHEN b.k <> '' THEN NULL
       ELSE strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%+.6f seconds', %(delay)s)) END,
  '', '', '[]', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
  CASE WHEN %(dispatched)s THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') END, b.headers
FROM zeroloss_staged b ORDER BY b.n ON CONFLICT (message_id) DO NOTHING
RETURNING id, message_id, status, attempts, updated_at, CAST('' AS TEXT) AS from_status,
  'persisted' AS reason, CAST(%(detail)s AS TEXT) AS detail, queue_name, ordering_key, created_at

-- name: STAGE_DROP [postgresql]
DROP TABLE zeroloss_staged
