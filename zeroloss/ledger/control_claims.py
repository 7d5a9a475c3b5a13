"""Queue control at claim time: the two ways a claim of a controlled queue takes what its limits
allow (docs/control.md; the entry point, :meth:`.control.Control.claim_controlled`, chooses).

- the exact path (SQLite always; PostgreSQL near a limit): lock the queue's row (and, on
  PostgreSQL, all of its advisory slots), count what of the queue is processing, take tokens
  from the bucket (timed by the database clock, read after the lock), claim at most what is left;
- the slot path (PostgreSQL, far from the limits): hold one of the queue's ``SLOTS`` advisory
  locks, count, and claim at most a share of each limit small enough that every slot claiming
  its share at once, unseen, still stays within it; claims in different slots run side by side.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

from ..core.rates import Rate, parse_rate
from .base import Part
from .limits import SLOTS, QueueLimits, in_shares, row_level, share_level, slot_room, slotted
from .types import Lease

#: How long an exact claim waits for its queue's slots, in seconds: a claim holding one
#: commits within milliseconds, unless its worker froze (SIGSTOP, a VM paused), and then it
#: holds the slot until the server ends its session. Past this the exact claim takes nothing
#: (its worker polls again) rather than queue behind it.
EXACT_WAIT = 0.5

#: (database alias, queue) -> seconds until the queue's next token, as the last claim of this
#: process that found none computed it (a worker waits that long, not its whole poll interval:
#: idle claimers woken together would otherwise take one token per poll between them).
_NEXT_TOKEN: dict[tuple[str, str], float] = {}

#: (database alias, queue) -> until when (monotonic) this process claims the queue by the exact
#: path: a slot claim found it near a limit.
_EXACT: dict[tuple[str, str], float] = {}

#: (database alias, queue) -> whether its limits, as this process last read them, are large
#: enough for slot claims (unknown: read from the row, unlocked, before the first claim).
_SLOTTED: dict[tuple[str, str], bool] = {}


class _NearLimit(Exception):
    """A slot claim found less room than it may take: the exact path decides (never while the
    slot is held: that path waits for every slot)."""


#: How old a process's list of controlled queues may be, in seconds: a pause (or a first
#: limit) reaches every worker within it plus one claim (docs/control.md: within 1 s).
REFRESH = 0.5
#: database alias -> (when read, monotonic; the queues with a paused flag or an override; those
#: with an override, whose claims go straight to the lock).
_CONTROLLED: dict[str, tuple[float, frozenset[str], frozenset[str]]] = {}


def limits_in_effect(
    settings: Any, queue_name: str, concurrency: int | None = None, rate: str = ""
) -> QueueLimits:
    """A queue's limits in effect, given its overrides (its control row's columns)."""
    declared = settings.QUEUES.get(queue_name)
    return QueueLimits(
        concurrency if concurrency is not None else (declared.concurrency if declared else None),
        parse_rate(rate) if rate else (declared.rate if declared else None),
    )


class ClaimPaths(Part):
    """The claim paths of :class:`.control.Control` (its base: one part, two files)."""

    def _controlled_queues(self) -> tuple[frozenset[str], frozenset[str]]:
        """(queues paused or with an override, those with an override), at most REFRESH old."""
        now = time.monotonic()
        seen = _CONTROLLED.get(self.using)
        if seen is not None and now - seen[0] < REFRESH:
            return seen[1], seen[2]
        rows, _ = self._run("CONTROLLED_QUEUES", {})
        names = frozenset(r[0] for r in rows)
        limited = frozenset(r[0] for r in rows if r[1] is not None or r[2])
        _CONTROLLED[self.using] = (now, names, limited)
        return names, limited

    def _lock_slots(self, queue_name: str, bound: float) -> bool:
        """PostgreSQL: wait at most ``bound`` seconds for the queue's slot claims in flight, and
        start none until this transaction commits (an exact claim). False: a slot stayed held
        (a frozen worker's claim); those taken stay held to the commit."""
        if not self.engine.locks_rows:
            return True
        deadline = time.monotonic() + bound
        first, pause = 0, 0.001
        while True:
            tried = dict(first=first, slots=SLOTS, queue=queue_name)
            rows, _ = self._run("CONTROL_SLOTS_TRY", tried, prepare=True)
            if rows[0][0] is None:
                return True
            first = rows[0][0]
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(2 * pause, 0.02)

    def _claim_exact(
        self,
        queue_name: str,
        key: tuple[str, str],
        slots: bool,
        limit: int,
        claim: Callable[[int], list[Lease]],
        claim_counting: Callable[[int, int], list[Lease]] | None,
    ) -> list[Lease]:
        """The exact path: every slot and the row locked, then the limits counted and spent."""
        if not self._lock_slots(queue_name, EXACT_WAIT):
            return []  # a frozen claim holds a slot: nothing now, the worker polls again
        # The row lock: the claims of this queue, one after another (SQLite: the write lock).
        rows = self._run("CONTROL_LOCK", {"queue": queue_name}, prepare=True)[0] if slots else []
        if not rows:  # SQLite, or the queue's first claim
            rows, _ = self._run("CONTROL_LOCK_UPSERT", {"queue": queue_name})
        paused, concurrency, rate, tokens, refilled_at, clock = rows[0]
        limits = limits_in_effect(self.settings, queue_name, concurrency, rate)
        _SLOTTED[key] = slotted(limits)
        if paused:
            return []
        room = limit
        if limits.concurrency is not None and claim_counting is None:
            counted, _ = self._run("CONTROL_IN_FLIGHT", {"queue": queue_name}, prepare=True)
            room = min(room, limits.concurrency - counted[0][0])
        # A rate kept in slot shares (PostgreSQL): all of them; else the row's bucket.
        shares = self._shares(queue_name, limits.rate, clock) if slots and in_shares(limits.rate) else None
        if shares is not None:
            available = sum(level for _, level, _ in shares)
        else:
            available = self._tokens(limits, tokens, refilled_at, clock)
        if limits.rate is not None:
            if available < 1:
                _NEXT_TOKEN[key] = (1 - available) / limits.rate.per_second
            room = min(room, math.floor(available + 1e-9))
        if room <= 0:
            return []
        if limits.concurrency is not None and claim_counting is not None:
            leases = claim_counting(room, limits.concurrency)
        else:
            leases = claim(room)
        if limits.rate is not None and leases:
            if shares is not None:  # each share pays its part: none left emptier than another
                tokens = [v - len(leases) * v / available for _, v, _ in shares]
                spent = dict(queue=queue_name, slot=[s for s, *_ in shares], tokens=tokens)
                self._run("CONTROL_BUCKETS_SPEND", {**spent, "refilled_at": [r for *_, r in shares]})
            else:
                left = dict(tokens=available - len(leases), refilled_at=clock, queue=queue_name)
                self._run("CONTROL_SPEND", left, prepare=True)
        return leases

    def _slotted(self, key: tuple[str, str]) -> bool:
        """Whether this process's claims of the queue may take the slot path. Not known yet (its
        first claim): the row read unlocked decides, before any slot is taken, so the claims a
        process starts with run side by side instead of queueing on the exact path's lock."""
        known = _SLOTTED.get(key)
        if known is None:
            rows, _ = self._run("CONTROL_READ", {"queue": key[1]}, prepare=True)
            known = bool(rows) and slotted(limits_in_effect(self.settings, key[1], rows[0][1], rows[0][2]))
            _SLOTTED[key] = known
        return known

    def _claim_in_slot(
        self, queue_name: str, limit: int, claim: Callable[[int], list[Lease]]
    ) -> list[Lease] | None:
        """PostgreSQL's concurrent path: claim holding one of the queue's :data:`SLOTS` advisory
        locks (waiting for one if all are taken): at most :func:`slot_share` of a concurrency and
        only while even every other slot's claim at its most stays within it; at most what the
        slot's share of the rate's bucket holds (:class:`~zeroloss.models.RateBucket`, written by
        no other claim). ``None``: the queue has no row yet, the exact path creates it. Holding a
        slot, this never waits for the exact path's lock (which waits for the slots): near a
        limit it claims nothing and sends this process's next claims of the queue to the exact
        path for :data:`REFRESH` seconds."""
        first = random.randrange(SLOTS)
        rows, _ = self._run("CONTROL_SLOT", dict(slots=SLOTS, queue=queue_name, first=first), prepare=True)
        if not rows:  # no row yet: the exact path creates it
            return None
        slot = first if rows[0][3] is None else (first + rows[0][3]) % SLOTS
        if rows[0][3] is None:
            self._run("CONTROL_SLOT_WAIT", {"first": first, "queue": queue_name}, prepare=True)
        rows, _ = self._run("CONTROL_SLOT_READ", {"queue": queue_name, "slot": slot}, prepare=True)
        paused, concurrency, rate, tokens, refilled_at, clock, processing = rows[0]
        if paused:
            return []
        limits = limits_in_effect(self.settings, queue_name, concurrency, rate)
        _SLOTTED[(self.using, queue_name)] = slotted(limits)
        room = limit if slotted(limits) else 0
        if limits.concurrency is not None:
            room = min(room, slot_room(limits.concurrency, processing))
        share = (0.0, clock)
        if limits.rate is not None and room > 0:
            share = self._level(limits.rate, tokens, refilled_at, clock)
            room = min(room, math.floor(share[0] + 1e-9))
        if room <= 0:
            _EXACT[(self.using, queue_name)] = time.monotonic() + REFRESH
            _NEXT_TOKEN[(self.using, queue_name)] = 0.0  # claim again at once, by the exact path
            raise _NearLimit
        leases = claim(room)
        if limits.rate is not None and leases:
            spent = dict(queue=queue_name, slot=slot, tokens=share[0] - len(leases), refilled_at=share[1])
            self._run("CONTROL_BUCKET_SPEND", spent, prepare=True)
        return leases

    def _level(
        self, rate: Rate, tokens: float | None, refilled_at: object, clock: object
    ) -> tuple[float, object]:
        at = self.engine.at
        return share_level(rate, tokens, None if refilled_at is None else at(refilled_at), at(clock))

    def _shares(self, queue_name: str, rate: Rate | None, clock: object) -> list[tuple[int, float, object]]:
        """Every slot's share of the rate's bucket, as (slot, tokens at ``clock``, counted from)."""
        assert rate is not None
        rows, _ = self._run("CONTROL_BUCKETS", {"queue": queue_name}, prepare=True)
        found = {slot: (tokens, at) for slot, tokens, at in rows}
        return [(s, *self._level(rate, *found.get(s, (None, None)), clock)) for s in range(SLOTS)]

    def _tokens(self, limits: QueueLimits, tokens: float, refilled_at: object, clock: object) -> float:
        """What the row's rate bucket holds at ``clock`` (0 without a rate)."""
        at = self.engine.at
        return row_level(limits.rate, tokens, None if refilled_at is None else at(refilled_at), at(clock))
