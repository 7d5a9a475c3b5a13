"""The operator's dashboard (``admin/zeroloss/message/dashboard/``), built on the one snapshot.

Counts, ages, stuck and dead messages and the replication requirement come from
:mod:`zeroloss.ops.snapshot` (cached for ``CACHE_TIMEOUT``, like ``zeroloss_status``, metrics and
health, so every screen agrees); the dashboard adds what only it shows: the throughput chart,
the node rows, the replication measurement of everything committed so far and an integrity
summary. Nothing here writes, and every time is the *database* clock.
"""

from __future__ import annotations

import datetime as dt
import functools
import operator
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, F, Q
from django.db.models.functions import TruncMinute

from ..core.states import COUNTED_STATUSES
from ..integrations.replication import ReplicationStatus, format_lsn, is_live
from ..ledger.models import Message, MessageEvent, NodeRole, ReplicationNode, Status
from ..ledger.service import ZeroLossMessageService, canonical_json, payload_checksum
from .snapshot import compute_snapshot, format_duration, get_snapshot
from .snapshot_types import ReplicationSnapshot, Snapshot

# format_duration (zeroloss.ops.snapshot) and format_lsn (zeroloss.integrations.replication) are the only
# formatters; they are re-exported here for the admin, which imported them from this module.
__all__ = ["Dashboard", "collect", "format_duration", "format_lsn", "snapshot"]

#: Newest messages whose checksum the integrity summary re-computes on each view.
CHECKSUM_SAMPLE = 200
#: Minutes in the throughput chart.
CHART_MINUTES = 60


@dataclass(frozen=True)
class QueueRow:
    name: str
    counts: list[int]  # in Status order
    total: int
    #: Queue control (docs/control.md): paused, and the limits in effect.
    paused: bool = False
    concurrency: int | None = None
    rate: str | None = None


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    count: int


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class Chart:
    """Completed (bars) and persisted (line) messages per minute, ready to draw as SVG."""

    width: int
    height: int
    left: int
    bars: list[Bar]
    persisted_points: str
    ticks: list[Tick]
    x_labels: list[Tick]  # ``y`` holds the x position here
    completed_total: int
    persisted_total: int
    peak: int

    @property
    def per_minute(self) -> float:
        return self.completed_total / CHART_MINUTES


@dataclass(frozen=True)
class NodeRow:
    node_id: str
    role: str
    address: str
    live: bool
    last_seen_at: dt.datetime
    seen_ago: str
    state: str
    sync_state: str
    flush_lsn: str
    replay_lsn: str

    @property
    def role_label(self) -> str:
        """The role in the reader's language (read at render time: the rows are cached)."""
        return str(NodeRole(self.role).label) if self.role in NodeRole.values else self.role


@dataclass(frozen=True)
class IntegritySummary:
    sampled: int
    checksum_mismatches: list[str]
    attempts_beyond_max: int
    processing_without_lease: int
    stuck: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.checksum_mismatches
            or self.attempts_beyond_max
            or self.processing_without_lease
            or self.stuck
            or self.problems
        )


@dataclass(frozen=True)
class Dashboard:
    """What the dashboard template reads: the snapshot's numbers plus the dashboard's own rows."""

    snapshot: Snapshot
    chart: Chart
    nodes: list[NodeRow]
    node_ttl: float
    #: Measured copies of everything committed so far (never writes: ``record=False``).
    replication: ReplicationStatus
    integrity: IntegritySummary
    statuses: tuple[str, ...] = tuple(Status.values)

    @property
    def database_now(self) -> dt.datetime:
        return self.snapshot.taken_at

    @property
    def status_headers(self) -> list[tuple[str, str]]:
        """``(status, label)`` per column, the label in the reader's language."""
        return [(s, str(Status(s).label)) for s in self.statuses]

    @property
    def queues(self) -> list[QueueRow]:
        return [
            QueueRow(
                name=q.name,
                counts=[q.counts.get(s, 0) for s in self.statuses],
                total=q.total,
                paused=q.paused,
                concurrency=q.concurrency,
                rate=q.rate,
            )
            for q in (self.snapshot.queues[name] for name in sorted(self.snapshot.queues))
        ]

    @property
    def totals(self) -> list[int]:
        totals = self.snapshot.totals
        return [totals.get(s, 0) for s in self.statuses]

    @property
    def total(self) -> int:
        return self.snapshot.total

    @property
    def oldest_pending_age(self) -> float | None:
        return self.snapshot.oldest_pending_age

    @property
    def oldest_pending(self) -> str:
        return format_duration(self.oldest_pending_age)

    @property
    def stuck(self) -> int:
        return self.snapshot.stuck

    @property
    def dead(self) -> int:
        return self.snapshot.dead

    @property
    def blocked_keys(self) -> str:
        """Ordering keys blocked by their head (``100+`` past the snapshot's cap)."""
        more = "+" if self.snapshot.blocked_keys_truncated else ""
        return f"{len(self.snapshot.blocked_keys)}{more}"

    @property
    def completed_estimated(self) -> bool:
        return self.snapshot.completed_estimated

    @property
    def overdue_schedules(self) -> list[dict[str, Any]]:
        """Schedules whose tick is overdue: no scheduler is sending them."""
        return [{**o.as_dict(), "late": format_duration(o.late)} for o in self.snapshot.overdue_schedules]

    @property
    def nodes_live(self) -> int:
        return self.snapshot.nodes_live

    @property
    def nodes_down(self) -> int:
        return self.snapshot.nodes_down

    @property
    def requirement(self) -> ReplicationSnapshot:
        return self.snapshot.replication


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 x 10^n that is >= ``value`` (at least 1)."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= value:
                return m * step
        step *= 10


