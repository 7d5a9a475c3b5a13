"""What a ledger snapshot holds: :class:`Snapshot` and its parts, and their JSON round trip.

The data only: :mod:`zeroloss.ops.snapshot` reads it from the database (``compute_snapshot``) and
caches it through :meth:`Snapshot.as_dict` and :meth:`Snapshot.from_dict` (``get_snapshot``);
it re-exports these names.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ..ledger.models import Status
from ..ledger.types import KeyHead
from ..runtime.schedules.overdue import OverdueSchedule


def zero_counts() -> dict[str, int]:
    return dict.fromkeys(Status.values, 0)


@dataclass(frozen=True)
class QueueSnapshot:
    """One queue: messages per status, stuck count and the oldest claimable message's age."""

    name: str
    counts: dict[str, int] = field(default_factory=zero_counts)
    #: Seconds the oldest claimable pending message has waited (see :mod:`zeroloss.ops.snapshot`).
    oldest_pending_age: float | None = None
    #: Processing messages whose lease expired (the sweep will requeue or dead-letter them).
    stuck: int = 0
    #: Queue control (docs/control.md): paused, and the limits in effect (None: unlimited).
    paused: bool = False
    concurrency: int | None = None
    rate: str | None = None

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
            "paused": self.paused,
            "concurrency": self.concurrency,
            "rate": self.rate,
        }


@dataclass(frozen=True)
class ReplicationSnapshot:
    """Whether the configured replication can be met right now (see :mod:`zeroloss.integrations.replication`)."""

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
    #: True when the completed counts are an estimate (see :mod:`zeroloss.ops.snapshot`); the other
    #: statuses are always exact.
    completed_estimated: bool = False
    #: Ordering keys whose head holds up messages behind it, longest blocked first (at most
    #: :data:`zeroloss.ops.snapshot.MAX_BLOCKED_KEYS`; ``blocked_keys_truncated`` says there were more).
    blocked_keys: tuple[KeyHead, ...] = ()
    blocked_keys_truncated: bool = False
    #: Whether the ledger is partitioned by period (PostgreSQL, docs/scaling.md), and until when
    #: sends have a partition to go to (None: no partition covers now).
    partitioned: bool = False
    partitions_until: dt.datetime | None = None
    #: Schedules whose tick is overdue (no scheduler is sending them: zeroloss.runtime.schedules.overdue),
    #: most overdue first.
    overdue_schedules: tuple[OverdueSchedule, ...] = ()

    @property
    def totals(self) -> dict[str, int]:
        totals = zero_counts()
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
        keys = tuple(k for k in self.blocked_keys if k.queue_name == name)
        return dataclasses.replace(self, queues=queues, blocked_keys=keys)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the schema ``zeroloss_status --json`` prints (docs/operations.md)."""
        return {
            "database": self.database,
            "taken_at": self.taken_at.isoformat(),
            "cached": self.cached,
            "completed_estimated": self.completed_estimated,
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
            "blocked_keys": [k.as_dict() for k in self.blocked_keys],
            "blocked_keys_truncated": self.blocked_keys_truncated,
            "partitions": {
                "partitioned": self.partitioned,
                "covered_until": self.partitions_until.isoformat() if self.partitions_until else None,
            },
            "overdue_schedules": [o.as_dict() for o in self.overdue_schedules],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, cached: bool = False) -> Snapshot:
        return cls(
            database=data["database"],
            taken_at=dt.datetime.fromisoformat(data["taken_at"]),
            queues={
                q["name"]: QueueSnapshot(
                    name=q["name"],
                    counts={s: int(n) for s, n in q["counts"].items()},
                    oldest_pending_age=q["oldest_pending_age"],
                    stuck=int(q["stuck"]),
                    paused=bool(q.get("paused", False)),
                    concurrency=q.get("concurrency"),
                    rate=q.get("rate"),
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
            completed_estimated=bool(data["completed_estimated"]),
            blocked_keys=tuple(KeyHead.from_dict(k) for k in data["blocked_keys"]),
            blocked_keys_truncated=bool(data["blocked_keys_truncated"]),
            partitioned=bool(data["partitions"]["partitioned"]),
            partitions_until=(
                dt.datetime.fromisoformat(data["partitions"]["covered_until"])
                if data["partitions"]["covered_until"]
                else None
            ),
            overdue_schedules=tuple(OverdueSchedule.from_dict(o) for o in data.get("overdue_schedules", [])),
        )
