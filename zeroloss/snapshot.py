"""One cheap, cacheable picture of the ledger for status, dashboards, metrics and health.

:func:`get_snapshot` reads counts per queue x status, the age of the oldest waiting
message, stuck (expired-lease) and dead counts, replication nodes and the replication
requirement, and what the recovery sweep has done according to the audit trail. Every
query is index-backed, so a snapshot stays cheap at a million rows:

=================================  =================================================
counts per queue x status          ``GROUP BY`` over ``zeroloss_msg_queue_status_idx``
oldest waiting message per queue   ``MIN(available_at)`` on the partial claim index
stuck (expired leases) per queue   range scan of the partial lease index
sweep recoveries                   ``(reason, created_at)`` event index
=================================  =================================================

Results go through Django's ``default`` cache for ``ZEROLOSS["CACHE_TIMEOUT"]`` seconds
(``0`` disables it). Nothing that changes a message ever reads a snapshot: the cache can
only make a *read* a few seconds old, never a transition wrong. A cache that fails (Redis
down) is logged and bypassed.

Lease state comes from the database clock (``Now()``), never from this host's clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

from django.core.cache import caches
from django.db.models import Count, Min, Q

from . import replication
from .models import Message, MessageEvent, Status
from .service import ZeroLossMessageService

logger = logging.getLogger("zeroloss")

#: The Django cache alias snapshots are stored in.
CACHE_ALIAS = "default"
#: Bump when the cached layout changes, so old entries are never misread.
CACHE_VERSION = 1
#: Above this many queues the oldest-pending ages come from one GROUP BY instead of one
#: index lookup per queue.
_PER_QUEUE_LOOKUPS = 50

STATUSES: tuple[str, ...] = tuple(s.value for s in Status)


def _zero_counts() -> dict[str, int]:
    return dict.fromkeys(STATUSES, 0)


@dataclass(frozen=True)
class QueueSnapshot:
    """One queue: messages per status, stuck count and the oldest waiting message's age."""

    name: str
    counts: dict[str, int] = field(default_factory=_zero_counts)
    #: Seconds the oldest claimable pending message has waited (database clock); 0.0 when
    #: every pending message is scheduled in the future; ``None`` when nothing is pending.
    oldest_pending_age: float | None = None
    #: Processing messages whose lease expired (the sweep will requeue or dead-letter them).
    stuck: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def dead(self) -> int:
        return self.counts.get(Status.DEAD, 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "counts": dict(self.counts),
            "total": self.total,
            "oldest_pending_age": self.oldest_pending_age,
            "stuck": self.stuck,
            "dead": self.dead,
        }


