"""The statements of leases (part of the catalogue: :mod:`.statements` imports them): claims,
renewals, the lease holder's outcomes, and the recovery sweep of expired leases."""

from __future__ import annotations

from ..core.states import Reason
from ..core.states import Status as S
from .catalogue import Catalogue
from .statements_moves import Moving, edge

#: The lease holder's outcomes, and what else of leases is written whole (parts of
#: :data:`.statements.WHOLE`).
OUTCOMES = Catalogue("sql/outcomes.sql")
LEASES = Catalogue("sql/leases.sql")

# -- leases ---------------------------------------------------------------------------

_CLAIM_SET = (
    "UPDATE {msg} SET status = 'processing', attempts = attempts + 1, lease_token = {new_token}, "
    "lease_expires_at = {clock_after}, claimed_by = %s, started_at = {clock}, updated_at = {clock} WHERE "
)
CLAIM_RETURNING = ", lease_token, lease_expires_at, payload, max_attempts, priority, headers, available_at"
# The claim index holds every version a claim moved out of it (one per message): while anything
# holds the xmin horizon back (an idle transaction, a long report), none is removed, and a claim
# that starts at the head of the queue visits them all, oldest first: at 800 msg/s, 48,000 a
# minute, each a heap visit (measured: 51 ms a claim after 90 s). So a claimer starts where its
# previous claim ended: three ranges of the claim index, read in its order, each only as far as
# the claim's LIMIT needs: higher priorities than the remembered one from their head (exact
# priority order), the remembered priority from its remembered ``available_at`` (rewound a little,
# for messages whose sending transaction committed after a later one was claimed), then lower
# priorities from their head. A priority below -100 (none is) makes the first range the whole
# queue: the claim from the head, which every claimer also makes every few seconds for what
# committed further behind (leases.CLAIM_FROM_HEAD_EVERY).
# The status is checked once, where the rows are chosen and locked (a row changed meanwhile is
# checked again, locked): the UPDATE finds them by id alone. Checked again there, a partition
# whose statistics predate its rows (a backlog sent since its last ANALYZE) was planned to find
# them through every pending row of the partition (the status index, rechecked for the ids):
# 45 ms a claim of 100 from 20,000 pending, 2 ms by id (EXPLAIN ANALYZE).
# ``{created_by_now}``: PostgreSQL prunes the partitions of periods to come (the sweep keeps
# PARTITIONS_AHEAD of them, all empty) when the statement starts; nothing where unpartitioned.
_CLAIMABLE = "SELECT id FROM {msg} WHERE status = 'pending' AND queue_name = %s AND available_at <= {now}{created_by_now}"
_CLAIM_ORDER = " ORDER BY priority DESC, available_at, id LIMIT %s{skip_locked}"
_HIGHER = "(" + _CLAIMABLE + " AND priority > %s" + _CLAIM_ORDER + ") a"
_AFTER = "(" + _CLAIMABLE + " AND priority = %s AND available_at >= %s" + _CLAIM_ORDER + ") r"
_LOWER = "(" + _CLAIMABLE + " AND priority < %s" + _CLAIM_ORDER + ") z"
CLAIM = (
    _CLAIM_SET
    + "{in_open}SELECT id FROM (SELECT id FROM "
    + _HIGHER
    + " UNION ALL SELECT id FROM "
    + _AFTER
    + " UNION ALL SELECT id FROM "
    + _LOWER
    + ") c LIMIT %s{in_close}{created_by_now}"
)
# A claim of a queue under a concurrency limit, inside the transaction that locked the queue's
# control row (control.py): CLAIM, claiming at most the limit less what is processing, counted
# in this statement (it starts after the lock was granted, so it sees every earlier claim).
CLAIM_LIMITED = CLAIM.replace(
    ") c LIMIT %s{in_close}",
    ") c LIMIT (SELECT CASE WHEN r < 0 THEN 0 WHEN r > %s THEN %s ELSE r END FROM (SELECT %s - count(*) "
    "AS r FROM {msg} WHERE queue_name = %s AND status = 'processing') room){in_close}",
)
CLAIM_BY_ID = (
    _CLAIM_SET + "{in_open}SELECT id FROM {msg} WHERE message_id = %s AND status = 'pending' "
    "AND available_at <= {now}{skip_locked}{in_close}"
)
# The lease holder's outcomes (ACK, FAIL, FAIL_FINAL, SNOOZE, RELEASE and their _LOCKED forms,
# ACK_ONE, SNOOZE_COUNTS) are written whole in sql/outcomes.sql; its reads (LEASED_ATTEMPT,
# LOCK_HELD, OWN_EVENTS, NEXT_AVAILABLE, ANY_EXPIRED) and its transactions' settings
# (BATCH_OPEN, PLAN_CLAIM, ...) in sql/leases.sql. ``{in_period}``: bounded by the
# leases' creation times (PostgreSQL: one parameter, the day of the batch's earliest), so that
# the statement is planned without the partitions of earlier periods
# (docs/scaling.md#retention-by-partition); nothing where nothing is partitioned.
_UNEXPIRED = " AND {msg}.lease_expires_at > {clock}"
_FENCED_LEASE = (
    "{msg}.message_id = b.mid AND {msg}.lease_token = b.tok AND {msg}.status = 'processing'"
    + _UNEXPIRED
    + "{in_period}"
)
# The keeper's renewal never waits for a row lock: a row locked elsewhere (a transactional
# batch recording its outcome, an operator's move) is skipped, and RENEW_BUSY tells it apart
# from a lease that is lost.
RENEW = (
    "UPDATE {msg} SET lease_expires_at = {clock_after}, updated_at = {clock} WHERE {in_open}SELECT {msg}.id "
    "FROM {msg}, {rows} WHERE " + _FENCED_LEASE + "{skip_locked_of}{in_close} AND status = 'processing' "
    "AND lease_expires_at > {clock}{in_period} RETURNING message_id"
)
RENEW_BUSY = "SELECT {msg}.message_id FROM {msg}, {rows} WHERE " + _FENCED_LEASE
# A claim whose commit outcome was lost with its connection: give back whatever this claimer
# holds that it does not know about (the attempt is not counted).
RELEASE_UNKNOWN = (
    "UPDATE {msg} SET status = 'pending', attempts = attempts - 1, available_at = {now}, lease_token = NULL, "
    "lease_expires_at = NULL, started_at = NULL, updated_at = {now} WHERE status = 'processing' "
    "AND claimed_by = %s AND lease_expires_at > {now} AND NOT EXISTS (SELECT 1 FROM {rows} "
    "WHERE b.tok = lease_token)"
)

