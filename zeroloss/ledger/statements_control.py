"""The statements of queue control (pause, resume, limits), by name; part of :mod:`.statements`
(which re-exports them, so the engines render them with the rest).

``{ctl}`` is :class:`zeroloss.models.QueueControl`'s table. None of them moves a message: a
paused or limited queue's messages stay ``pending`` (no transition, no audit row); what limits
them is which claims run (see :mod:`.control`).
"""

from __future__ import annotations

_CONTROL_COLUMNS = "queue_name, paused, concurrency, rate, tokens, refilled_at, changed_by, changed_at"
#: Queues with anything to enforce (paused, or a limit override): read at most twice a second
#: by each process, so a claim of any other queue costs no statement more (see control.py).
CONTROLLED_QUEUES = (
    "SELECT queue_name, concurrency, rate FROM {ctl} WHERE paused OR concurrency IS NOT NULL OR rate <> ''"
)
#: A queue's operator part, unlocked: a paused queue is not claimed, whatever its limits.
CONTROL_READ = "SELECT paused, concurrency, rate FROM {ctl} WHERE queue_name = %s"
#: A claim of a limited queue starts by locking its row. Every such claim of the queue waits
#: here for the one before it to commit, so each counts what the others claimed; the clock is
#: read after the wait (``{clock}`` in the outer query: the inner one's projection runs below its
#: lock), and times the rate's bucket. PostgreSQL: a row lock, no new row version (no WAL); no
#: row yet (a limit from the settings alone), CONTROL_LOCK_UPSERT creates it.
CONTROL_LOCK = (
    "SELECT paused, concurrency, rate, tokens, refilled_at, {clock} FROM (SELECT paused, concurrency, rate, "
    "tokens, refilled_at FROM {ctl} WHERE queue_name = %s{lock_row}) locked"
)
#: The lock that creates the row at the queue's first claim; SQLite's every lock (a write, so
#: the claim holds the database's write lock from its start: no snapshot read before it).
CONTROL_LOCK_UPSERT = (
    "INSERT INTO {ctl} (" + _CONTROL_COLUMNS + ") VALUES (%s, false, NULL, '', 0, NULL, '', {now}) "
    "ON CONFLICT (queue_name) DO UPDATE SET tokens = {ctl}.tokens "
    "RETURNING paused, concurrency, rate, tokens, refilled_at, {clock}"
)
#: What the concurrency limit counts: every message of the queue processing, expired leases
#: included until the sweep puts them back (a dead worker's slots return once, with the sweep).
CONTROL_IN_FLIGHT = "SELECT count(*) FROM {msg} WHERE queue_name = %s AND status = 'processing'"
#: The bucket after a claim: its tokens left, at the clock the claim read under the lock.
CONTROL_SPEND = "UPDATE {ctl} SET tokens = %s, refilled_at = %s WHERE queue_name = %s"
#: The operator's moves (``changed_by``: the actor).
CONTROL_PAUSE = (
    "INSERT INTO {ctl} (" + _CONTROL_COLUMNS + ") VALUES (%s, %s, NULL, '', 0, NULL, %s, {now}) "
    "ON CONFLICT (queue_name) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by, "
    "changed_at = excluded.changed_at"
)
#: A new limit starts with a full bucket (``refilled_at`` NULL).
CONTROL_LIMIT = (
    "INSERT INTO {ctl} (" + _CONTROL_COLUMNS + ") VALUES (%s, false, %s, %s, 0, NULL, %s, {now}) "
    "ON CONFLICT (queue_name) DO UPDATE SET concurrency = excluded.concurrency, rate = excluded.rate, "
    "tokens = 0, refilled_at = NULL, changed_by = excluded.changed_by, changed_at = excluded.changed_at"
)
CONTROL_ALL = (
    "SELECT queue_name, paused, concurrency, rate, changed_by, changed_at FROM {ctl} ORDER BY queue_name"
)
#: What ``zeroloss_queue show`` reports next to each queue's control.
CONTROL_COUNTS = (
    "SELECT queue_name, status, count(*) FROM {msg} WHERE status IN ('pending', 'processing') "
    "GROUP BY queue_name, status"
)
#: Which queue a message is in (a claim by id of a controlled ledger asks first).
MESSAGE_QUEUE = "SELECT queue_name FROM {msg} WHERE message_id = %s"
#: PostgreSQL's concurrent path (control.py, docs/control.md "How each guarantee holds"): a
#: claim far from its queue's limits holds one of the queue's ``SLOTS`` advisory locks (the
#: first it can take, from a random one; none: ``NULL``) instead of the row. The row is read
#: unlocked, as a hint only: a missing row tries no slot.
CONTROL_SLOT = (
    "SELECT paused, concurrency, rate, (SELECT s FROM generate_series(0, %s::int - 1) s WHERE "
    "pg_try_advisory_xact_lock(hashtext('zeroloss.limit:' || %s), (s + %s::int) %% %s::int) LIMIT 1) "
    "FROM {ctl} WHERE queue_name = %s"
)
#: Every slot was taken: wait for one (never for the exact path's lock, which waits for the
#: slots; queueing there would turn one exact claim into a convoy of them).
CONTROL_SLOT_WAIT = "SELECT %s FROM pg_advisory_xact_lock(hashtext('zeroloss.limit:' || %s), %s)"
#: Read after the slot was granted (a statement of its own, so its snapshot sees every claim that
#: committed before): the row, what of the queue is processing, and the slot's share of the
#: rate's bucket (``{bucket}``; no row: a full share).
CONTROL_SLOT_READ = (
    "SELECT c.paused, c.concurrency, c.rate, b.tokens, b.refilled_at, {clock}, (SELECT count(*) FROM {msg} "
    "WHERE queue_name = %s AND status = 'processing') FROM {ctl} c LEFT JOIN {bucket} b "
    "ON b.queue_name = c.queue_name AND b.slot = %s WHERE c.queue_name = %s"
)
#: The exact path's and the operator's lock: every slot of the queue from the first given, in
#: order (so two of them never hold each other's), held to the commit; no slot claim runs
#: meanwhile. Never waits: the first slot another transaction holds is returned (NULL: all
#: taken), and the caller tries again from it, for a bounded time (control.py: a frozen
#: worker's claim may hold a slot until the server ends its session).
CONTROL_SLOTS_TRY = (
    "SELECT (SELECT s FROM generate_series(%s::int, %s::int - 1) s "
    "WHERE NOT pg_try_advisory_xact_lock(hashtext('zeroloss.limit:' || %s), s) LIMIT 1)"
)
#: A slot claim's tokens, from its own slot's share of the bucket, which no other claim writes
#: (each holds its own slot; the exact path and an operator's change hold all of them): what
#: the share held at the read's clock, less what was claimed. The row the queue's other claims
#: wait for is never written on this path.
CONTROL_BUCKET_SPEND = (
    "INSERT INTO {bucket} (queue_name, slot, tokens, refilled_at) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (queue_name, slot) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at"
)
#: The exact path of a rate kept in slot shares (holding every slot): all of the queue's shares.
CONTROL_BUCKETS = "SELECT slot, tokens, refilled_at FROM {bucket} WHERE queue_name = %s"
#: ... and every share after its claim: refilled to the clock, less its part of what was claimed.
CONTROL_BUCKETS_SPEND = (
    "INSERT INTO {bucket} (queue_name, slot, tokens, refilled_at) SELECT %s, u.s, u.t, u.r "
    "FROM unnest(%s::int[], %s::float8[], %s::timestamptz[]) AS u(s, t, r) ON CONFLICT (queue_name, slot) "
    "DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at"
)
#: A changed limit starts full shares (as it starts a full bucket).
CONTROL_BUCKETS_RESET = "DELETE FROM {bucket} WHERE queue_name = %s"
#: The Celery transport at a resume or a limit change: the queue's waiting messages were
#: published and their tasks absorbed (paused, at a limit); no broker message carries them any
#: more, so they are marked for the redispatch that follows the change's commit.
CONTROL_UNDISPATCH = (
    "UPDATE {msg} SET dispatched_at = NULL WHERE queue_name = %s AND status = 'pending' "
    "AND available_at <= {now} AND dispatched_at IS NOT NULL"
)