def throughput_chart(service: ZeroLossMessageService, now: dt.datetime) -> Chart:
    """Acknowledged and persisted events per minute over the last hour (database clock)."""
    end = now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    start = end - dt.timedelta(minutes=CHART_MINUTES)
    rows = (
        MessageEvent.objects.using(service.using)
        .filter(reason__in=("acknowledged", "persisted"), created_at__gte=start)
        .annotate(minute=TruncMinute("created_at", tzinfo=dt.UTC))
        .values("minute", "reason")
        .annotate(n=Count("id"))
        .order_by()
    )
    completed = [0] * CHART_MINUTES
    persisted = [0] * CHART_MINUTES
    for row in rows:
        minute = row["minute"]
        if minute.tzinfo is None:
            minute = minute.replace(tzinfo=dt.UTC)
        index = int((minute - start).total_seconds() // 60)
        if 0 <= index < CHART_MINUTES:
            target = completed if row["reason"] == "acknowledged" else persisted
            target[index] += row["n"]
    peak = max([*completed, *persisted, 0])
    top = _nice_ceiling(peak)
    width, height, left, bottom = 720, 180, 48, 20
    plot_w, plot_h = width - left - 24, height - bottom - 8
    slot = plot_w / CHART_MINUTES
    bars = []
    points = []
    for i in range(CHART_MINUTES):
        minute = start + dt.timedelta(minutes=i)
        h = plot_h * completed[i] / top
        bars.append(
            Bar(
                x=round(left + i * slot + 1, 1),
                y=round(8 + plot_h - h, 1),
                width=round(max(slot - 2, 1), 1),
                height=round(h, 1),
                label=minute.strftime("%H:%M"),
                count=completed[i],
            )
        )
        py = 8 + plot_h - plot_h * persisted[i] / top
        points.append(f"{left + (i + 0.5) * slot:.1f},{py:.1f}")
    ticks = [Tick(y=round(8 + plot_h - plot_h * f, 1), label=str(int(top * f))) for f in (0, 0.5, 1)]
    x_labels = [
        Tick(y=round(left + i * slot, 1), label=(start + dt.timedelta(minutes=i)).strftime("%H:%M"))
        for i in range(0, CHART_MINUTES + 1, 15)
    ]
    return Chart(
        width=width,
        height=height,
        left=left,
        bars=bars,
        persisted_points=" ".join(points),
        ticks=ticks,
        x_labels=x_labels,
        completed_total=sum(completed),
        persisted_total=sum(persisted),
        peak=peak,
    )


def integrity_summary(service: ZeroLossMessageService, stuck: int, problems: list[str]) -> IntegritySummary:
    """Ledger invariants over the live rows, plus a checksum sample of the newest rows.

    Cheap enough for every view: "attempts beyond max" looks at the statuses counted row by row
    (``COUNTED_STATUSES``) through their partial indexes (completed rows are ``zeroloss_verify``'s job).
    """
    messages = Message.objects.using(service.using)
    sample = list(messages.order_by("-id").values_list("message_id", "payload", "checksum")[:CHECKSUM_SAMPLE])
    mismatches = [
        mid for mid, payload, checksum in sample if payload_checksum(canonical_json(payload)) != checksum
    ]
    live = functools.reduce(operator.or_, (Q(status=s) for s in COUNTED_STATUSES))
    return IntegritySummary(
        sampled=len(sample),
        checksum_mismatches=mismatches,
        attempts_beyond_max=messages.filter(live, attempts__gt=F("max_attempts")).count(),
        processing_without_lease=messages.filter(
            status=Status.PROCESSING, lease_expires_at__isnull=True
        ).count(),
        stuck=stuck,
        problems=problems,
    )


def node_rows(service: ZeroLossMessageService, now: dt.datetime) -> list[NodeRow]:
    cutoff = now - dt.timedelta(seconds=service.settings.NODE_TTL)
    return [
        NodeRow(
            node_id=n.node_id,
            role=n.role,
            address=n.address,
            live=is_live(n, cutoff),
            last_seen_at=n.last_seen_at,
            seen_ago=format_duration((now - n.last_seen_at).total_seconds()),
            state=n.state,
            sync_state=n.sync_state,
            flush_lsn=format_lsn(n.flush_lsn) or "-",
            replay_lsn=format_lsn(n.replay_lsn) or "-",
        )
        for n in ReplicationNode.objects.using(service.using).order_by("node_id")
    ]


def collect(service: ZeroLossMessageService, snap: Snapshot | None = None) -> Dashboard:
    """The dashboard over ``snap`` (read from the database now when not given)."""
    snap = snap if snap is not None else compute_snapshot(service)
    now = snap.taken_at
    return Dashboard(
        snapshot=snap,
        chart=throughput_chart(service, now),
        nodes=node_rows(service, now),
        node_ttl=service.settings.NODE_TTL,
        replication=service.replication_status(record=False),
        integrity=integrity_summary(service, snap.stuck, list(snap.replication.problems)),
    )


def snapshot(service: ZeroLossMessageService, *, refresh: bool = False) -> Dashboard:
    """The dashboard over the cached snapshot (``CACHE_TIMEOUT``); ``refresh`` reads it anew."""
    return collect(service, get_snapshot(service, use_cache=not refresh))
