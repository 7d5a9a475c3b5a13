-- The scheduler's statements (zeroloss.schedules.statements). Read by
-- zeroloss.ledger.catalogue; run as written. A batch of names (and times) travels as one
-- array per column (PostgreSQL: unnest) or as one JSON array of rows (SQLite: json_each),
-- so each statement has one text whatever its size.

-- The database clock and the version of the database schedules: every write bumps a row's
-- revision (their sum moves), a delete lowers the count, a create adds a new highest id. No
-- host's clock is in it, so an edit from a host whose clock is behind is seen like any other.
-- name: CLOCK [postgresql]
SELECT clock_timestamp(), v.n, v.revisions, v.newest
FROM (SELECT count(*) AS n, sum(revision) AS revisions, max(id) AS newest FROM zeroloss_schedule) v

-- name: CLOCK [sqlite]
SELECT strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), v.n, v.revisions, v.newest
FROM (SELECT count(*) AS n, sum(revision) AS revisions, max(id) AS newest FROM zeroloss_schedule) v

-- name: CREATE_STATES [postgresql]
INSERT INTO zeroloss_schedulestate (name, updated_at)
SELECT b.name, statement_timestamp() FROM unnest(%(names)s::text[]) AS b(name)
WHERE true ON CONFLICT (name) DO NOTHING

-- name: CREATE_STATES [sqlite]
INSERT INTO zeroloss_schedulestate (name, updated_at)
SELECT b.name, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') FROM (SELECT value AS name FROM json_each(%(names)s)) AS b
WHERE true ON CONFLICT (name) DO NOTHING

-- A schedule a scheduler sees enabled without a start (new in the settings, or re-enabled
-- there): it starts at that scheduler's clock reading ``at``, unless another started it first.
-- name: START_STATES [postgresql]
INSERT INTO zeroloss_schedulestate (name, last_tick, updated_at)
SELECT b.name, CAST(%(at)s AS timestamptz), statement_timestamp() FROM unnest(%(names)s::text[]) AS b(name)
WHERE true ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick, updated_at = excluded.updated_at
WHERE zeroloss_schedulestate.last_tick IS NULL

-- name: START_STATES [sqlite]
INSERT INTO zeroloss_schedulestate (name, last_tick, updated_at)
SELECT b.name, %(at)s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') FROM (SELECT value AS name FROM json_each(%(names)s)) AS b
WHERE true ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick, updated_at = excluded.updated_at
WHERE zeroloss_schedulestate.last_tick IS NULL

-- A settings schedule a scheduler sees disabled: it loses its start, so enabling it again
-- starts it afresh instead of catching up on the time it was off.
-- name: STOP_STATES [postgresql]
UPDATE zeroloss_schedulestate SET last_tick = NULL, updated_at = statement_timestamp()
WHERE last_tick IS NOT NULL AND name IN (SELECT b.name FROM unnest(%(names)s::text[]) AS b(name))

-- name: STOP_STATES [sqlite]
UPDATE zeroloss_schedulestate SET last_tick = NULL, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE last_tick IS NOT NULL AND name IN (SELECT b.name FROM (SELECT value AS name FROM json_each(%(names)s)) AS b)

-- Locked in name order: schedulers running the same round queue up, never deadlock (SQLite:
-- the transaction holds the database's one write lock).
-- name: LOCK_STATES [postgresql]
SELECT name, last_tick, last_sent FROM zeroloss_schedulestate
WHERE name IN (SELECT b.name FROM unnest(%(names)s::text[]) AS b(name)) ORDER BY name FOR UPDATE

-- name: LOCK_STATES [sqlite]
SELECT name, last_tick, last_sent FROM zeroloss_schedulestate
WHERE name IN (SELECT b.name FROM (SELECT value AS name FROM json_each(%(names)s)) AS b) ORDER BY name

-- name: SAVE_STATES [postgresql]
UPDATE zeroloss_schedulestate SET last_tick = b.last_tick, last_sent = b.last_sent, updated_at = statement_timestamp()
FROM unnest(%(name)s::text[], %(last_tick)s::timestamptz[], %(last_sent)s::timestamptz[]) AS b(name, last_tick, last_sent)
WHERE zeroloss_schedulestate.name = b.name

-- name: SAVE_STATES [sqlite]
UPDATE zeroloss_schedulestate SET last_tick = b.last_tick, last_sent = b.last_sent, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM (SELECT json_extract(value, '$.name') AS name, json_extract(value, '$.last_tick') AS last_tick,
             json_extract(value, '$.last_sent') AS last_sent FROM json_each(%(rows)s)) AS b
WHERE zeroloss_schedulestate.name = b.name
