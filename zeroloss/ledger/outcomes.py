"""The lease holder's outcomes (acknowledge, fail, release), fenced, one at a time or in batches.

Every outcome needs the current lease token, a message still ``processing`` and an unexpired
lease (database clock): a worker that lost its lease cannot record anything. Outcomes can be
recorded one at a time or in batches (:meth:`Outcomes.record`): one statement per kind of
outcome for any number of messages, each row fenced on its own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction

from ..core.states import Status
from ..exceptions import InvalidMessage
from . import events
from .base import Part
from .types import Completion, CompletionReport, Lease, Verdict
from .validation import canonical_json, clean_text, validate_message_id


class Outcomes(Part):
    """The lease holder's outcomes: acknowledge, fail, release; many at once; fenced all."""

    # -- one outcome at a time --------------------------------------------------------------

    def acknowledge(self, message_id: str, lease_token: uuid.UUID | str, *, result: Any = None) -> bool:
        """Complete the message, only for the holder of the current, unexpired lease (fencing)."""
        validate_message_id(message_id)
        token = self._token(lease_token)
        encoded = None if result is None else canonical_json(result)
        # ACK for one row, with scalar parameters (arrays cost client CPU to dump). A workflow's
        # step (its id has the workflow's id and a slash before its name) settles its dependents
        # in the same transaction; any other message is one statement, in autocommit.
        params = {"result": encoded, "mid": message_id, "tok": token}
        if "/" not in message_id:
            rows = self._move("ACK_ONE", params)
        else:
            with transaction.atomic(using=self.using, savepoint=False):
                rows = self._move("ACK_ONE", params)
                if rows:
                    self.ctx.workflows.settle_ids([(message_id, Status.COMPLETED.value)])
        if not rows:  # refused: an aborted message is recorded cancelled instead
            self.ctx.aborts.cancel_aborted([message_id], [token])
        return bool(rows)

    def fail(self, message_id: str, lease_token: uuid.UUID | str, error: str) -> bool:
        """Record a failed attempt: back to pending after a backoff, or dead when attempts are spent.

        ``False`` (and nothing written) when the caller no longer holds a live lease.
        """
        validate_message_id(message_id)
        token = self._token(lease_token)
        rows, _ = self._run(
            "LEASED_ATTEMPT",
            {"mid": message_id, "tok": token},
            prepare=True,
        )
        if not rows:
            return False
        delay = self.settings.RETRY_BACKOFF.delay_for(rows[0][0])
        failed = ([message_id], [token], [clean_text(error)], [delay], [None])
        if "/" not in message_id:  # not a workflow's step: one statement (see acknowledge())
            moved = self._fail("FAIL", *failed, statuses=True)
        else:
            with transaction.atomic(using=self.using, savepoint=False):
                moved = self._fail("FAIL", *failed, statuses=True)
                self.ctx.workflows.settle_ids([(mid, status) for mid, status in moved])
        if moved:
            return True
        self.ctx.aborts.cancel_aborted([message_id], [token])  # refused: an aborted message is cancelled
        return False

    def release(self, message_id: str, lease_token: uuid.UUID | str) -> bool:
        """Give back a claimed message that was never started (clean shutdown).

        Back to pending at once, and the unused attempt is not counted.
        """
        validate_message_id(message_id)
        token = self._token(lease_token)
        if self._release([message_id], [token], [None], "released unstarted at worker shutdown"):
            return True
        self.ctx.aborts.cancel_aborted([message_id], [token])  # refused: an aborted message is cancelled
        return False

    # -- many outcomes at once ------------------------------------------------------------

    def record(self, completions: Iterable[Completion], *, locked: bool = False) -> CompletionReport:
        """Record many outcomes: one fenced statement per kind, all in one transaction.

        A row whose lease is no longer held is left untouched and reported in ``refused``,
        exactly as a single acknowledgement returns ``False``. ``locked=True`` only inside
        the transaction of :meth:`lock_held`, whose row locks fence the batch instead of the
        clock. Raises :class:`InvalidPayload` (nothing written) if a result is not JSON.
        """
        batch = list(completions)
        with events.settle_span(batch):
            return self._record(batch, locked)

    def _record(self, batch: list[Completion], locked: bool) -> CompletionReport:
        if not batch:
            return CompletionReport()
        engine = self.engine
        by_kind: dict[Verdict, list[Completion]] = {v: [] for v in Verdict}
        for c in batch:
            if c.verdict not in by_kind:
                raise InvalidMessage(f"Unknown verdict {c.verdict!r}: use zeroloss.ledger.types.Verdict.")
            by_kind[c.verdict].append(c)
        acks, fails, releases = by_kind[Verdict.ACKNOWLEDGE], by_kind[Verdict.FAIL], by_kind[Verdict.RELEASE]
        snoozes, finals = by_kind[Verdict.SNOOZE], by_kind[Verdict.FAIL_FINAL]
        results = [None if c.result is None else canonical_json(c.result) for c in acks]
        report = CompletionReport()
        with transaction.atomic(using=self.using, savepoint=False):
            if snoozes:
                snoozes, spent = self._within_snoozes(snoozes)
                fails = [*fails, *spent]
            if acks:
                done = self._ack(
                    "ACK_LOCKED" if locked else "ACK",
                    [c.lease.message_id for c in acks],
                    [engine.token(c.lease.token) for c in acks],
                    results,
                    [c.lease.created_at for c in acks],
                    promote=any(c.lease.ordering_key for c in acks),
                )
                report.acknowledged.extend(done)
            if fails:
                backoff = self.settings.RETRY_BACKOFF
                delays = [backoff.delay_for(c.lease.attempt) if c.delay is None else c.delay for c in fails]
                moved = self._fail(
                    "FAIL_LOCKED" if locked else "FAIL",
                    [c.lease.message_id for c in fails],
                    [engine.token(c.lease.token) for c in fails],
                    [clean_text(c.error) for c in fails],
                    delays,
                    [c.lease.created_at for c in fails],
                    statuses=True,
                    promote=any(c.lease.ordering_key for c in fails),
                )
                for mid, status in moved:
                    (report.dead_lettered if status == Status.DEAD else report.retrying).append(mid)
            if finals:
                report.dead_lettered.extend(
                    self._fail_final(
                        "FAIL_FINAL_LOCKED" if locked else "FAIL_FINAL",
                        finals,
                        promote=any(c.lease.ordering_key for c in finals),
                    )
                )
            if snoozes:
                report.snoozed.extend(self._snooze("SNOOZE_LOCKED" if locked else "SNOOZE", snoozes))
            if releases:
                detail = clean_text(releases[0].error or "released unstarted")
                report.released.extend(
                    self._release(
                        [c.lease.message_id for c in releases],
                        [engine.token(c.lease.token) for c in releases],
                        [c.lease.created_at for c in releases],
                        detail,
                    )
                )
            recorded = {
                *report.acknowledged,
                *report.retrying,
                *report.dead_lettered,
                *report.released,
                *report.snoozed,
            }
            if len(recorded) < len(batch):  # aborted ones are refused every outcome but this
                left = [c.lease for c in batch if c.lease.message_id not in recorded]
                tokens = [engine.token(x.token) for x in left]
                report.cancelled.extend(
                    self.ctx.aborts.cancel_aborted(
                        [x.message_id for x in left], tokens, [x.created_at for x in left], locked=locked
                    )
                )
                recorded.update(report.cancelled)
            if any(c.lease.workflow_id for c in batch):
                self._settle_steps(batch, report)
        report.refused.extend(c.lease.message_id for c in batch if c.lease.message_id not in recorded)
        finished = {
            (c.lease.queue_name, c.lease.ordering_key)
            for c in batch
            if c.lease.ordering_key
            and c.lease.message_id in recorded
            and c.lease.message_id not in report.retrying
            and c.lease.message_id not in report.released
            and c.lease.message_id not in report.snoozed
        }
        if finished:
            # The statements released each key's next message; this catches one stored
            # concurrently, which they could not see (docs/ordering.md).
            self._promote_after_commit(
                finished, sorted(c.lease.message_id for c in batch if c.lease.ordering_key)
            )
        kinds: list[type] = [events.Finished]
        kinds += [events.DeadLettered] if report.dead_lettered else []
        kinds += [events.Cancelled] if report.cancelled else []
        kinds += [events.Released] if report.released else []
        if events.wanted(*kinds):  # told once the outcomes are durable (never for a rollback)
            self.ctx.emit(events.of_outcomes(self.using, self.instance_id, batch, report))
        return report

    def _settle_steps(self, batch: list[Completion], report: CompletionReport) -> None:
        """Workflows' steps (docs/workflows.md): what an acknowledged step added to its workflow,
        then its dependents settled, in this transaction; only what the fenced statements moved."""
        steps = [c for c in batch if c.lease.workflow_id]
        done = set(report.acknowledged)
        workflows = self.ctx.workflows
        for c in steps:
            if c.steps and c.lease.message_id in done:
                workflows.add_steps(c.lease.message_id, c.lease.workflow_id, c.steps)
        ended = {
            **dict.fromkeys(report.acknowledged, Status.COMPLETED.value),
            **dict.fromkeys(report.dead_lettered, Status.DEAD.value),
            **dict.fromkeys(report.cancelled, Status.CANCELLED.value),
        }
        settled = [
            (c.lease.message_id, ended[c.lease.message_id]) for c in steps if c.lease.message_id in ended
        ]
        if settled:
            workflows.settle(settled)

    def lock_held(self, leases: Sequence[Lease]) -> set[str]:
        """Inside ``transaction.atomic``: lock the rows of ``leases`` still held (fenced, unexpired).

        Until the transaction ends nobody else can move them (the sweep skips locked rows), so
        :meth:`record` with ``locked=True`` may record their outcomes however long it ran, and
        the caller must bound the transaction itself. The built-in worker does not use this: its
        transactional batches are held by their leases (docs/guarantees.md).
        """
        if not self.connection.in_atomic_block:
            raise InvalidMessage("lock_held() must run inside transaction.atomic().")
        engine = self.engine
        batch = engine.batch(mid=[x.message_id for x in leases], tok=[engine.token(x.token) for x in leases])
        rows, _ = self._run("LOCK_HELD", {**batch, **engine.period([x.created_at for x in leases])})
        return {r[0] for r in rows}

    def own_outcomes(self, leases: Sequence[Lease]) -> dict[str, str]:
        """Which of these leases' outcomes this instance recorded (message id -> reason).

        Asked after a commit whose outcome was lost: a refused retry of an outcome that did land
        is then told apart from a lease that was really lost.
        """
        if not leases:
            return {}
        batch = self.engine.batch(mid=[x.message_id for x in leases], att=[x.attempt for x in leases])
        rows, _ = self._run("OWN_EVENTS", {**batch, "actor": self.instance_id})
        return {r[0]: r[1] for r in rows}

    # -- the statements ---------------------------------------------------------------------

    def _ack(
        self,
        name: str,
        ids: list[str],
        tokens: list[Any],
        results: list[str | None],
        created: Sequence[dt.datetime | None],
        *,
        promote: bool = True,
    ) -> list[str]:
        # ``promote``: the statement also releases the next message of each finished ordering
        # key; a batch whose leases carry no key leaves that part out (a smaller plan to run).
        engine = self.engine
        params = {**engine.batch(mid=ids, tok=tokens, res=results), **engine.period(created)}
        rows = self._move(name, params, keyed=promote)
        return [r[1] for r in rows]

    def _fail(
        self,
        name: str,
        ids: list[str],
        tokens: list[Any],
        errors: list[str],
        delays: list[float],
        created: Sequence[dt.datetime | None],
        *,
        statuses: bool = False,
        promote: bool = True,
    ) -> list[Any]:
        engine = self.engine
        params = {**engine.batch(mid=ids, tok=tokens, err=errors, delay=delays), **engine.period(created)}
        rows = self._move(name, params, keyed=promote)
        return [(r[0], r[1]) for r in rows] if statuses else [r[0] for r in rows]

    def _fail_final(self, name: str, batch: list[Completion], *, promote: bool) -> list[str]:
        engine = self.engine
        params = {
            **engine.batch(
                mid=[c.lease.message_id for c in batch],
                tok=[engine.token(c.lease.token) for c in batch],
                err=[clean_text(c.error) for c in batch],
            ),
            **engine.period([c.lease.created_at for c in batch]),
        }
        return [r[0] for r in self._move(name, params, keyed=promote)]

    def _within_snoozes(self, batch: list[Completion]) -> tuple[list[Completion], list[Completion]]:
        """The snoozes within ``MAX_SNOOZES``, and those past it made failed attempts (retried
        after their delay): a message cannot snooze for ever."""
        rows, _ = self._run("SNOOZE_COUNTS", {"mid": self.engine.column(c.lease.message_id for c in batch)})
        counts = {r[0]: int(r[1]) for r in rows}
        limit = self.settings.MAX_SNOOZES
        within: list[Completion] = []
        spent: list[Completion] = []
        for c in batch:
            n = counts.get(c.lease.message_id, 0)
            if n < limit:
                within.append(c)
                continue
            note = f"\n(snoozed {n} times already, MAX_SNOOZES is {limit}: counted as a failed attempt)"
            spent.append(
                Completion(c.lease, Verdict.FAIL, error=clean_text(c.error.rstrip() + note), delay=c.delay)
            )
        return within, spent

    def _snooze(self, name: str, batch: list[Completion]) -> list[str]:
        """One statement per audit detail (its first line: ``Snooze(delay=30) raised: ...``)."""
        engine = self.engine
        by_detail: dict[str, list[Completion]] = {}
        for c in batch:
            detail = clean_text(c.error.partition("\n")[0] or "Snooze() raised", 500)
            by_detail.setdefault(detail, []).append(c)
        snoozed: list[str] = []
        for detail, group in by_detail.items():
            params = {
                **engine.batch(
                    mid=[c.lease.message_id for c in group],
                    tok=[engine.token(c.lease.token) for c in group],
                    delay=[0.0 if c.delay is None else c.delay for c in group],
                ),
                **engine.period([c.lease.created_at for c in group]),
            }
            snoozed.extend(r[0] for r in self._move(name, params, detail=detail))
        return snoozed

    def _release(
        self, ids: list[str], tokens: list[Any], created: Sequence[dt.datetime | None], detail: str
    ) -> list[str]:
        params = {**self.engine.batch(mid=ids, tok=tokens), **self.engine.period(created)}
        rows = self._move("RELEASE", params, detail=detail)
        return [r[1] for r in rows]
