"""Queue control: pause and resume, and each queue's concurrency and rate limits (docs/control.md).

A queue's control row (:class:`zeroloss.models.QueueControl`) holds what an operator set
(paused, limit overrides, who and when) and the rate limiter's token bucket. Enforcement is
where messages are claimed, in the claim's transaction. Every claim path goes through
:meth:`Control.claim_controlled` (``Leases.claim``, ``Leases.claim_message``), which claims
by the exact path or the slot path (:mod:`.control_claims`).

A queue with nothing to enforce costs no statement: each process reads which queues have a
control (:data:`REFRESH` seconds at most old) and claims any other queue as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import transaction

from ..core.rates import Rate, parse_concurrency, parse_rate
from ..core.states import Status
from . import hooks
from .control_claims import (
    _CONTROLLED,
    _EXACT,
    _NEXT_TOKEN,
    _SLOTTED,
    ClaimPaths,
    _NearLimit,
    limits_in_effect,
)
from .control_claims import REFRESH as REFRESH  # the claim paths' state, where tests and callers read it
from .limits import SLOTS as SLOTS
from .limits import QueueLimits, QueueState
from .types import Lease
from .validation import validate_message_id, validate_queue_name

logger = logging.getLogger("zeroloss")

#: How long pause, resume and a limit change wait, after their commit, for the claims that
#: started before it (PostgreSQL's slot claims) to finish; a frozen one is not waited for.
SETTLE_WAIT = 0.5


class Control(ClaimPaths):
    """Queue control: what operators set (pause, limits), and what it allows each claim."""

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
            self._run("CONTROL_LIMIT", dict(queue=queue_name, concurrency=concurrency, rate=text, who=who))
            self._run("CONTROL_BUCKETS_RESET", {"queue": queue_name})
            self._release_held(queue_name)
        self._settle(queue_name)
        self._changed(queue_name, who, f"limits concurrency={concurrency} rate={text or None}")

    def clear_queue_limits(self, queue_name: str, *, actor: str | None = None) -> None:
        """Remove the queue's overrides: its ``ZEROLOSS["QUEUES"]`` limits (if any) apply again."""
        self.limit_queue(queue_name, actor=actor)

    def queue_limits(self, queue_name: str, concurrency: int | None = None, rate: str = "") -> QueueLimits:
        """The limits in effect, given the queue's overrides (its control row's columns)."""
        return limits_in_effect(self.settings, queue_name, concurrency, rate)

    def queue_states(self) -> list[QueueState]:
        """Every queue with a control row or a limit in the settings, by name."""
        rows, _ = self._run("CONTROL_ALL", {})
        counts, _ = self._run("CONTROL_COUNTS", {})
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
                    by.get((name, Status.PROCESSING), 0),
                    by.get((name, Status.PENDING), 0),
                    who,
                    self.engine.to_datetime(when),
                )
            )
        return states

    def _set_paused(self, queue_name: str, paused: bool, actor: str | None) -> None:
        validate_queue_name(queue_name)
        who = self._actor(actor)
        with transaction.atomic(using=self.using):
            self._run("CONTROL_PAUSE", {"queue": queue_name, "paused": paused, "who": who})
            if not paused:
                self._release_held(queue_name)
        self._settle(queue_name)
        self._changed(queue_name, who, "paused" if paused else "resumed")
        if not paused:
            # Wake idle workers now, not at their next poll (PostgreSQL; SQLite workers poll).
            self.engine.wake(self.connection, [queue_name])

    def _settle(self, queue_name: str) -> None:
        """After an operator's change committed: wait (at most :data:`SETTLE_WAIT`) for the slot
        claims that read the row before it, so none of them commits after this returns; every
        claim starting later reads the change. A frozen claim is not waited for: it commits,
        if ever, when its worker wakes, before the server ends its session."""
        if not self.engine.locks_rows:
            return  # SQLite: the change's write waited for every claim (one writer)
        with transaction.atomic(using=self.using):
            if not self._lock_slots(queue_name, SETTLE_WAIT):
                logger.warning(
                    "queue %s: a claim started before the change still holds a slot after %gs "
                    "(a frozen worker?); the change is in effect for every other claim",
                    queue_name,
                    SETTLE_WAIT,
                )

    def _release_held(self, queue_name: str) -> None:
        """The Celery transport: publish the queue's waiting messages again right after the
        change commits (their tasks were absorbed while it held them), not ``REDISPATCH_AFTER``
        later; by the redispatch the sweep runs, so what it cannot publish the sweep does."""
        if self.settings.TRANSPORT != "celery":
            return
        self._run("CONTROL_UNDISPATCH", {"queue": queue_name})

        def redispatch_now() -> None:
            try:
                hooks.redispatch(self.ctx.service)
            except Exception as exc:  # the ledger is unreachable: the sweep publishes them
                logger.warning("could not publish queue %s's waiting messages: %s", queue_name, exc)

        transaction.on_commit(redispatch_now, using=self.using)

    def _actor(self, actor: str | None) -> str:
        return self.instance_id if actor is None else validate_message_id(actor, "actor")

    def _changed(self, queue_name: str, actor: str, what: str) -> None:
        # This process sees its own change at once: which queues are controlled, and whether
        # its claims of this one may take the slot path under the new limits.
        _CONTROLLED.pop(self.using, None)
        _SLOTTED.pop((self.using, queue_name), None)
        _EXACT.pop((self.using, queue_name), None)
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

    def bounds_running(self, queue_name: str) -> bool:
        """Whether the queue has a concurrency limit (or an override, as far as this process
        knows): its runs' leases are its slots, kept while their handlers run."""
        declared = self.settings.QUEUES.get(queue_name)
        if declared is not None and declared.concurrency is not None:
            return True
        return queue_name in self._controlled_queues()[1]

    def _any_controlled(self) -> bool:
        return bool(self._controlled_queues()[0]) or any(
            q.concurrency is not None or q.rate is not None for q in self.settings.QUEUES.values()
        )

    def _queue_of(self, message_id: str) -> str | None:
        rows, _ = self._run("MESSAGE_QUEUE", {"message_id": message_id})
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
            rows, _ = self._run("CONTROL_READ", {"queue": queue_name}, prepare=True)
            paused, concurrency, rate = rows[0] if rows else (False, None, "")
            if paused:
                return []
            if not self.queue_limits(queue_name, concurrency, rate).limited:
                return claim(limit)
        slots = self.engine.locks_rows  # PostgreSQL: the concurrent path; SQLite: one writer anyway
        key = (self.using, queue_name)
        own = not self.connection.in_atomic_block
        # No savepoint inside the worker's outcome-and-claim transaction: its release would be
        # one more round trip. A failure here fails that transaction.
        if slots and self._slotted(key) and _EXACT.get(key, 0.0) <= time.monotonic():
            with transaction.atomic(using=self.using, savepoint=False):
                try:
                    leases = self._claim_in_slot(queue_name, limit, claim)
                except _NearLimit:
                    if not own:  # holding a slot in the caller's transaction: its next claim is exact
                        return []
                else:
                    if leases is not None:
                        return leases
                    if not own:  # no row yet, no slot taken
                        return self._claim_exact(queue_name, key, slots, limit, claim, claim_counting)
            # In a transaction of its own: the slot let go with its end, the exact path at once.
        with transaction.atomic(using=self.using, savepoint=False):
            return self._claim_exact(queue_name, key, slots, limit, claim, claim_counting)

    # The claim path's entry points, for :class:`~.leases.Leases` (through ``ctx.control``).
    is_controlled = _is_controlled
    any_controlled = _any_controlled
    queue_of = _queue_of
    claim_controlled = _claim_controlled
