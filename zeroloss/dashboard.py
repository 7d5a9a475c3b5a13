"""Read-only queries behind the operator's dashboard (``admin/zeroloss/message/dashboard/``).

Nothing here writes a message or an event: every number is read from the ledger, and every
time is the *database* clock. The whole snapshot may be cached for ``CACHE_TIMEOUT`` seconds
(:func:`snapshot`); nothing that decides a transition ever reads it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.core.cache import cache
from django.db.models import Count, F
from django.db.models.functions import TruncMinute

from . import replication
from .models import Message, MessageEvent, ReplicationNode, Status
from .service import ReplicationStatus, ZeroLossMessageService, canonical_json, payload_checksum

CACHE_KEY = "zeroloss:admin:dashboard:v1"
#: Newest messages whose checksum the integrity summary re-computes on each refresh.
CHECKSUM_SAMPLE = 200
#: Minutes in the throughput chart.
CHART_MINUTES = 60

STATUSES: tuple[str, ...] = tuple(s.value for s in Status)


def format_lsn(lsn: int | None) -> str:
    """A WAL position as PostgreSQL prints it (``16/B374D848``)."""
    if lsn is None:
        return "-"
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def format_duration(seconds: float | None) -> str:
    """A short, human duration: ``42s``, ``3m 05s``, ``2h 07m``, ``4d 03h``."""
    if seconds is None:
        return "-"
    s = int(abs(seconds))
    if s < 60:
        text = f"{abs(seconds):.1f}s" if abs(seconds) < 10 else f"{s}s"
    elif s < 3600:
        text = f"{s // 60}m {s % 60:02d}s"
    elif s < 86400:
        text = f"{s // 3600}h {s % 3600 // 60:02d}m"
    else:
        text = f"{s // 86400}d {s % 86400 // 3600:02d}h"
    return f"-{text}" if seconds < 0 else text


@dataclass(frozen=True)
class QueueRow:
    name: str
    counts: list[int]  # in STATUSES order
    total: int


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
    database_now: dt.datetime
    statuses: tuple[str, ...]
    queues: list[QueueRow]
    totals: list[int]
    total: int
    oldest_pending_age: float | None
    stuck: int
    dead: int
    chart: Chart
    nodes: list[NodeRow]
    node_ttl: float
    nodes_live: int
    nodes_down: int
    requirement: replication.Requirement
    replication: ReplicationStatus
    integrity: IntegritySummary

    @property
    def oldest_pending(self) -> str:
        return format_duration(self.oldest_pending_age)


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
    """Ledger invariants, cheap enough for every refresh, plus a checksum sample of the newest rows."""
    messages = Message.objects.using(service.using)
    sample = list(messages.order_by("-id").values_list("message_id", "payload", "checksum")[:CHECKSUM_SAMPLE])
    mismatches = [
        mid for mid, payload, checksum in sample if payload_checksum(canonical_json(payload)) != checksum
    ]
    return IntegritySummary(
        sampled=len(sample),
        checksum_mismatches=mismatches,
        attempts_beyond_max=messages.filter(attempts__gt=F("max_attempts")).count(),
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
            live=replication.is_live(n, cutoff),
            last_seen_at=n.last_seen_at,
            seen_ago=format_duration((now - n.last_seen_at).total_seconds()),
            state=n.state,
            sync_state=n.sync_state,
            flush_lsn=format_lsn(n.flush_lsn),
            replay_lsn=format_lsn(n.replay_lsn),
        )
        for n in ReplicationNode.objects.using(service.using).order_by("node_id")
    ]


def collect(service: ZeroLossMessageService) -> Dashboard:
    """One consistent-enough snapshot of the ledger for the dashboard (uncached)."""
    stats = service.get_stats()
    now = stats.database_now
    queues = [
        QueueRow(name=name, counts=[counts.get(s, 0) for s in STATUSES], total=sum(counts.values()))
        for name, counts in sorted(stats.by_queue.items())
    ]
    totals = [stats.totals.get(s, 0) for s in STATUSES]
    return Dashboard(
        database_now=now,
        statuses=STATUSES,
        queues=queues,
        totals=totals,
        total=sum(totals),
        oldest_pending_age=stats.oldest_pending_age,
        stuck=stats.expired_leases,
        dead=stats.totals.get(Status.DEAD, 0),
        chart=throughput_chart(service, now),
        nodes=node_rows(service, now),
        node_ttl=service.settings.NODE_TTL,
        nodes_live=stats.nodes_live,
        nodes_down=stats.nodes_down,
        requirement=replication.requirement(service),
        replication=service.replication_status(),
        integrity=integrity_summary(service, stats.expired_leases, stats.problems),
    )


def snapshot(service: ZeroLossMessageService, *, refresh: bool = False) -> Dashboard:
    """:func:`collect`, cached for ``CACHE_TIMEOUT`` seconds (0 disables the cache)."""
    timeout = service.settings.CACHE_TIMEOUT
    if timeout <= 0:
        return collect(service)
    key = f"{CACHE_KEY}:{service.using}"
    if not refresh:
        cached = cache.get(key)
        if isinstance(cached, Dashboard):
            return cached
    data = collect(service)
    cache.set(key, data, timeout)
    return data
