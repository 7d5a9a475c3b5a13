"""The statements of leases (part of the catalogue: :mod:`.statements` imports them): claims,
renewals, the lease holder's outcomes, and the recovery sweep of expired leases."""

from __future__ import annotations

from ..core.states import Reason
from ..core.states import Status as S
from .catalogue import Catalogue
from .statements_moves import Moving, edge

#: The lease holder's outcomes, the claims and the sweep, and what else of leases is written
#: whole (parts of :data:`.statements.WHOLE`).
OUTCOMES = Catalogue("sql/outcomes.sql")
LEASES = Catalogue("sql/leases.sql")
CLAIMS = Catalogue("sql/claims.sql")

# -- leases ---------------------------------------------------------------------------

#: What a claim returns besides the audit row's columns (sql/claims.sql writes them).
_CLAIM_RETURNING = (
    "lease_token",
    "lease_expires_at",
    "payload",
    "max_attempts",
    "priority",
    "headers",
    "available_at",
    "workflow_id",
)
# The claims (CLAIM, CLAIM_LIMITED, CLAIM_BY_ID) and the recovery sweep (SWEEP) are written
# whole in sql/claims.sql.
# The lease holder's outcomes (ACK, FAIL, FAIL_FINAL, SNOOZE, RELEASE and their _LOCKED forms,
# ACK_ONE, SNOOZE_COUNTS) are written whole in sql/outcomes.sql; its renewals (RENEW,
# RENEW_BUSY), the revival of leases that ran out untaken (REVIVE), the release of a lost
# claim's leases (RELEASE_UNKNOWN), its reads (LEASED_ATTEMPT, LOCK_HELD, OWN_EVENTS,
# NEXT_AVAILABLE, ANY_EXPIRED) and its transactions' settings (BATCH_OPEN, PLAN_CLAIM, ...) in
# sql/leases.sql.

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
        "REVIVE",
    }
)

#: What a claim hands back to build its leases (no audit-only columns: less to convert).
LEASE_COLUMNS = (
    "id",
    "message_id",
    "attempts",
    "queue_name",
    "ordering_key",
    *_CLAIM_RETURNING,
    "created_at",
)
_CLAIMED = Moving(
    "worker",
    (edge(S.PENDING, S.PROCESSING, Reason.CLAIMED),),
    returning=_CLAIM_RETURNING,
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
