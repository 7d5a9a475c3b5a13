"""Queue control: pause and resume, and each queue's concurrency and rate limits (docs/control.md).

A queue's control row (:class:`zeroloss.models.QueueControl`) holds what an operator set
(paused, limit overrides, who and when) and the rate limiter's token bucket. Enforcement is
where messages are claimed, in the claim's transaction: a claim of a limited queue locks the
queue's row, counts what of the queue is processing, takes tokens from the bucket (timed by the
database clock, read after the lock) and claims at most what is left. Every claim path goes
through :meth:`QueueControlling._claim_controlled` (``claim_next``, ``mark_processing``).

A queue with nothing to enforce costs no statement: each process reads which queues have a
control (:data:`REFRESH` seconds at most old) and claims any other queue as before.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from ..rates import Rate, parse_concurrency, parse_rate
from .base import LedgerBase
from .types import Lease
from .validation import validate_message_id, validate_queue_name

logger = logging.getLogger("zeroloss")

#: How old a process's list of controlled queues may be, in seconds: a pause (or a first
#: limit) reaches every worker within it plus one claim (docs/control.md: within 1 s).
REFRESH = 0.5
#: database alias -> (when read, monotonic; the queues with a paused flag or an override; those
#: with an override, whose claims go straight to the lock).
_CONTROLLED: dict[str, tuple[float, frozenset[str], frozenset[str]]] = {}
#: (database alias, queue) -> seconds until the queue's next token, as the last claim of this
#: process that found none computed it (a worker waits that long, not its whole poll interval:
#: idle claimers woken together would otherwise take one token per poll between them).
_NEXT_TOKEN: dict[tuple[str, str], float] = {}


@dataclass(frozen=True)
class QueueLimits:
    """The limits in effect for a queue: its override, else its ``ZEROLOSS["QUEUES"]`` entry."""

    concurrency: int | None = None
    rate: Rate | None = None

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None


@dataclass(frozen=True)
class QueueState:
    """One queue as ``zeroloss_queue show`` reports it."""

    queue_name: str
    paused: bool
    #: In effect (override, else setting).
    limits: QueueLimits
    #: The operator's overrides (None: none).
    concurrency_override: int | None
    rate_override: Rate | None
    processing: int
    pending: int
    changed_by: str
    changed_at: dt.datetime | None


class QueueControlling(LedgerBase):
    # -- the operator's part ----------------------------------------------------------------

    def pause_queue(self, queue_name: str, *, actor: str | None = None) -> None:
        """Stop claims of the queue (every worker within 1 s); in-flight messages finish, sends
        are accepted and wait."""
        self._set_paused(queue_name, True, actor)

    def resume_queue(self, queue_name: str, *, actor: str | None = None) -> None:
        """Let the queue be claimed again (a paused queue's waiting messages go at once)."""
        self._set_paused(queue_name, False, actor)

    def limit_queue(
        self,
        queue_name: str,
        *,
        concurrency: int | None = None,
        rate: str | Rate | None = None,
        actor: str | None = None,
    ) -> None:
        """Override the queue's limits (None: no override, the setting's applies). Raises
        ``ValueError`` on a bad value, nothing changed. A changed rate starts a full bucket."""
        validate_queue_name(queue_name)
        if concurrency is not None:
            parse_concurrency(concurrency)
        text = "" if rate is None else (rate.text if isinstance(rate, Rate) else parse_rate(rate).text)
        who = self._actor(actor)
        with transaction.atomic(using=self.using):
            self._run("CONTROL_LIMIT", [queue_name, concurrency, text, who])
        self._changed(queue_name, who, f"limits concurrency={concurrency} rate={text or None}")

    def clear_queue_limits(self, queue_name: str, *, actor: str | None = None) -> None:
        """Remove the queue's overrides: its ``ZEROLOSS["QUEUES"]`` limits (if any) apply again."""
        self.limit_queue(queue_name, actor=actor)

    def queue_limits(self, queue_name: str, concurrency: int | None = None, rate: str = "") -> QueueLimits:
        """The limits in effect, given the queue's overrides (its control row's columns)."""
        declared = self.settings.QUEUES.get(queue_name)
        return QueueLimits(
            concurrency if concurrency is not None else (declared.concurrency if declared else None),
            parse_rate(rate) if rate else (declared.rate if declared else None),
        )

    def queue_states(self) -> list[QueueState]:
        """Every queue with a control row or a limit in the settings, by name."""
        rows, _ = self._run("CONTROL_ALL", [])
        counts, _ = self._run("CONTROL_COUNTS", [])
        by = {(q, s): n for q, s, n in counts}
        found = {r[0]: r for r in rows}
        names = sorted({*found, *(q for q, s in self.settings.QUEUES.items() if s.concurrency or s.rate)})
        states = []
        for name in names:
            _, paused, conc, rate, who, when = found.get(name, (name, False, None, "", "", None))
            states.append(
                QueueState(
                    name,
                    bool(paused),
                    self.queue_limits(name, conc, rate),
                    conc,
                    parse_rate(rate) if rate else None,
                    by.get((name, "processing"), 0),
                    by.get((name, "pending"), 0),
                    who,
                    self.engine.to_datetime(when),
                )
            )
        return states

    def _set_paused(self, queue_name: str, paused: bool, actor: str | None) -> None:
        validate_queue_name(queue_name)
        who = self._actor(actor)
        with transaction.atomic(using=self.using):
            self._run("CONTROL_PAUSE", [queue_name, paused, who])
        self._changed(queue_name, who, "paused" if paused else "resumed")
        if not paused:
            # Wake idle workers now, not at their next poll (PostgreSQL; SQLite workers poll).
            self.engine.wake(self.connection, [queue_name])

    def _actor(self, actor: str | None) -> str:
        return self.instance_id if actor is None else validate_message_id(actor, "actor")

    def _changed(self, queue_name: str, actor: str, what: str) -> None:
        _CONTROLLED.pop(self.using, None)  # this process sees its own change at once
        logger.info("queue %s %s by %s", queue_name, what, actor)

    # -- enforcement ----------------------------------------------------------------------

    def next_token_in(self, queue_name: str) -> float | None:
        """Seconds until the queue's rate allows its next claim, if this process's last claim of
        it found no token (None otherwise); read once."""
        return _NEXT_TOKEN.pop((self.using, queue_name), None)

    def _claims_lock(self, queue_name: str) -> bool:
        """Whether a claim of the queue locks its control row (a limit, as far as this process
        knows)."""
        declared = self.settings.QUEUES.get(queue_name)
        if declared is not None and (declared.concurrency is not None or declared.rate is not None):
            return True
        return queue_name in self._controlled_queues()[1]

    def _is_controlled(self, queue_name: str) -> bool:
        """Whether a claim of the queue must go through :meth:`_claim_controlled`: the hot path's
        question, answered without a statement (but twice a second per process)."""
        declared = self.settings.QUEUES.get(queue_name)
        if declared is not None and (declared.concurrency is not None or declared.rate is not None):
            return True
        return queue_name in self._controlled_queues()[0]

    def _any_controlled(self) -> bool:
        return bool(self._controlled_queues()[0]) or any(
            q.concurrency is not None or q.rate is not None for q in self.settings.QUEUES.values()
        )

    def _controlled_queues(self) -> tuple[frozenset[str], frozenset[str]]:
        """(queues paused or with an override, those with an override), at most REFRESH old."""
        now = time.monotonic()
        seen = _CONTROLLED.get(self.using)
        if seen is not None and now - seen[0] < REFRESH:
            return seen[1], seen[2]
        rows, _ = self._run("CONTROLLED_QUEUES", [])
        names = frozenset(r[0] for r in rows)
        limited = frozenset(r[0] for r in rows if r[1] is not None or r[2])
        _CONTROLLED[self.using] = (now, names, limited)
        return names, limited

    def _queue_of(self, message_id: str) -> str | None:
        rows, _ = self._run("MESSAGE_QUEUE", [message_id])
        return rows[0][0] if rows else None

    def _claim_controlled(
        self,
        queue_name: str,
        limit: int,
        claim: Callable[[int], list[Lease]],
        claim_counting: Callable[[int, int], list[Lease]] | None = None,
    ) -> list[Lease]:
        """Claim through ``claim(n)`` at most what the queue's control allows, atomically.
        ``claim_counting(n, concurrency)``: a claim that counts what is processing itself (one
        statement less while the row is locked)."""
        if not self._claims_lock(queue_name):
            # Paused only, as far as this process knows: an unlocked read decides (no row lock
            # for every poll of a paused queue); a limit set meanwhile is found there too.
            rows, _ = self._run("CONTROL_READ", [queue_name])
            paused, concurrency, rate = rows[0] if rows else (False, None, "")
            if paused:
                return []
            if not self.queue_limits(queue_name, concurrency, rate).limited:
                return claim(limit)
        engine = self.engine
        # No savepoint inside the worker's outcome-and-claim transaction: its release would be
        # one more round trip while the row is locked. A failure here fails that transaction.
        with transaction.atomic(using=self.using, savepoint=False):
            # The row lock: the claims of this queue, one after another (SQLite: the write lock).
            rows = self._run("CONTROL_LOCK", [queue_name])[0] if engine.lock_row else []
            if not rows:  # SQLite, or the queue's first claim
                rows, _ = self._run("CONTROL_LOCK_UPSERT", [queue_name])
            paused, concurrency, rate, tokens, refilled_at, clock = rows[0]
            limits = self.queue_limits(queue_name, concurrency, rate)
            if paused:
                return []
            room = limit
            if limits.concurrency is not None and claim_counting is None:
                counted, _ = self._run("CONTROL_IN_FLIGHT", [queue_name])
                room = min(room, limits.concurrency - counted[0][0])
            available = 0.0
            if limits.rate is not None:
                available = float(limits.rate.burst)
                if refilled_at is not None:
                    # The clock may step back (a failover, NTP): never a negative refill.
                    elapsed = max(0.0, (engine.at(clock) - engine.at(refilled_at)).total_seconds())
                    available = min(available, tokens + elapsed * limits.rate.per_second)
                room = min(room, math.floor(available + 1e-9))
            if limits.rate is not None and available < 1:
                _NEXT_TOKEN[(self.using, queue_name)] = (1 - available) / limits.rate.per_second
            if room <= 0:
                return []
            if limits.concurrency is not None and claim_counting is not None:
                leases = claim_counting(room, limits.concurrency)
            else:
                leases = claim(room)
            if limits.rate is not None and leases:
                self._run("CONTROL_SPEND", [available - len(leases), clock, queue_name])
            return leases
