"""Leases: claim and renew them, and give back those of a claim whose outcome was lost.

What the lease holder records with them (acknowledge, fail, release) is :mod:`.outcomes`; what
a queue's control allows a claim is :mod:`.control`.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import OperationalError, transaction

from . import events
from .base import Part
from .engine import MOVED_FROM
from .types import Lease
from .validation import validate_count, validate_message_id, validate_queue_name

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
#: The claims by queue (ordered by priority and age), planned by statements.PLAN_CLAIM.
_ORDERED_CLAIMS = frozenset({"CLAIM", "CLAIM_LIMITED"})
#: On a connection wrapper: the outermost atomic block of the worker's outcome-and-claim
#: transaction, whose claims :meth:`Leases.bound_claim_transaction` already planned.
_PLANNED = "_zeroloss_claims_planned"
#: When this process last claimed from the head of each (database alias, queue), and from
#: CLAIM_BEHIND back: one such claim finds what is behind every claimer's position, so one is
#: made for all of them.
_HEAD_CLAIMED: dict[tuple[str, str], float] = {}
_BEHIND_CLAIMED: dict[tuple[str, str], float] = {}


class Leases(Part):
    """Claims (by queue, or one message by id), renewals, and leases whose claim was lost."""

    # -- claims ---------------------------------------------------------------------------

    def _claim_range(self, queue_name: str, limit: int) -> dict[str, Any]:
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
        return {"queue": queue_name, "priority": priority, "since": since, "limit": limit}

    def _remember_claim(self, queue_name: str, rows: list[Any]) -> None:
        """Where the next claim of this claimer starts: its last message's priority, and the
        earlier of that message's ``available_at`` and this claim's time less CLAIM_REWIND."""
        if rows and self.engine.keeps_dead_index_entries:
            last = min(rows, key=lambda r: (r[9], -r[11], -r[0]))  # the last in the claim's order
            claimed_at = self.engine.at(last[6]) - dt.timedelta(seconds=self.settings.ACK_TIMEOUT)
            since = min(self.engine.at(last[11]), claimed_at - CLAIM_REWIND)
            self.__dict__["_claim_cursors"][queue_name] = (last[9], since)

    #: Monotonic time from which the last claim's leases are measured: just before its statement
    #: ran with the locks it needed (engine.MOVED_FROM), not before a wait for them (SQLite's
    #: write lock, behind other writers: a lease measured from before a wait of ACK_TIMEOUT or
    #: more would look expired here when it was just taken, and its messages would never run).
    claimed_from: float = 0.0

    def _claim(self, name: str, params: dict[str, Any], cursor_of: str = "") -> list[Lease]:
        engine = self.engine
        before = time.monotonic()
        self.connection.ensure_connection()
        # Remembered in case this claim's outcome is lost (see release_unknown_claims).
        self._claim_session = engine.session_of(self.connection)
        moving = {"ack_timeout": self.settings.ACK_TIMEOUT, "claimed_by": self.instance_id, **params}
        if engine.plans_claims and name in _ORDERED_CLAIMS:
            rows = self._planned_claim(name, moving)
        else:
            rows = self._move(name, moving)
        self.claimed_from = max(before, self.connection.__dict__.get(MOVED_FROM, before))
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
                created_at=engine.at(r[13]),
                workflow_id=r[12],
            )
            for r in rows
        ]
        if leases and events.wanted(events.Claimed):
            self.ctx.emit([events.Claimed(cursor_of or leases[0].queue_name, leases)])
        return leases

    def _planned_claim(self, name: str, params: dict[str, Any]) -> list[Any]:
        """Run a claim by queue planned by statements.PLAN_CLAIM: in a transaction of its own
        (bounded like the worker's) when the caller has none; in the caller's, with the setting
        put back after it, unless the transaction is the worker's, planned when it began."""
        conn = self.connection
        if not conn.in_atomic_block and conn.get_autocommit():
            ms = int(self.settings.ACK_TIMEOUT * 1000)
            with transaction.atomic(using=self.using, savepoint=False):
                self._run("PLAN_CLAIM", {"bound_ms": ms, "bound": str(ms)}, prepare=True)
                return self._move(name, params)
        if conn.atomic_blocks and conn.__dict__.get(_PLANNED) is conn.atomic_blocks[0]:
            return self._move(name, params)
        before, _ = self._run("PLAN_CLAIM", {"bound_ms": 0, "bound": "0"}, prepare=True)
        rows = self._move(name, params)
        self._run("UNPLAN_CLAIM", {"enable_sort": before[0][0], "jit": before[0][1]}, prepare=True)
        return rows

    def bound_claim_transaction(self) -> None:
        """At the start of the worker's outcome-and-claim transaction (inside its atomic block):
        the server ends it should it stay idle longer than ``ACK_TIMEOUT`` (a worker frozen
        between its statements), and its claims are planned (statements.PLAN_CLAIM), in one
        statement."""
        conn = self.connection
        if not self.engine.plans_claims:
            self.engine.bound_transaction(conn, self.settings.ACK_TIMEOUT)
            return
        ms = int(self.settings.ACK_TIMEOUT * 1000)
        self._run("PLAN_CLAIM", {"bound_ms": ms, "bound": str(ms)}, prepare=True)
        conn.__dict__[_PLANNED] = conn.atomic_blocks[0]

    def claim(self, queue_name: str, limit: int = 1) -> list[Lease]:
        """Claim up to ``limit`` available messages of a queue (highest priority, then oldest),
        skipping rows another claimer has locked. Each starts an attempt."""
        validate_queue_name(queue_name)
        validate_count(limit, "limit")
        control = self.ctx.control
        if control.is_controlled(queue_name):  # paused or limited: claims at most what it allows
            return control.claim_controlled(
                queue_name,
                limit,
                lambda n: self._claim("CLAIM", self._claim_range(queue_name, n), cursor_of=queue_name),
                lambda n, most: self._claim(
                    "CLAIM_LIMITED",
                    {**self._claim_range(queue_name, n), "most": most},
                    cursor_of=queue_name,
                ),
            )
        params = self._claim_range(queue_name, limit)
        return self._claim("CLAIM", params, cursor_of=queue_name)

    def next_available_in(self, queue_names: Sequence[str]) -> float | None:
        """Seconds (database clock) until the earliest pending message of these queues is
        available (0 or less: one is now), None when none is pending."""
        rows, _ = self._run("NEXT_AVAILABLE", {"queues": self.engine.column(queue_names)})
        at, now = rows[0]
        if at is None:
            return None
        return (self.engine.at(at) - self.engine.at(now)).total_seconds()

    def claim_message(self, message_id: str) -> Lease | None:
        """Claim one pending, available message. ``None`` if missing, not pending, being claimed,
        or held back by its queue's control (paused, or at a limit: docs/control.md)."""
        validate_message_id(message_id)
        control = self.ctx.control
        queue = control.queue_of(message_id) if control.any_controlled() else None
        if queue is not None and control.is_controlled(queue):
            leases = control.claim_controlled(
                queue, 1, lambda n: self._claim("CLAIM_BY_ID", {"mid": message_id})
            )
        else:
            leases = self._claim("CLAIM_BY_ID", {"mid": message_id})
        return leases[0] if leases else None

    # -- renewals -------------------------------------------------------------------------

    def _renewal(self, name: str, leases: Sequence[Lease], **ttl: float) -> set[str]:
        """Run a renewal statement (RENEW, RENEW_BUSY, REVIVE) for ``leases``: the ids it returns."""
        engine = self.engine
        params = {
            **ttl,
            **engine.batch(mid=[x.message_id for x in leases], tok=[engine.token(x.token) for x in leases]),
            **engine.period([x.created_at for x in leases]),
        }
        rows, _ = self._run(name, params, prepare=True)
        return {r[0] for r in rows}

    def renew_lease(self, message_id: str, lease_token: uuid.UUID | str) -> bool:
        """Extend a live lease by ``ACK_TIMEOUT``. ``False`` once the lease was lost or expired."""
        validate_message_id(message_id)
        token = self._token(lease_token)
        engine = self.engine
        rows, _ = self._run(
            "RENEW",
            {
                "ttl": self.settings.ACK_TIMEOUT,
                **engine.batch(mid=[message_id], tok=[token]),
                **engine.period([None]),
            },
            prepare=True,
        )
        return bool(rows)

    def renew_leases(self, leases: Iterable[Lease]) -> set[str]:
        """Renew many live leases in one statement; returns the ids whose lease was renewed."""
        held = list(leases)
        return self._renewal("RENEW", held, ttl=self.settings.ACK_TIMEOUT) if held else set()

    def busy_leases(self, leases: Iterable[Lease]) -> set[str]:
        """Of leases a renewal skipped, those still held and unexpired: their rows were locked
        elsewhere for the moment (the renewal does not wait for a row lock), not lost."""
        held = list(leases)
        return self._renewal("RENEW_BUSY", held) if held else set()

    def revive_leases(self, leases: Iterable[Lease]) -> set[str]:
        """Renew leases that may have run out while nobody else took them (statements REVIVE:
        fenced by token and status, not by expiry; no abort requested): what a worker does
        with a claim whose commit took longer than its lease, before it runs anything.
        Returns the ids revived: each lease then runs ``ACK_TIMEOUT`` from the statement, as
        a renewal's does. A lease another worker claimed since, or the sweep or an operator
        moved, is not revived."""
        held = list(leases)
        return self._renewal("REVIVE", held, ttl=self.settings.ACK_TIMEOUT) if held else set()

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
            {"owner": self.instance_id, **engine.batch(tok=tokens)},
            detail="released: the claim's commit outcome was lost with its connection",
        )
        return [r[1] for r in rows]
