"""What operators do by hand (admin, ``zeroloss_requeue``, ``zeroloss_purge``): each audited with their name."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from ..core.states import FINISHED_STATUSES
from ..exceptions import InvalidMessage, MessageNotFound
from . import events, partition_drops, partitions, statements_ops
from .base import Part
from .models import PurgeRecord, Status
from .types import CancelOutcome, CancelResult
from .validation import clean_text, seconds, validate_count, validate_message_id, validate_queue_name
from .workflow_retention import purge_workflows

#: The cut-off that keeps every period holding a message of a status kept for ever.
_KEPT = dt.datetime(1, 1, 2, tzinfo=dt.UTC)

#: Message ids per statement (each statement takes its ids as one parameter; this only bounds
#: the size of one transaction).
CHUNK = 5000


class Operator(Part):
    """What operators do by hand to messages by id, and retention."""

    def _known(self, message_ids: Sequence[str]) -> list[str]:
        """The ids, validated; :class:`MessageNotFound` for the first that does not exist."""
        if isinstance(message_ids, str):
            raise InvalidMessage("message_ids must be a list of ids, not one string.")
        ids = [validate_message_id(m) for m in message_ids]
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            found = {r[0] for r in self._run("KNOWN_IDS", {"ids": self.engine.column(chunk)})[0]}
            missing = [m for m in chunk if m not in found]
            if missing:
                raise MessageNotFound(missing[0])
        return ids

    def _by_ids(
        self,
        name: str,
        ids: Sequence[str],
        *,
        params: dict[str, Any] | None = None,
        detail: str,
        actor: str | None,
    ) -> list[tuple[str, str, str]]:
        """Move ``ids`` with the named statement, in chunks; ``(id, queue, ordering_key)`` moved."""
        reason = self.engine.moves[name].reasons[0]
        with events.span(reason, messages=len(ids), actor=actor or ""):  # an operator action's span
            moved: list[tuple[str, str, str]] = []
            for start in range(0, len(ids), CHUNK):
                chunk = ids[start : start + CHUNK]
                chunk_params = {**(params or {}), "ids": self.engine.column(chunk)}
                with transaction.atomic(using=self.using, savepoint=False):
                    rows = self._move(name, chunk_params, detail=clean_text(detail), actor=actor)
                    self.ctx.workflows.settle_moved(rows)  # a workflow's step ended: its dependents
                moved += [(r[1], r[8], r[9]) for r in rows]
            return moved

    def requeue_messages(
        self, message_ids: Sequence[str], *, actor: str | None = None, force: bool = False, detail: str = ""
    ) -> list[str]:
        """Operator requeue of processing messages whose lease expired (stuck), exactly once.

        With ``force=True`` a *live* lease is revoked too: the running worker's acknowledgement
        will then be refused by fencing. Attempts restart at zero. Returns the ids moved.
        """
        ids = self._known(message_ids)
        moved = self._by_ids(
            "REQUEUE" if force else "REQUEUE_STUCK",
            ids,
            detail=detail or ("live lease revoked" if force else "expired lease requeued"),
            actor=actor,
        )
        return [m[0] for m in moved]

    def redrive_messages(
        self, message_ids: Sequence[str], *, actor: str | None = None, detail: str = ""
    ) -> list[str]:
        """Move dead letters back to pending with attempts reset. Returns the ids moved.

        An ordered message goes back behind its key's current head, if it has one.
        """
        ids = self._known(message_ids)
        moved = self._by_ids(
            "REDRIVE",
            ids,
            detail=detail or "dead letter redriven",
            actor=actor,
        )
        keys = {(queue, key) for _, queue, key in moved if key}
        if keys:
            self._promote_after_commit(keys, [m[0] for m in moved if m[2]])
        return [m[0] for m in moved]

    def redrive_or_requeue(self, message_id: str, *, actor: str | None = None, force: bool = False) -> bool:
        """An operator's requeue of one dead or stuck message. ``False`` if it is in neither state."""
        if self.redrive_messages([message_id], actor=actor):
            return True
        return bool(self.requeue_messages([message_id], actor=actor, force=force))

    def dead_letter_messages(
        self, message_ids: Sequence[str], *, reason: str, actor: str | None = None
    ) -> list[str]:
        """Dead-letter pending or processing messages by hand (a live lease is revoked).

        A dead-lettered head of an ordering key lets the key's next message proceed.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidMessage("A reason is required to dead-letter a message by hand.")
        ids = self._known(message_ids)
        text = clean_text(reason)
        moved: list[tuple[str, str, str]] = []
        with transaction.atomic(using=self.using):
            for name in ("DEAD_LETTER_PENDING", "DEAD_LETTER_PROCESSING"):
                moved += self._by_ids(name, ids, params={"error": text}, detail=text, actor=actor)
        keys = {(queue, key) for _, queue, key in moved if key}
        if keys:
            self._promote_after_commit(keys, [m[0] for m in moved if m[2]])
        return [m[0] for m in moved]

    def cancel_messages(
        self, message_ids: Sequence[str], *, abort: bool = False, actor: str | None = None, detail: str = ""
    ) -> list[CancelResult]:
        """Cancel pending messages; with ``abort=True`` also ask running ones to stop.

        Every id is checked first: a malformed one raises :class:`InvalidMessage`, an unknown one
        :class:`MessageNotFound`, and nothing is changed. Then each message on its own, in one
        transaction: a pending one (claimable, delayed, or waiting behind its ordering key's
        head) becomes ``cancelled`` (a cancelled head lets its key's next message proceed); a
        processing one gets an abort request (``abort=True``; its outcome is ``cancelled`` when
        its handler ends) or is left alone. One result per id, in the order given.
        """
        ids = list(dict.fromkeys(self._known(message_ids)))
        text = clean_text(detail or "cancelled by an operator")
        outcomes: dict[str, CancelOutcome] = {}
        with transaction.atomic(using=self.using):
            # A workflow's waiting steps first: cancelled by the operator, not as dependents of a
            # step cancelled here (docs/workflows.md).
            moved = self._by_ids("STEP_CANCEL_BY_OPERATOR", ids, detail=text, actor=actor)
            done = {x[0] for x in moved}
            moved += self._by_ids("CANCEL", [m for m in ids if m not in done], detail=text, actor=actor)
            outcomes.update(dict.fromkeys((m[0] for m in moved), CancelOutcome.CANCELLED))
            rest = [m for m in ids if m not in outcomes]
            if abort and rest:
                asked = self._by_ids(
                    "ABORT_REQUEST",
                    rest,
                    detail=clean_text(detail or "abort requested by an operator"),
                    actor=actor,
                )
                outcomes.update(dict.fromkeys((m[0] for m in asked), CancelOutcome.ABORT_REQUESTED))
            rows = self._run("STATUS_OF", {"ids": self.engine.column(ids)})[0] if ids else []
        statuses = {r[0]: r[1] for r in rows}
        for mid, status, abort_at in rows:
            if mid in outcomes:
                continue
            if status == Status.PROCESSING:
                outcomes[mid] = CancelOutcome.ABORT_ALREADY_REQUESTED if abort_at else CancelOutcome.RUNNING
            elif status == Status.CANCELLED:
                outcomes[mid] = CancelOutcome.ALREADY_CANCELLED
            else:  # completed or dead (a pending one was cancelled above)
                outcomes[mid] = CancelOutcome.FINISHED
        keys = {(queue, key) for _, queue, key in moved if key}
        if keys:
            self._promote_after_commit(keys, [m[0] for m in moved if m[2]])
        if moved and events.wanted(events.Cancelled):
            self.ctx.emit(
                events.of_cancels(self.using, actor or self.instance_id, [(m[0], m[1]) for m in moved])
            )
        return [CancelResult(m, outcomes[m], statuses.get(m, "")) for m in ids]

    # -- retention ----------------------------------------------------------------------

    def purge_messages(
        self,
        *,
        status: str = Status.COMPLETED,
        older_than: float | dt.timedelta,
        queue_name: str | None = None,
        batch_size: int = 1000,
        actor: str | None = None,
        limit: int | None = None,
    ) -> int:
        """Delete completed or dead messages (and their audit rows) older than ``older_than``.

        Works in short batches so no long lock is held; each batch records a
        :class:`PurgeRecord` so the conservation check stays exact. Expired deduplication
        windows go with them.
        """
        if status not in FINISHED_STATUSES:
            raise InvalidMessage(f"Only completed, dead or cancelled messages can be purged, not {status!r}.")
        age = seconds(older_than, "older_than")
        validate_count(batch_size, "batch_size")
        if limit is not None:
            validate_count(limit, "limit")
        if queue_name is not None:
            validate_queue_name(queue_name)
        actor = validate_message_id(actor, "actor") if actor is not None else self.instance_id
        # A workflow goes whole (docs/workflows.md#retention): here, once every step has this
        # status (of this queue) and is older than the age; first, so that its period can go.
        steps = purge_workflows(
            self,
            lambda q, st: age if st == status and queue_name in (None, q) else None,
            shortest=age,
            actor=actor,
            batch_size=batch_size,
            limit=limit,
        )
        purged = sum(steps.values())
        if status == Status.COMPLETED and queue_name is None and limit is None:
            purged += self._drop_expired_periods(age, actor)
        left = None if limit is None else limit - purged
        if left is None or left > 0:
            purged += self._purge_rows(status, age, queue_name, (), batch_size, actor, left)
        self._run("DEDUP_PURGE", {})
        return purged

    def _purge_rows(
        self,
        status: str,
        age: float,
        queue_name: str | None,
        except_queues: Sequence[str],
        batch_size: int,
        actor: str,
        limit: int | None,
        deadline: float | None = None,
    ) -> int:
        """The row-by-row purge: ``status`` messages older than ``age`` (of ``queue_name``, or of
        every queue but ``except_queues``) deleted in batches, each batch counted into
        ``PurgeRecord`` rows in its transaction; until none is left, ``limit`` or ``deadline``
        (monotonic). The messages purged."""
        engine, conn = self.engine, self.connection
        pick = f"PURGE_PICK_{str(status).upper()}"
        params: dict[str, Any] = {"status": status, "age": -age}
        if queue_name is not None:
            pick, params["queue"] = pick + "_OF_QUEUE", queue_name
        elif except_queues:
            pick, params["queues"] = pick + "_EXCEPT_QUEUES", engine.column(except_queues)
        purged = 0
        while limit is None or purged < limit:
            size = batch_size if limit is None else min(batch_size, limit - purged)
            with transaction.atomic(using=self.using):
                rows, _ = engine.run(conn, statements_ops, pick, {**params, "size": size})
                if not rows:
                    break
                ids = {"ids": engine.column(r[0] for r in rows)}
                engine.run(conn, statements_ops, "PURGE_EVENTS", ids)
                engine.run(conn, statements_ops, "PURGE_KEYS", ids)
                engine.run(conn, statements_ops, "PURGE_MESSAGES", ids)
                counts: dict[str, int] = {}
                for _, queue in rows:
                    counts[queue] = counts.get(queue, 0) + 1
                now = self.database_now()
                PurgeRecord.objects.using(self.using).bulk_create(
                    [
                        PurgeRecord(queue_name=q, status=status, count=n, actor=actor, purged_at=now)
                        for q, n in counts.items()
                    ]
                )
            purged += len(rows)
            if len(rows) < size or (deadline is not None and time.monotonic() >= deadline):
                break
        return purged

    def _drop_expired_periods(self, age: float, actor: str) -> int:
        """A partitioned ledger, outside a transaction: every period whose messages are all past
        retention detached and dropped whole (:meth:`_drop_periods`); the messages it held.
        Elsewhere: 0, and the batches purge row by row."""
        now = self.database_now()
        dead_retention = self.settings.DEAD_LETTER_RETENTION
        dropped = self._drop_periods(
            completed_before=now - dt.timedelta(seconds=age),
            cancelled_before=None,
            dead_before=None if dead_retention is None else now - dt.timedelta(seconds=dead_retention),
            actor=actor,
        )
        return sum(dropped.values())

    def _drop_periods(
        self,
        *,
        completed_before: dt.datetime,
        cancelled_before: dt.datetime | None,
        dead_before: dt.datetime | None,
        actor: str,
    ) -> dict[str, int]:
        """A partitioned ledger, outside a transaction: every period whose messages are all past
        these cut-offs detached and dropped, counted into ``PurgeRecord`` rows
        (:func:`.partition_drops.drop_expired`), then its ids deleted from the key table in short
        batches (:func:`.partition_drops.delete_dropped_keys`); the messages dropped, by status.
        Elsewhere: nothing."""
        conn = self.connection
        if conn.in_atomic_block or not partitions.is_partitioned(conn):
            return {}
        now = self.database_now()

        def record(counts: dict[tuple[str, str], int]) -> None:
            PurgeRecord.objects.using(self.using).bulk_create(
                [
                    PurgeRecord(queue_name=q, status=s, count=n, actor=actor, purged_at=now)
                    for (q, s), n in sorted(counts.items())
                ]
            )

        dropped = partition_drops.drop_expired(
            conn,
            completed_before=completed_before,
            cancelled_before=cancelled_before,
            dead_before=dead_before,
            record=record,
        )
        # counted and gone from every read already; their ids leave the key table in batches
        partition_drops.delete_dropped_keys(conn)
        by_status: dict[str, int] = {}
        for period in dropped:
            for (_, status), n in period.counts.items():
                by_status[status] = by_status.get(status, 0) + n
        return by_status

    def apply_retention(
        self, *, actor: str | None = None, batch_size: int = 1000, deadline: float | None = None
    ) -> dict[str, int]:
        """Remove the finished messages past their retention (``RETENTION``, and each queue's
        own in ``QUEUES``), audited as a purge is (``PurgeRecord`` rows, ``actor``).

        On a partitioned ledger the periods whose every message is past the longest retention
        that applies go whole first (never one holding a live message or a dead letter within
        its retention: the drop's probes and census); then, everywhere, the rest in batches:
        each queue with a retention of its own by it, every other queue by ``RETENTION``.
        Stops starting batches at ``deadline`` (monotonic): the next run goes on. The messages
        removed, by status."""
        actor = validate_message_id(actor, "actor") if actor is not None else f"retention@{self.instance_id}"
        cfg = self.settings
        default = cfg.retention_of(None)
        own = {q: cfg.retention_of(q) for q, declared in cfg.QUEUES.items() if declared.retention}
        removed: dict[str, int] = {str(s): 0 for s in FINISHED_STATUSES}
        # Finished workflows first, whole, once each step is past its status's and queue's
        # retention (docs/workflows.md#retention): a period holding a step is never dropped.
        kept_for = [a for policy in (default, *own.values()) for a in policy.values() if a is not None]
        if kept_for:
            steps = purge_workflows(
                self,
                lambda q, st: cfg.retention_of(q).get(st),
                shortest=min(kept_for),
                actor=actor,
                batch_size=batch_size,
                deadline=deadline,
            )
            for name, n in steps.items():
                removed[name] = removed.get(name, 0) + n
        if self.engine.partitions_by_period:
            # A period goes whole only once past the longest retention any queue has.
            now = self.database_now()
            cut: dict[str, dt.datetime | None] = {}
            for status in FINISHED_STATUSES:
                ages = [policy[status] for policy in (default, *own.values())]
                kept = any(age is None for age in ages)
                cut[status] = None if kept else now - dt.timedelta(seconds=max(a or 0.0 for a in ages))
            if any(c is not None for c in cut.values()):
                dropped = self._drop_periods(
                    completed_before=cut[Status.COMPLETED] or _KEPT,
                    cancelled_before=cut[Status.CANCELLED] or _KEPT,
                    dead_before=cut[Status.DEAD],
                    actor=actor,
                )
                for name, n in dropped.items():
                    removed[name] = removed.get(name, 0) + n
        for status in FINISHED_STATUSES:
            age = default[status]
            if age is not None:
                removed[status] += self._purge_rows(
                    status, age, None, list(own), batch_size, actor, None, deadline
                )
            for queue, policy in own.items():
                age = policy[status]
                if age is not None:
                    removed[status] += self._purge_rows(
                        status, age, queue, (), batch_size, actor, None, deadline
                    )
        self._run("DEDUP_PURGE", {})
        return removed

    def cleanup_completed_messages(self, older_than: float | dt.timedelta | None = None) -> int:
        """Purge completed messages older than ``older_than`` (default ``COMPLETED_RETENTION``)."""
        return self.purge_messages(
            status=Status.COMPLETED,
            older_than=self.settings.COMPLETED_RETENTION if older_than is None else older_than,
        )