@dataclass(frozen=True)
class ReplicationSnapshot:
    """Whether the configured replication can be met right now (see :mod:`zeroloss.replication`)."""

    required: int
    available: int
    ok: bool
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Snapshot:
    """The ledger at ``taken_at`` (database clock), possibly up to ``CACHE_TIMEOUT`` old."""

    database: str
    taken_at: dt.datetime
    queues: dict[str, QueueSnapshot]
    nodes_live: int
    nodes_down: int
    replication: ReplicationSnapshot
    #: From the audit trail: messages the sweep moved back to pending / dead-lettered, and
    #: the sweep transactions that moved at least one message. Purges delete the events of
    #: purged messages, so these can go down after a purge.
    recovered_requeued: int = 0
    recovered_dead_lettered: int = 0
    sweep_runs: int = 0
    #: True when this came from the cache rather than the database.
    cached: bool = False

    @property
    def totals(self) -> dict[str, int]:
        totals = _zero_counts()
        for q in self.queues.values():
            for status, n in q.counts.items():
                totals[status] = totals.get(status, 0) + n
        return totals

    @property
    def total(self) -> int:
        return sum(self.totals.values())

    @property
    def stuck(self) -> int:
        return sum(q.stuck for q in self.queues.values())

    @property
    def dead(self) -> int:
        return self.totals[Status.DEAD]

    @property
    def oldest_pending_age(self) -> float | None:
        ages = [q.oldest_pending_age for q in self.queues.values() if q.oldest_pending_age is not None]
        return max(ages) if ages else None

    @property
    def recovered(self) -> int:
        return self.recovered_requeued + self.recovered_dead_lettered

    def for_queue(self, name: str) -> Snapshot:
        """The same snapshot narrowed to one queue (nodes and replication stay global)."""
        queues = {name: self.queues[name]} if name in self.queues else {}
        return dataclasses.replace(self, queues=queues)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the schema ``zeroloss_status --json`` prints (docs/operations.md)."""
        return {
            "database": self.database,
            "taken_at": self.taken_at.isoformat(),
            "cached": self.cached,
            "totals": self.totals,
            "total": self.total,
            "oldest_pending_age": self.oldest_pending_age,
            "stuck": self.stuck,
            "dead": self.dead,
            "queues": [self.queues[name].as_dict() for name in sorted(self.queues)],
            "nodes": {"live": self.nodes_live, "down": self.nodes_down},
            "replication": dataclasses.asdict(self.replication),
            "sweep": {
                "runs": self.sweep_runs,
                "requeued": self.recovered_requeued,
                "dead_lettered": self.recovered_dead_lettered,
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, cached: bool = False) -> Snapshot:
        taken_at = dt.datetime.fromisoformat(data["taken_at"])
        return cls(
            database=data["database"],
            taken_at=taken_at,
            queues={
                q["name"]: QueueSnapshot(
                    name=q["name"],
                    counts={s: int(n) for s, n in q["counts"].items()},
                    oldest_pending_age=q["oldest_pending_age"],
                    stuck=int(q["stuck"]),
                )
                for q in data["queues"]
            },
            nodes_live=int(data["nodes"]["live"]),
            nodes_down=int(data["nodes"]["down"]),
            replication=ReplicationSnapshot(**data["replication"]),
            recovered_requeued=int(data["sweep"]["requeued"]),
            recovered_dead_lettered=int(data["sweep"]["dead_lettered"]),
            sweep_runs=int(data["sweep"]["runs"]),
            cached=cached,
        )


def cache_key(service: ZeroLossMessageService) -> str:
    """Per database and per the settings that change the answer (replication requirement, node TTL)."""
    s = service.settings
    return (
        f"zeroloss:snapshot:v{CACHE_VERSION}:{service.using}:"
        f"{s.REPLICATION_FACTOR}:{s.PERSISTENCE_LEVEL}:{s.NODE_TTL:g}"
    )


def get_snapshot(service: ZeroLossMessageService, *, use_cache: bool = True) -> Snapshot:
    """The ledger's snapshot, from the cache when ``use_cache`` and one is fresh enough.

    A freshly computed snapshot is always stored (when caching is enabled), so
    ``use_cache=False`` also refreshes what the next cached reader sees.
    """
    timeout = service.settings.CACHE_TIMEOUT
    key = cache_key(service)
    if use_cache and timeout > 0:
        try:
            cached = caches[CACHE_ALIAS].get(key)
        except Exception:  # a broken cache must never break a read
            logger.warning("zeroloss: cache read failed; reading the database", exc_info=True)
            cached = None
        if cached is not None:
            try:
                return Snapshot.from_dict(cached, cached=True)
            except (KeyError, TypeError, ValueError):
                logger.warning("zeroloss: ignoring an unreadable cached snapshot", exc_info=True)
    snapshot = compute_snapshot(service)
    if timeout > 0:
        try:
            caches[CACHE_ALIAS].set(key, snapshot.as_dict(), timeout)
        except Exception:
            logger.warning("zeroloss: cache write failed", exc_info=True)
    return snapshot


def invalidate(service: ZeroLossMessageService) -> None:
    """Drop the cached snapshot of ``service``'s database (e.g. after an operator action)."""
    try:
        caches[CACHE_ALIAS].delete(cache_key(service))
    except Exception:
        logger.warning("zeroloss: cache delete failed", exc_info=True)


def compute_snapshot(service: ZeroLossMessageService) -> Snapshot:
    """Read a snapshot from the database now (no cache)."""
    alias = service.using
    messages = Message.objects.using(alias)
    counts: dict[str, dict[str, int]] = {}
    for row in messages.order_by().values("queue_name", "status").annotate(n=Count("id")):
        counts.setdefault(row["queue_name"], _zero_counts())[row["status"]] = row["n"]
    now = service.database_now()

    stuck: dict[str, int] = {
        row["queue_name"]: row["n"]
        for row in messages.stuck().order_by().values("queue_name").annotate(n=Count("id"))
    }

    with_pending = [q for q, c in counts.items() if c[Status.PENDING]]
    oldest: dict[str, dt.datetime] = {}
    if len(with_pending) <= _PER_QUEUE_LOOKUPS:
        for q in with_pending:
            # An index min lookup on (queue_name, available_at) WHERE status = 'pending'.
            value = messages.filter(status=Status.PENDING, queue_name=q).aggregate(m=Min("available_at"))["m"]
            if value is not None:
                oldest[q] = value
    else:
        for prow in messages.pending().order_by().values("queue_name").annotate(m=Min("available_at")):
            oldest[prow["queue_name"]] = prow["m"]

    queues = {
        name: QueueSnapshot(
            name=name,
            counts=c,
            oldest_pending_age=(max((now - oldest[name]).total_seconds(), 0.0) if name in oldest else None),
            stuck=stuck.get(name, 0),
        )
        for name, c in sorted(counts.items())
    }

    live, down = replication.node_counts(service)
    req = replication.requirement(service)

    events = MessageEvent.objects.using(alias)
    sweep_dead = Q(reason="dead_lettered", actor__startswith="sweep@")
    requeued = events.filter(reason="lease_expired").count()
    dead_lettered = events.filter(sweep_dead).count()
    # One sweep transaction stamps all its rows with one actor and one database time.
    runs = (
        events.filter(Q(reason="lease_expired") | sweep_dead)
        .order_by()
        .values("actor", "created_at")
        .distinct()
        .count()
        if requeued or dead_lettered
        else 0
    )
    return Snapshot(
        database=alias,
        taken_at=now,
        queues=queues,
        nodes_live=live,
        nodes_down=down,
        replication=ReplicationSnapshot(req.required, req.available, req.ok, list(req.problems)),
        recovered_requeued=requeued,
        recovered_dead_lettered=dead_lettered,
        sweep_runs=runs,
        cached=False,
    )