# -- the recovery sweep ---------------------------------------------------------------

_SWEEP_SPENT = "attempts >= max_attempts"
# The lease index keeps the processing version of every message acknowledged since the xmin
# horizon was last free (at 800 msg/s, 48,000 a minute): a probe from the head of expired leases
# visits them all. So a sweep examines the leases that expired since a little before its
# previous complete sweep (``lease_expires_at >= %s``), and every sweep.SWEEP_FROM_HEAD_EVERY
# seconds all of them (the bound: the start of time). The bound is repeated outside: PostgreSQL
# may find the chosen ids through the lease index too (a bitmap of every expired entry).
# An aborted message whose worker died is cancelled, not run again (statements_cancel).
SWEEP = (
    "UPDATE {msg} SET status = CASE WHEN abort_requested_at IS NOT NULL THEN 'cancelled' WHEN "
    + _SWEEP_SPENT
    + " THEN 'dead' ELSE 'pending' END, "
    "dead_at = CASE WHEN abort_requested_at IS NULL AND "
    + _SWEEP_SPENT
    + " THEN {now} END, available_at = {now}, "
    "last_error = 'Lease expired: ' || claimed_by || ' neither acknowledged nor renewed it', "
    "lease_token = NULL, lease_expires_at = NULL, updated_at = {now} "
    "WHERE {in_open}SELECT id FROM {msg} WHERE status = 'processing' AND lease_expires_at < {now} "
    "AND lease_expires_at >= %s ORDER BY lease_expires_at LIMIT %s{skip_locked}{in_close} AND status = 'processing' "
    "AND lease_expires_at < {now} AND lease_expires_at >= %s"
)


