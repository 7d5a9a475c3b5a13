"""Leases: claim, renew, and the lease holder's outcomes (acknowledge, fail, release), fenced.

Every outcome needs the current lease token, a message still ``processing`` and an unexpired
lease (database clock): a worker that lost its lease cannot record anything. Outcomes can be
recorded one at a time or in batches (:meth:`Leasing.complete`): one statement per kind of
outcome for any number of messages, each row fenced on its own.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import OperationalError, transaction

from .. import telemetry
from ..exceptions import InvalidMessage
from . import notices, statements
from .aborts import Aborting
from .control import QueueControlling
from .types import Completion, CompletionReport, Lease, Verdict
from .validation import canonical_json, clean_text, validate_count, validate_message_id, validate_queue_name

_FAILED_REASON = "CASE WHEN status = 'dead' THEN 'dead_lettered' ELSE 'failed' END"
#: What a claim hands back to build its leases (no audit-only columns: less to convert).
_LEASE_COLUMNS = (
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
)
#: How far before the previous claim a claim starts (seconds of ``available_at``): what a
#: sender's transaction may take from its INSERT to its COMMIT and still be claimed at once.
#: Measured from the previous claim's own time, not from the last message it claimed: behind a
#: backlog, that message's ``available_at`` is long before, and nothing sent then is uncommitted.
CLAIM_REWIND = dt.timedelta(seconds=2)
#: Every this many seconds (one claim of each process and queue) a claim starts CLAIM_BEHIND
#: further back, for messages that became claimable behind where claims got to: a transaction
#: that committed later than CLAIM_REWIND after its INSERT, a failed claim's locked rows.
CLAIM_BEHIND_EVERY = 5.0
CLAIM_BEHIND = dt.timedelta(seconds=60)
#: And every this many seconds from the head of the queue: whatever is further behind. Under a
#: held xmin horizon this one visits every version claims left since (see statements.CLAIM).
CLAIM_FROM_HEAD_EVERY = 60.0
#: Below every priority (-100..100): a claim from the head.
_FROM_HEAD = -101
#: When this process last claimed from the head of each (database alias, queue), and from
#: CLAIM_BEHIND back: one such claim finds what is behind every claimer's position, so one is
#: made for all of them.
_HEAD_CLAIMED: dict[tuple[str, str], float] = {}
_BEHIND_CLAIMED: dict[tuple[str, str], float] = {}
#: What a single acknowledgement hands back (only whether it moved a row matters).
_ACKED_COLUMNS = ("message_id",)
#: What an outcome statement hands back.
_OUTCOME_COLUMNS = ("message_id", "status")


class Leasing(QueueControlling, Aborting):
    # -- claims ---------------------------------------------------------------------------

    def _claim_range(self, queue_name: str, limit: int) -> list[Any]:
        """CLAIM's parameters: after this claimer's previous claim of the queue (CLAIM_REWIND
        before it, one claim of the process every CLAIM_BEHIND_EVERY seconds CLAIM_BEHIND before
        it), or from the head (its first claim, one claim of the process every
        CLAIM_FROM_HEAD_EVERY seconds, and always on SQLite, which keeps no dead versions in its
        indexes)."""
        cursor = self.__dict__.setdefault("_claim_cursors", {}).get(queue_name)
        key = (self.using, queue_name)
        now = time.monotonic()
        if cursor is None or now - _HEAD_CLAIMED.get(key, -CLAIM_FROM_HEAD_EVERY) > CLAIM_FROM_HEAD_EVERY:
            _HEAD_CLAIMED[key] = _BEHIND_CLAIMED[key] = now  # this one, not every claimer at once
            priority, since = _FROM_HEAD, None
        else:
            priority, since = cursor
            if now - _BEHIND_CLAIMED.get(key, now) > CLAIM_BEHIND_EVERY:
                _BEHIND_CLAIMED[key] = now
                since -= CLAIM_BEHIND
        group = [queue_name, priority]  # each of the three ranges: its queue and priority bound
        return [*group, limit, *group, since, limit, *group, limit, limit]

    def _remember_claim(self, queue_name: str, rows: list[Any]) -> None:
        """Where the next claim of this claimer starts: its last message's priority, and the
        earlier of that message's ``available_at`` and this claim's time less CLAIM_REWIND."""
        if rows and self.engine.vendor == "postgresql":
            last = min(rows, key=lambda r: (r[9], -r[11], -r[0]))  # the last in the claim's order
            claimed_at = self.engine.at(last[6]) - dt.timedelta(seconds=self.settings.ACK_TIMEOUT)
            since = min(self.engine.at(last[11]), claimed_at - CLAIM_REWIND)
            self.__dict__["_claim_cursors"][queue_name] = (last[9], since)

    def _claim(self, name: str, params: Sequence[Any], cursor_of: str = "") -> list[Lease]:
        engine = self.engine
        self.connection.ensure_connection()
        # Remembered in case this claim's outcome is lost (see release_unknown_claims).
        self._claim_session = engine.session_of(self.connection)
        rows = self._move(
            name,
            [self.settings.ACK_TIMEOUT, self.instance_id, *params],
            source="pending",
            reason="claimed",
            extra=statements.CLAIM_RETURNING,
            result=_LEASE_COLUMNS,
        )
        if cursor_of:
            self._remember_claim(cursor_of, rows)
        # Oldest first within a priority: the order the claim chose (RETURNING keeps none).
        rows.sort(key=lambda r: (-r[9], r[0]))
        leases = [
            Lease(
                message_id=r[1],
                token=engine.to_uuid(r[5]),
                expires_at=engine.at(r[6]),
                attempt=r[2],
                queue_name=r[3],
                payload=engine.to_json(r[7]),
                max_attempts=r[8],
                ordering_key=r[4],
                priority=r[9],
                headers=engine.to_json(r[10]) if r[10] else {},
                available_at=engine.at(r[11]) if r[11] is not None else None,
            )
            for r in rows
        ]
        if leases and telemetry.active():
            telemetry.claimed(cursor_of or leases[0].queue_name, leases)
        return leases

    def claim_next(self, queue_name: str, limit: int = 1) -> list[Lease]:
        """Claim up to ``limit`` available messages of a queue (highest priority, then oldest),
        skipping rows another claimer has locked. Each starts an attempt."""
        validate_queue_name(queue_name)
        validate_count(limit, "limit")
        if self._is_controlled(queue_name):  # paused or limited: claims at most what it allows
            return self._claim_controlled(
                queue_name,
                limit,
                lambda n: self._claim("CLAIM", self._claim_range(queue_name, n), cursor_of=queue_name),
                lambda n, most: self._claim(
                    "CLAIM_LIMITED",
                    [*self._claim_range(queue_name, n), n, most, queue_name],
                    cursor_of=queue_name,
                ),
            )
        params = self._claim_range(queue_name, limit)
        return self._claim("CLAIM", params, cursor_of=queue_name)

    def mark_processing(self, message_id: str) -> Lease | None:
        """Claim one pending, available message. ``None`` if missing, not pending, being claimed,
        or held back by its queue's control (paused, or at a limit: docs/control.md)."""
        validate_message_id(message_id)
        queue = self._queue_of(message_id) if self._any_controlled() else None
        if queue is not None and self._is_controlled(queue):
            leases = self._claim_controlled(queue, 1, lambda n: self._claim("CLAIM_BY_ID", [message_id]))
        else:
            leases = self._claim("CLAIM_BY_ID", [message_id])
        return leases[0] if leases else None

    # -- renewals -------------------------------------------------------------------------

    def renew_lease(self, message_id: str, lease_token: uuid.UUID | str) -> bool:
        """Extend a live lease by ``ACK_TIMEOUT``. ``False`` once the lease was lost or expired."""
        validate_message_id(message_id)
        token = self._token(lease_token)
        rows, _ = self._run(
            "RENEW",
            [self.settings.ACK_TIMEOUT, *self._rows("RENEW", [message_id], [token])],
            prepare=True,
        )
        return bool(rows)

    def renew_leases(self, leases: Iterable[Lease]) -> set[str]:
        """Renew many live leases in one statement; returns the ids whose lease was renewed."""
        held = list(leases)
        if not held:
            return set()
        engine = self.engine
        rows, _ = self._run(
            "RENEW",
            [
                self.settings.ACK_TIMEOUT,
                *self._rows("RENEW", [x.message_id for x in held], [engine.token(x.token) for x in held]),
            ],
            prepare=True,
        )
        return {r[0] for r in rows}

    def busy_leases(self, leases: Iterable[Lease]) -> set[str]:
        """Of leases a renewal skipped, those still held and unexpired: their rows were locked
        elsewhere for the moment (the renewal does not wait for a row lock), not lost."""
        held = list(leases)
        if not held:
            return set()
        engine = self.engine
        rows, _ = self._run(
            "RENEW_BUSY",
            self._rows("RENEW_BUSY", [x.message_id for x in held], [engine.token(x.token) for x in held]),
            prepare=True,
        )
        return {r[0] for r in rows}

    # -- one outcome at a time --------------------------------------------------------------

    def acknowledge_message(
        self, message_id: str, lease_token: uuid.UUID | str, *, result: Any = None
    ) -> bool:
        """Complete the message, only for the holder of the current, unexpired lease (fencing)."""
        validate_message_id(message_id)
        token = self._token(lease_token)
        encoded = None if result is None else canonical_json(result)
        # ACK for one row, with scalar parameters (arrays cost client CPU to dump).
        rows = self._move(
            "ACK_ONE",
            [encoded, message_id, token],
            source="processing",
            reason="acknowledged",
            promote=True,
            result=_ACKED_COLUMNS,
        )
        if not rows:  # refused: an aborted message is recorded cancelled instead
            self._cancel_aborted([message_id], [token])
        return bool(rows)

    def mark_failed(self, message_id: str, lease_token: uuid.UUID | str, error: str) -> bool:
        """Record a failed attempt: back to pending after a backoff, or dead when attempts are spent.

        ``False`` (and nothing written) when the caller no longer holds a live lease.
        """
        validate_message_id(message_id)
        token = self._token(lease_token)
        rows, _ = self._run(
            "LEASED_ATTEMPT",
            [message_id, token],
            prepare=True,
        )
        if not rows:
            return False
        delay = self.settings.RETRY_BACKOFF.delay_for(rows[0][0])
        if self._fail("FAIL", [message_id], [token], [clean_text(error)], [delay]):
            return True
        self._cancel_aborted([message_id], [token])  # refused: an aborted message is cancelled
        return False

    def release_lease(self, message_id: str, lease_token: uuid.UUID | str) -> bool:
        """Give back a claimed message that was never started (clean shutdown).

        Back to pending at once, and the unused attempt is not counted.
        """
        validate_message_id(message_id)
        token = self._token(lease_token)
        if self._release([message_id], [token], "released unstarted at worker shutdown"):
            return True
        self._cancel_aborted([message_id], [token])  # refused: an aborted message is cancelled
        return False

    # -- many outcomes at once ------------------------------------------------------------

    def complete(self, completions: Iterable[Completion], *, locked: bool = False) -> CompletionReport:
        """Record many outcomes: one fenced statement per kind, all in one transaction.

        A row whose lease is no longer held is left untouched and reported in ``refused``,
        exactly as a single acknowledgement returns ``False``. ``locked=True`` only inside
        the transaction of :meth:`lock_held`, whose row locks fence the batch instead of the
        clock. Raises :class:`InvalidPayload` (nothing written) if a result is not JSON.
        """
        batch = list(completions)
        if not batch:
            return CompletionReport()
        engine = self.engine
        by_kind: dict[Verdict, list[Completion]] = {v: [] for v in Verdict}
        for c in batch:
            if c.verdict not in by_kind:
                raise InvalidMessage(f"Unknown verdict {c.verdict!r}: use zeroloss.ledger.types.Verdict.")
            by_kind[c.verdict].append(c)
        acks, fails, releases = by_kind[Verdict.ACKNOWLEDGE], by_kind[Verdict.FAIL], by_kind[Verdict.RELEASE]
        results = [None if c.result is None else canonical_json(c.result) for c in acks]
        report = CompletionReport()
        with transaction.atomic(using=self.using, savepoint=False):
            if acks:
                done = self._ack(
                    "ACK_LOCKED" if locked else "ACK",
                    [c.lease.message_id for c in acks],
                    [engine.token(c.lease.token) for c in acks],
                    results,
                    promote=any(c.lease.ordering_key for c in acks),
                )
                report.acknowledged.extend(done)
            if fails:
                delays = [self.settings.RETRY_BACKOFF.delay_for(c.lease.attempt) for c in fails]
                moved = self._fail(
                    "FAIL_LOCKED" if locked else "FAIL",
                    [c.lease.message_id for c in fails],
                    [engine.token(c.lease.token) for c in fails],
                    [clean_text(c.error) for c in fails],
                    delays,
                    statuses=True,
                    promote=any(c.lease.ordering_key for c in fails),
                )
                for mid, status in moved:
                    (report.dead_lettered if status == "dead" else report.retrying).append(mid)
            if releases:
                detail = clean_text(releases[0].error or "released unstarted")
                report.released.extend(
                    self._release(
                        [c.lease.message_id for c in releases],
                        [engine.token(c.lease.token) for c in releases],
                        detail,
                    )
                )
            recorded = {*report.acknowledged, *report.retrying, *report.dead_lettered, *report.released}
            if len(recorded) < len(batch):  # aborted ones are refused every outcome but this
                left = [c.lease for c in batch if c.lease.message_id not in recorded]
                tokens = [engine.token(x.token) for x in left]
                report.cancelled.extend(
                    self._cancel_aborted([x.message_id for x in left], tokens, locked=locked)
                )
                recorded.update(report.cancelled)
        report.refused.extend(c.lease.message_id for c in batch if c.lease.message_id not in recorded)
        finished = {
            (c.lease.queue_name, c.lease.ordering_key)
            for c in batch
            if c.lease.ordering_key
            and c.lease.message_id in recorded
            and c.lease.message_id not in report.retrying
            and c.lease.message_id not in report.released
        }
        if finished:
            # The statements released each key's next message; this catches one stored
            # concurrently, which they could not see (docs/ordering.md).
            self._promote_after_commit(
                finished, sorted(c.lease.message_id for c in batch if c.lease.ordering_key)
            )
        if notices.wanted_after_outcomes(report):
            # Dead letters logged, signals sent, once the outcomes are durable (never for a rollback).
            self._after_commit(
                lambda: notices.outcomes_recorded(type(self), self.using, self.instance_id, batch, report)
            )
        return report

    def lock_held(self, leases: Sequence[Lease]) -> set[str]:
        """Inside ``transaction.atomic``: lock the rows of ``leases`` still held (fenced, unexpired).

        Until the transaction ends nobody else can move them (the sweep skips locked rows), so
        :meth:`complete` with ``locked=True`` may record their outcomes however long it ran, and
        the caller must bound the transaction itself. The built-in worker does not use this: its
        transactional batches are held by their leases (docs/guarantees.md).
        """
        if not self.connection.in_atomic_block:
            raise InvalidMessage("lock_held() must run inside transaction.atomic().")
        engine = self.engine
        rows, _ = self._run(
            "LOCK_HELD",
            self._rows("LOCK_HELD", [x.message_id for x in leases], [engine.token(x.token) for x in leases]),
        )
        return {r[0] for r in rows}

    def release_unknown_claims(self, held: Iterable[Lease] = ()) -> list[str]:
        """After a claim whose commit outcome was lost: give back every lease this instance holds
        in the ledger but not in ``held`` (it cannot know their tokens). Attempts not counted.

        The lost claim's server session is ended first, and waited for: after a network cut the
        server may still be running it, and would otherwise commit after this release.
        """
        engine = self.engine
        session = getattr(self, "_claim_session", None)
        if session is not None and not engine.end_session(self.connection, session):
            raise OperationalError(f"the lost claim's session {session} is still running; try again")
        tokens = [engine.token(x.token) for x in held]
        rows = self._move(
            "RELEASE_UNKNOWN",
            [self.instance_id, *self._rows("RELEASE_UNKNOWN", tokens)],
            source="processing",
            reason="released",
            detail="released: the claim's commit outcome was lost with its connection",
        )
        return [r[1] for r in rows]

    def own_outcomes(self, leases: Sequence[Lease]) -> dict[str, str]:
        """Which of these leases' outcomes this instance recorded (message id -> reason).

        Asked after a commit whose outcome was lost: a refused retry of an outcome that did land
        is then told apart from a lease that was really lost.
        """
        if not leases:
            return {}
        rows, _ = self._run(
            "OWN_EVENTS",
            [
                *self._rows("OWN_EVENTS", [x.message_id for x in leases], [x.attempt for x in leases]),
                self.instance_id,
            ],
        )
        return {r[0]: r[1] for r in rows}

    # -- the statements ---------------------------------------------------------------------

    def _ack(
        self, name: str, ids: list[str], tokens: list[Any], results: list[str | None], *, promote: bool = True
    ) -> list[str]:
        # ``promote``: the statement also releases the next message of each finished ordering
        # key; a batch whose leases carry no key leaves that part out (a smaller plan to run).
        rows = self._move(
            name,
            self._rows(name, ids, tokens, results),
            source="processing",
            reason="acknowledged",
            promote=promote,
            prepare=True,
        )
        return [r[1] for r in rows]

    def _fail(
        self,
        name: str,
        ids: list[str],
        tokens: list[Any],
        errors: list[str],
        delays: list[float],
        *,
        statuses: bool = False,
        promote: bool = True,
    ) -> list[Any]:
        rows = self._move(
            name,
            self._rows(name, ids, tokens, errors, delays),
            source="processing",
            reason=_FAILED_REASON,
            detail=None,
            promote=promote,
            prepare=True,
            result=_OUTCOME_COLUMNS,
        )
        return [(r[0], r[1]) for r in rows] if statuses else [r[0] for r in rows]

    def _release(self, ids: list[str], tokens: list[Any], detail: str) -> list[str]:
        rows = self._move(
            "RELEASE",
            self._rows("RELEASE", ids, tokens),
            source="processing",
            reason="released",
            detail=detail,
            prepare=True,
        )
        return [r[1] for r in rows]
