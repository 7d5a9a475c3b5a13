"""The recovery sweep: every expired lease back to pending (or dead) exactly once."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time

from django.db import DatabaseError, transaction

from . import events, partitions
from .base import Part, logger
from .models import Status
from .types import RecoveryReport
from .validation import validate_count

#: A waiting message this old whose key has no head was missed by its promotion (a process
#: died between commit and promotion); younger ones are left to their own sender.
REPAIR_AFTER = 5.0
#: A sweep examines the leases that expired since this long before its previous complete sweep
#: began (statements.SWEEP): longer than a lease's rows stay locked past its expiry (a batch's
#: transaction is ended at its lease's deadline) or a claim that computed its lease before a wait.
SWEEP_REWIND = dt.timedelta(seconds=30)
#: And every this many seconds, every expired lease however old (whatever a bound missed).
SWEEP_FROM_HEAD_EVERY = 60.0
_LONG_AGO = dt.datetime(1, 1, 2, tzinfo=dt.UTC)
#: How often a sweeping process looks at a partitioned ledger's partitions ahead, in seconds.
PARTITIONS_EVERY = 60.0
#: When each database's partitions were last looked at by this process (monotonic clock).
PARTITIONS_CHECKED: dict[str, float] = {}
#: How often a sweeping process looks for stranded workflow steps, in seconds: a read over the
#: waiting steps, for what should never happen (the release is in the outcome's transaction).
STRANDED_EVERY = 60.0
#: When each database's stranded steps were last looked for by this process (monotonic clock).
STRANDED_CHECKED: dict[str, float] = {}


class Recovery(Part):
    """The recovery sweep, and the repair of ordering keys left without a head."""

    def sweep(self, *, batch_size: int | None = None, limit: int | None = None) -> RecoveryReport:
        """Requeue (or dead-letter) every processing message whose lease expired, exactly once.

        Safe with any number of concurrent sweepers: each row is moved by one conditional
        UPDATE under ``FOR UPDATE SKIP LOCKED``, so a row is swept by exactly one of them.
        A message whose lease is renewed in time never matches. Also releases the next
        message of any ordering key left without a head (see :meth:`repair_ordering_keys`).
        """
        with events.span("sweep"):  # each message moved: an event of this span
            return self._recover(batch_size, limit)

    def _recover(self, batch_size: int | None, limit: int | None) -> RecoveryReport:
        batch = validate_count(
            self.settings.SWEEP_BATCH_SIZE if batch_size is None else batch_size, "batch_size"
        )
        if limit is not None:
            validate_count(limit, "limit")
        if self.engine.single_writer:
            report = self._recover_batches(batch, limit)
        else:
            # The clock, the first batch and the key repair commit together: a sweep that finds
            # nothing (an idle ledger's, every SWEEP_INTERVAL) is one transaction. Whatever a
            # full first batch left follows, each batch in its own.
            first = batch if limit is None else min(batch, limit)
            with transaction.atomic(using=self.using):
                report = self._recover_batches(batch, first)
            moved = report.total + len(report.cancelled)
            if moved >= first and (limit is None or moved < limit):
                more = self._recover_batches(batch, None if limit is None else limit - moved)
                report = RecoveryReport(
                    requeued=report.requeued + more.requeued,
                    dead_lettered=report.dead_lettered + more.dead_lettered,
                    batches=report.batches + more.batches,
                    keys_repaired=report.keys_repaired + more.keys_repaired,
                    cancelled=report.cancelled + more.cancelled,
                )
        self._partitions_ahead()
        stranded = self._release_stranded()
        if stranded:
            report = dataclasses.replace(report, released_stranded=stranded)
        return report

    def _recover_batches(self, batch: int, limit: int | None) -> RecoveryReport:
        actor = f"sweep@{self.instance_id}"
        requeued: list[str] = []
        dead: list[str] = []
        cancelled: list[str] = []  # aborted, their worker gone: never run again
        finished_keys: set[tuple[str, str]] = set()
        batches = 0
        since, began, from_head = self._sweep_bound()
        complete = False
        while limit is None or len(requeued) + len(dead) + len(cancelled) < limit:
            if self.engine.single_writer and not self._run("ANY_EXPIRED", {})[0]:
                # A read needs no lock (SQLite in WAL mode); the write below takes the database's
                # only write lock, so take it only when there is work.
                break
            size = batch if limit is None else min(batch, limit - len(requeued) - len(dead) - len(cancelled))
            with transaction.atomic(using=self.using, savepoint=False):
                rows = self._move("SWEEP", {"since": since, "limit": size}, actor=actor)
                self.ctx.workflows.settle_moved(rows)  # a workflow's step ended: its dependents
            batches += 1
            if rows:
                self.ctx.emit(events.of_sweep(self.using, rows))
            for row in rows:
                {Status.DEAD: dead, Status.CANCELLED: cancelled}.get(row[2], requeued).append(row[1])
                if row[2] in (Status.DEAD, Status.CANCELLED) and row[9]:
                    finished_keys.add((row[8], row[9]))
            if len(rows) < size:
                complete = True
                break
        if complete and began is not None:
            self.__dict__["_swept"] = (began, time.monotonic() if from_head else self._sweep_state()[1])
        if finished_keys:
            self.promote_keys(finished_keys)
        repaired = self.repair_ordering_keys()
        return RecoveryReport(
            requeued=requeued,
            dead_lettered=dead,
            batches=batches,
            keys_repaired=len(repaired),
            cancelled=cancelled,
        )

    def _sweep_bound(self) -> tuple[object, dt.datetime | None, bool]:
        """The oldest lease expiry this sweep examines, when it began (database clock), and
        whether it is a sweep from the head. SQLite keeps no dead versions in its indexes: every
        sweep there examines every expired lease."""
        if not self.engine.keeps_dead_index_entries:
            return "0001-01-01 00:00:00", None, True
        swept_from, head_at = self._sweep_state()
        began = self.database_now()
        if swept_from is None or time.monotonic() - head_at > SWEEP_FROM_HEAD_EVERY:
            return _LONG_AGO, began, True
        return swept_from - SWEEP_REWIND, began, False

    def _sweep_state(self) -> tuple[dt.datetime | None, float]:
        """When this sweeper's last complete sweep began (database clock), and when (monotonic)
        its last complete sweep from the head ended."""
        state: tuple[dt.datetime | None, float] = self.__dict__.get("_swept", (None, 0.0))
        return state

    def repair_ordering_keys(self, *, limit: int = 1000) -> list[str]:
        """Release the next message of every ordering key that has waiting messages but no head.

        Only a process dying between a commit and its promotion leaves a key so; this is the
        safety net the sweep runs. Returns the ids made claimable.
        """
        rows, _ = self._run("REPAIR_KEYS", {"after": -REPAIR_AFTER, "limit": limit})
        if not rows:
            return []
        keys = sorted({(r[0], r[1]) for r in rows})
        queues, names = zip(*keys, strict=True)
        # A head row that outlived its head would refuse every promotion of its key.
        with transaction.atomic(using=self.using):
            batch = self.engine.batch(q=queues, k=names)
            self._run("HEAD_LOCK", batch)
            self._run("HEAD_STALE", batch)
        return self.promote_keys(keys)

    def _release_stranded(self) -> list[str]:
        """The safety net of workflows, at most every STRANDED_EVERY seconds a process: release
        the waiting steps whose every dependency settled (their release was missed). Expected:
        none; each found is logged."""
        now = time.monotonic()
        if now - STRANDED_CHECKED.get(self.using, -STRANDED_EVERY) < STRANDED_EVERY:
            return []
        STRANDED_CHECKED[self.using] = now
        found = self.ctx.workflows.stranded()
        if not found:
            return []
        released = self.ctx.workflows.release_stranded(
            [pk for pk, _ in found], actor=f"sweep@{self.instance_id}"
        )
        if released:
            logger.warning(
                "zeroloss: sweep released %d workflow step(s) left waiting with every dependency "
                "settled on %r (expected none; please report it): %s",
                len(released),
                self.using,
                ", ".join(released),
            )
        return released

    def ensure_partitions(self) -> list[str]:
        """A partitioned ledger (PostgreSQL): create the partitions missing from now's period to
        ``PARTITIONS_AHEAD`` periods ahead; the names of the message partitions created."""
        return partitions.ensure_ahead(
            self.connection, int(self.settings.PARTITION_PERIOD), self.settings.PARTITIONS_AHEAD
        )

    def _partitions_ahead(self) -> None:
        """The sweep's share of partition management, at most every PARTITIONS_EVERY seconds a
        process; a failure (a lock not granted within a second) waits for the next round."""
        if not self.engine.partitions_by_period:
            return
        now = time.monotonic()
        if now - PARTITIONS_CHECKED.get(self.using, -PARTITIONS_EVERY) < PARTITIONS_EVERY:
            return
        PARTITIONS_CHECKED[self.using] = now
        try:
            created = self.ensure_partitions()
        except DatabaseError as exc:
            logger.warning(
                "zeroloss: partitions ahead not created on %r (%s); next try in %.0f s",
                self.using,
                exc,
                PARTITIONS_EVERY,
            )
            return
        if created:
            logger.info("zeroloss: partitions created on %r: %s", self.using, ", ".join(created))
