"""A queue's limits (docs/control.md): what is in effect, and the arithmetic of enforcing them,
including its advisory slots' ("How each guarantee holds"): how much one slot claim may take of a
concurrency, and each slot's share of a rate's token bucket. Pure: the statements and the locks
are :mod:`.control`'s."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from ..core.rates import Rate

#: How many advisory slots a limited queue has on PostgreSQL: how many of its claims may run
#: side by side while far from its limits (docs/control.md).
SLOTS = 8


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


def slotted(limits: QueueLimits) -> bool:
    """Whether slot claims can take anything under these limits (each a share of at least 1)."""
    return (limits.concurrency is None or slot_share(limits.concurrency) > 0) and (
        limits.rate is None or slot_share(limits.rate.burst) > 0
    )


def in_shares(rate: Rate | None) -> bool:
    """Whether a rate's bucket is kept in slot shares (PostgreSQL): one large enough for slot
    claims. Smaller ones stay in the control row, spent by exact claims only."""
    return rate is not None and slot_share(rate.burst) > 0


def slot_share(limit: int) -> int:
    """The most one slot claim takes of a limit of ``limit`` (0: the limit is too small for
    slot claims, every claim is exact)."""
    return limit // (2 * SLOTS)


def slot_room(limit: int, used: float) -> int:
    """What one slot claim may take when ``used`` of ``limit`` is taken as far as it can see:
    up to its share, and only so much that the other ``SLOTS - 1`` slots' claims, in flight
    unseen, each at its share, still keep the total within the limit."""
    share = slot_share(limit)
    return max(0, min(share, math.floor(limit - used + 1e-9) - (SLOTS - 1) * share))


def share_level(
    rate: Rate, tokens: float | None, refilled_at: dt.datetime | None, clock: dt.datetime
) -> tuple[float, dt.datetime]:
    """What one slot's share of the rate's bucket (``1/SLOTS`` of its burst, refilled at
    ``1/SLOTS`` of its rate) holds at ``clock`` (no row yet: full), and the time it is counted
    from afterwards: never backwards, so a clock that steps back (a failover, NTP) refills
    nothing and no time is counted twice."""
    most = rate.burst / SLOTS
    if tokens is None or refilled_at is None:
        return most, clock
    elapsed = (clock - refilled_at).total_seconds()
    if elapsed <= 0:
        return min(most, tokens), refilled_at
    return min(most, tokens + elapsed * rate.per_second / SLOTS), clock


def row_level(rate: Rate | None, tokens: float, refilled_at: dt.datetime | None, clock: dt.datetime) -> float:
    """What the control row's rate bucket (the whole burst) holds at ``clock`` (0 without a
    rate; never refilled: full). A clock that stepped back (a failover, NTP) refills nothing."""
    if rate is None:
        return 0.0
    if refilled_at is None:
        return float(rate.burst)
    elapsed = max(0.0, (clock - refilled_at).total_seconds())
    return min(float(rate.burst), tokens + elapsed * rate.per_second)