#: Fenced statements that join a batch (``unnest`` of its ids and tokens) to the ledger: they
#: run on the hot path's cursor but are planned for each call, never prepared. A prepared
#: statement's generic plan takes the batch for 10 rows and the partial lease index for 1, and
#: nests a loop that unpacks the whole batch again for every leased row of the table
#: (O(batch x leases held); measured: 2.8 of 4.1 ms an acknowledgement of 100, more with every
#: worker). Planned with the batch in hand, PostgreSQL hashes it once (0.2 ms of planning).
PLANNED_PER_CALL = frozenset(
    {
        "ACK",
        "ACK_LOCKED",
        "FAIL",
        "FAIL_LOCKED",
        "FAIL_FINAL",
        "FAIL_FINAL_LOCKED",
        "SNOOZE",
        "SNOOZE_LOCKED",
        "SNOOZE_COUNTS",
        "RELEASE",
        "RENEW",
        "RENEW_BUSY",
    }
)

_MID_TOK = (("mid", "text"), ("tok", "uuid"))
LEASE_ROWS: dict[str, tuple[tuple[str, str], ...]] = {
    "RENEW": _MID_TOK,
    "RENEW_BUSY": _MID_TOK,
    "RELEASE_UNKNOWN": (("tok", "uuid"),),
}

#: What a claim hands back to build its leases (no audit-only columns: less to convert).
LEASE_COLUMNS = (
    "id",
    "message_id",
    "attempts",
    "queue_name",
    "ordering_key",
    "lease_token",
    "lease_expires_at",
    "payload",
    "max_attempts",
    "priority",
    "headers",
    "available_at",
    "created_at",
)
_CLAIMED = Moving(
    "worker",
    (edge(S.PENDING, S.PROCESSING, Reason.CLAIMED),),
    returning=CLAIM_RETURNING,
    result=LEASE_COLUMNS,
)
_ACKED = (edge(S.PROCESSING, S.COMPLETED, Reason.ACKNOWLEDGED),)
# The dead-letter edge first: the reason is chosen by the new status (statements_moves).
_FAILED = Moving(
    "worker",
    (
        edge(S.PROCESSING, S.DEAD, Reason.DEAD_LETTERED),
        edge(S.PROCESSING, S.PENDING, Reason.FAILED),
    ),
    detail="last_error",
    result=("message_id", "status"),
)
_RELEASED = Moving("worker", (edge(S.PROCESSING, S.PENDING, Reason.RELEASED),))
_FAILED_FINAL = Moving(
    "worker",
    (edge(S.PROCESSING, S.DEAD, Reason.DEAD_LETTERED_BY_HANDLER),),
    detail="last_error",
    result=("message_id", "status"),
)
_SNOOZED = Moving("worker", (edge(S.PROCESSING, S.PENDING, Reason.SNOOZED),), result=("message_id",))

#: The edges each moving statement of this module performs (see :mod:`.statements_moves`).
LEASE_MOVES: dict[str, Moving] = {
    "CLAIM": _CLAIMED,
    "CLAIM_LIMITED": _CLAIMED,
    "CLAIM_BY_ID": _CLAIMED,
    # One acknowledgement: only whether it moved a row matters.
    "ACK_ONE": Moving("worker", _ACKED, result=("message_id",)),
    "ACK": Moving("worker", _ACKED),
    "ACK_LOCKED": Moving("worker", _ACKED),
    "FAIL": _FAILED,
    "FAIL_LOCKED": _FAILED,
    "FAIL_FINAL": _FAILED_FINAL,
    "FAIL_FINAL_LOCKED": _FAILED_FINAL,
    "SNOOZE": _SNOOZED,
    "SNOOZE_LOCKED": _SNOOZED,
    "RELEASE": _RELEASED,
    "RELEASE_UNKNOWN": _RELEASED,
    "SWEEP": Moving(
        "sweep",
        (
            edge(S.PROCESSING, S.CANCELLED, Reason.ABORTED),
            edge(S.PROCESSING, S.DEAD, Reason.DEAD_LETTERED),
            edge(S.PROCESSING, S.PENDING, Reason.LEASE_EXPIRED),
        ),
        detail="'lease held by ' || claimed_by || ' expired'",
    ),
}
