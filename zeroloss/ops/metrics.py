"""Prometheus metrics read from the ledger on scrape (``pip install "zeroloss[metrics]"``).

:class:`ZeroLossCollector` turns a :func:`zeroloss.ops.snapshot.get_snapshot` into metric
families, so a scrape costs a handful of index-backed queries, and nothing at all while
the cached snapshot is fresh (``ZEROLOSS["CACHE_TIMEOUT"]``, 5 s by default).

- :func:`metrics_view` serves a dedicated :data:`registry` that holds only this collector
  (``zeroloss.urls`` routes it at ``metrics/``), so process metrics of whichever web
  worker answers never mix with ledger-wide numbers.
- :func:`register_default` adds the collector to ``prometheus_client.REGISTRY`` once, for
  projects that already export that registry, e.g. with ``django-prometheus``.

Every metric is a gauge: they describe the ledger as it is, and purges lower even the
audit-trail totals (see docs/operations.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from ..core.rates import parse_rate
from ..integrations.telemetry.prometheus import EventsCollector
from ..ledger.models import Status
from ..ledger.service import ZeroLossMessageService
from .snapshot import get_snapshot
from .snapshot_types import Snapshot

logger = logging.getLogger("zeroloss")

#: (name, help, label names) of every metric the collector exports.
METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("zeroloss_up", "1 if the ledger could be read on this scrape, 0 if the database read failed.", ()),
    (
        "zeroloss_messages",
        "Messages in the ledger by queue and status (completed: an estimate when "
        "zeroloss_completed_estimated is 1).",
        ("queue", "status"),
    ),
    (
        "zeroloss_completed_estimated",
        "1 if the completed counts are estimated from PostgreSQL's statistics (large tables), 0 if counted.",
        (),
    ),
    (
        "zeroloss_oldest_pending_age_seconds",
        "Seconds the oldest claimable pending message of the queue has waited (0 if none).",
        ("queue",),
    ),
    (
        "zeroloss_expired_leases",
        "Processing messages whose lease expired (stuck until the sweep requeues them).",
        ("queue",),
    ),
    ("zeroloss_dead_letters", "Dead-lettered messages by queue.", ("queue",)),
    ("zeroloss_queue_paused", "1 if the queue is paused (zeroloss_queue pause), else 0.", ("queue",)),
    (
        "zeroloss_queue_concurrency_limit",
        "The queue's concurrency limit in effect (only queues that have one).",
        ("queue",),
    ),
    (
        "zeroloss_queue_rate_limit_per_second",
        "The queue's rate limit in effect, in claims per second (only queues that have one).",
        ("queue",),
    ),
    (
        "zeroloss_sweep_runs",
        "Sweep transactions that recovered at least one message, per the audit trail.",
        (),
    ),
    (
        "zeroloss_sweep_recovered_messages",
        "Messages the sweep recovered from expired leases, per the audit trail, by outcome.",
        ("outcome",),
    ),
    ("zeroloss_nodes", "Registered replication nodes by liveness (NODE_TTL).", ("state",)),
    ("zeroloss_replication_required_standbys", "Streaming standbys the settings require.", ()),
    ("zeroloss_replication_available_standbys", "Standbys streaming from the primary now.", ()),
    ("zeroloss_replication_ok", "1 if the replication requirement is met (measured), else 0.", ()),
    (
        "zeroloss_snapshot_timestamp_seconds",
        "Database time (Unix seconds) the numbers were read at; older by up to CACHE_TIMEOUT.",
        (),
    ),
)


def _family(name: str) -> GaugeMetricFamily:
    for n, help_text, labels in METRICS:
        if n == name:
            return GaugeMetricFamily(n, help_text, labels=list(labels))
    raise KeyError(name)


def families(snapshot: Snapshot) -> list[Metric]:
    """The metric families of one snapshot."""
    up = _family("zeroloss_up")
    up.add_metric([], 1)
    messages = _family("zeroloss_messages")
    oldest = _family("zeroloss_oldest_pending_age_seconds")
    expired = _family("zeroloss_expired_leases")
    dead = _family("zeroloss_dead_letters")
    paused = _family("zeroloss_queue_paused")
    concurrency = _family("zeroloss_queue_concurrency_limit")
    rate = _family("zeroloss_queue_rate_limit_per_second")
    for name in sorted(snapshot.queues):
        q = snapshot.queues[name]
        for status in Status.values:
            messages.add_metric([name, status], q.counts.get(status, 0))
        oldest.add_metric([name], q.oldest_pending_age or 0.0)
        expired.add_metric([name], q.stuck)
        dead.add_metric([name], q.dead)
        paused.add_metric([name], 1 if q.paused else 0)
        if q.concurrency is not None:
            concurrency.add_metric([name], q.concurrency)
        if q.rate:
            rate.add_metric([name], parse_rate(q.rate).per_second)
    estimated = _family("zeroloss_completed_estimated")
    estimated.add_metric([], 1 if snapshot.completed_estimated else 0)
    runs = _family("zeroloss_sweep_runs")
    runs.add_metric([], snapshot.sweep_runs)
    recovered = _family("zeroloss_sweep_recovered_messages")
    recovered.add_metric(["requeued"], snapshot.recovered_requeued)
    recovered.add_metric(["dead_lettered"], snapshot.recovered_dead_lettered)
    nodes = _family("zeroloss_nodes")
    nodes.add_metric(["live"], snapshot.nodes_live)
    nodes.add_metric(["down"], snapshot.nodes_down)
    required = _family("zeroloss_replication_required_standbys")
    required.add_metric([], snapshot.replication.required)
    available = _family("zeroloss_replication_available_standbys")
    available.add_metric([], snapshot.replication.available)
    ok = _family("zeroloss_replication_ok")
    ok.add_metric([], 1 if snapshot.replication.ok else 0)
    stamp = _family("zeroloss_snapshot_timestamp_seconds")
    stamp.add_metric([], snapshot.taken_at.timestamp())
    return [
        up,
        messages,
        estimated,
        oldest,
        expired,
        dead,
        paused,
        concurrency,
        rate,
        runs,
        recovered,
        nodes,
        required,
        available,
        ok,
        stamp,
    ]


class ZeroLossCollector(Collector):
    """Reads the ledger (through the snapshot cache) each time the registry is collected."""

    def __init__(self, using: str = "default", *, use_cache: bool = True) -> None:
        self.using = using
        self.use_cache = use_cache

    def describe(self) -> Iterable[Metric]:
        # Names only, so registering never touches the database.
        return [_family(name) for name, _, _ in METRICS]

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = get_snapshot(ZeroLossMessageService(using=self.using), use_cache=self.use_cache)
        except Exception:
            # A scrape must answer even when the database does not: zeroloss_up 0 says why.
            logger.exception("zeroloss: metrics could not read the ledger")
            up = _family("zeroloss_up")
            up.add_metric([], 0)
            yield up
            return
        yield from families(snapshot)


#: The registry :func:`metrics_view` serves: the zeroloss collector and nothing else.
registry = CollectorRegistry(auto_describe=True)
registry.register(ZeroLossCollector())
# The event counters and histograms (docs/observability.md): every process's, summed, under
# PROMETHEUS_MULTIPROC_DIR; this web process's otherwise.
registry.register(EventsCollector())

_default_lock = threading.Lock()
_default_collector: ZeroLossCollector | None = None


def register_default(target: CollectorRegistry = REGISTRY, *, using: str = "default") -> ZeroLossCollector:
    """Add a collector to ``target`` (``prometheus_client.REGISTRY`` by default) once; idempotent.

    For projects whose ``/metrics`` already exports the default registry (django-prometheus
    does): call it from an ``AppConfig.ready()``; ``zeroloss.urls`` calls it when
    ``django_prometheus`` is installed.
    """
    global _default_collector
    with _default_lock:
        if target is REGISTRY and _default_collector is not None:
            return _default_collector
        collector = ZeroLossCollector(using)
        target.register(collector)
        if target is REGISTRY:
            _default_collector = collector
        return collector


def unregister_default() -> None:
    """Undo :func:`register_default` on ``prometheus_client.REGISTRY`` (tests, reconfiguration)."""
    global _default_collector
    with _default_lock:
        if _default_collector is not None:
            REGISTRY.unregister(_default_collector)
            _default_collector = None


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text (or OpenMetrics, if the scraper asks for it) exposition."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return HttpResponse(encoder(registry), content_type=content_type)
