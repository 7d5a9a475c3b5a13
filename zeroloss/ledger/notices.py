"""What the ledger tells people once an outcome or a sweep is durable: log records and signals.

Run after commit (or at once in autocommit), so nothing is logged or signalled for a change
that was rolled back. Dead letters are logged at ERROR, sweep recoveries at WARNING, each with
the structured fields of docs/logging.md (``message_id``, ``queue``, ``attempt``, ``worker``).
With no signal receiver connected and nothing dead-lettered, none of this runs at all.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from .. import signals, telemetry
from ..states import Status
from .engine import Rows
from .types import Completion, CompletionReport

logger = logging.getLogger("zeroloss")


def wanted_after_outcomes(report: CompletionReport) -> bool:
    """The cheap check :meth:`.outcomes.Outcomes.record` makes on every batch."""
    return bool(
        report.dead_lettered
        or signals.message_finished.receivers
        or signals.message_dead_lettered.receivers
        or telemetry.active()
    )


def outcomes_recorded(
    sender: type, using: str, worker: str, batch: Sequence[Completion], report: CompletionReport
) -> None:
    dead = set(report.dead_lettered)
    finished = signals.message_finished.receivers
    measured = telemetry.active()
    if not dead and not finished and not measured:
        return
    outcome_of = {
        **dict.fromkeys(report.acknowledged, Status.COMPLETED.value),
        **dict.fromkeys(report.retrying, "failed"),
        **dict.fromkeys(report.dead_lettered, Status.DEAD.value),
        **dict.fromkeys(report.refused, "lease_lost"),
        **dict.fromkeys(report.cancelled, Status.CANCELLED.value),
        **dict.fromkeys(report.snoozed, "snoozed"),
    }
    counts: dict[tuple[str, str], int] = {}
    for c in batch:
        lease = c.lease
        mid = lease.message_id
        if mid in dead:
            _log(
                logging.ERROR,
                "%s: dead-lettered after attempt %d of %d: %s",
                (mid, lease.attempt, lease.max_attempts, (c.error or "").partition("\n")[0][:500]),
                mid,
                lease.queue_name,
                lease.attempt,
                worker,
            )
            signals.send(
                signals.message_dead_lettered,
                sender,
                message_id=mid,
                queue_name=lease.queue_name,
                attempt=lease.attempt,
                error=c.error,
                worker=worker,
                using=using,
                by="worker",
            )
            if measured:
                telemetry.dead_lettered(lease.queue_name, mid, lease.attempt, "worker", lease.headers)
        outcome = outcome_of.get(mid)
        if measured and outcome is not None:
            key = (lease.queue_name, outcome)
            counts[key] = counts.get(key, 0) + 1
            if outcome == Status.CANCELLED:
                telemetry.cancelled(lease.queue_name, mid, "worker")
        if finished and outcome is not None:
            signals.send(
                signals.message_finished,
                sender,
                message_id=mid,
                queue_name=lease.queue_name,
                attempt=lease.attempt,
                outcome=outcome,
                error=c.error if outcome in ("failed", Status.DEAD) else "",
                worker=worker,
                using=using,
            )
    if counts:
        telemetry.finished_many(counts)


_HELD_BY = ("lease held by ", " expired")


def swept(sender: type, using: str, rows: Rows) -> None:
    """After a sweep batch: each message put back (WARNING) or dead-lettered (ERROR).

    ``rows`` are the sweep's moved rows (:data:`.statements_moves.MOVED`: ``message_id`` at 1,
    ``status`` 2, ``attempts`` 3, ``detail`` 7, ``queue_name`` 8).
    """
    measured = telemetry.active()
    for row in rows:
        mid, status, attempt, detail, queue = row[1], row[2], row[3], row[7] or "", row[8]
        holder = detail.removeprefix(_HELD_BY[0]).removesuffix(_HELD_BY[1])
        if status == Status.CANCELLED:
            _log(
                logging.WARNING,
                "%s: cancelled by the sweep: its abort was requested and the lease of attempt %d expired "
                "(held by %s); not run again",
                (mid, attempt, holder),
                mid,
                queue,
                attempt,
                holder,
            )
            if measured:
                telemetry.cancelled(queue, mid, "sweep")
        elif status == Status.DEAD:
            _log(
                logging.ERROR,
                "%s: dead-lettered by the sweep: the lease of its last attempt (%d) expired (held by %s)",
                (mid, attempt, holder),
                mid,
                queue,
                attempt,
                holder,
            )
            signals.send(
                signals.message_dead_lettered,
                sender,
                message_id=mid,
                queue_name=queue,
                attempt=attempt,
                error=detail,
                worker=holder,
                using=using,
                by="sweep",
            )
            if measured:
                telemetry.dead_lettered(queue, mid, attempt, "sweep")
        else:
            _log(
                logging.WARNING,
                "%s: recovered by the sweep: the lease of attempt %d expired (held by %s); pending again",
                (mid, attempt, holder),
                mid,
                queue,
                attempt,
                holder,
            )
            signals.send(
                signals.message_recovered,
                sender,
                message_id=mid,
                queue_name=queue,
                attempt=attempt,
                worker=holder,
                using=using,
            )
            if measured:
                telemetry.recovered(queue, mid, attempt)


def _log(
    level: int, msg: str, args: tuple[Any, ...], mid: str, queue: str, attempt: int, worker: str
) -> None:
    with contextlib.suppress(Exception):  # a broken log handler must not undo a recorded outcome
        logger.log(
            level, msg, *args, extra={"message_id": mid, "queue": queue, "attempt": attempt, "worker": worker}
        )
