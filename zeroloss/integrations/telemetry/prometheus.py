"""The event counters and histograms for Prometheus (``prometheus_client``).

Imported only when ``prometheus_client`` is installed. Under ``PROMETHEUS_MULTIPROC_DIR``
(gunicorn, a process pool, several workers on a host) ``prometheus_client`` writes every
process's values to files in that directory, and :func:`collector` sums them on scrape;
without it, the values are this process's. They live in :data:`registry`, not in
``prometheus_client.REGISTRY``, so a project's default registry gets them only by asking
(:func:`zeroloss.metrics.register_default`).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ...core.states import Status
from . import buckets

#: This process's event metrics (what :func:`collector` reads without a multiproc directory).
registry = CollectorRegistry(auto_describe=True)

_Q = ("queue",)
SENT = Counter(
    "zeroloss_messages_sent",
    "Messages stored by send/send_many/asend/enqueue (committed).",
    _Q,
    registry=registry,
)
STARTED = Counter("zeroloss_messages_started", "Handler runs started (every attempt).", _Q, registry=registry)
COMPLETED = Counter(
    "zeroloss_messages_completed", "Attempts whose success was recorded.", _Q, registry=registry
)
FAILED = Counter(
    "zeroloss_messages_failed",
    "Attempts whose failure was recorded (retried later, or dead-lettered: attempts spent).",
    _Q,
    registry=registry,
)
DEAD = Counter(
    "zeroloss_messages_dead_lettered",
    "Messages dead-lettered, by who: worker (last attempt failed) or sweep (its lease expired).",
    ("queue", "by"),
    registry=registry,
)
LOST = Counter(
    "zeroloss_messages_lease_lost",
    "Attempts whose outcome was refused: the lease was gone, the message runs again.",
    _Q,
    registry=registry,
)
RECOVERED = Counter(
    "zeroloss_messages_recovered",
    "Messages the sweep put back to pending (lease expired).",
    _Q,
    registry=registry,
)
CANCELLED = Counter("zeroloss_messages_cancelled", "Messages cancelled.", _Q, registry=registry)
SNOOZED = Counter(
    "zeroloss_messages_snoozed",
    "Attempts whose handler raised zeroloss.Snooze (pending again, the attempt not counted).",
    _Q,
    registry=registry,
)
DURATION = Histogram(
    "zeroloss_handler_duration_seconds",
    "Seconds a handler ran, by outcome (ok or error).",
    ("queue", "outcome"),
    buckets=buckets.DURATION,
    registry=registry,
)
PICKUP = Histogram(
    "zeroloss_pickup_latency_seconds",
    "Seconds from a message becoming claimable (sent, or its delay or backoff over) to its handler's start.",
    _Q,
    buckets=buckets.PICKUP,
    registry=registry,
)
BATCH = Histogram(
    "zeroloss_claim_batch_size",
    "Messages one claim returned (claims that found none are not observed).",
    _Q,
    buckets=buckets.BATCH,
    registry=registry,
)

#: Every metric's name (families as ``prometheus_client`` names them, without ``_total``).
NAMES = tuple(
    m._name
    for m in (
        SENT,
        STARTED,
        COMPLETED,
        FAILED,
        DEAD,
        LOST,
        RECOVERED,
        CANCELLED,
        SNOOZED,
        DURATION,
        PICKUP,
        BATCH,
    )
)


_children: dict[tuple[object, tuple[str, ...]], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once: ``labels()`` takes a lock and builds its
    key on every call, and the hot path asks for the same few children per message."""
    key = (metric, labels)
    found = _children.get(key)
    if found is None:
        if len(_children) > 4096:  # queue names are few; never grow without bound
            _children.clear()
        found = _children[key] = metric.labels(*labels)
    return found


def sent(queue: str, n: int) -> None:
    _child(SENT, queue).inc(n)


def claimed(queue: str, n: int) -> None:
    if n:
        _child(BATCH, queue).observe(n)


def started(queue: str, n: int, waits: Sequence[float]) -> None:
    _child(STARTED, queue).inc(n)
    if waits:
        _observe(_child(PICKUP, queue), waits)


def handled(queue: str, error_type: str | None, seconds: Sequence[float]) -> None:
    _observe(_child(DURATION, queue, "ok" if error_type is None else "error"), seconds)


def _observe(histogram: Any, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each value, as one update of the sum and one per bucket
    hit: in multi-process mode each update is a locked write to the process's file, and a
    batch's handlers mostly land in the same bucket. Through ``prometheus_client``'s
    ``_sum``/``_buckets`` (stable since 0.4); observed one by one if they are not there."""
    if len(values) > 1:
        try:
            bounds, buckets, total = histogram._upper_bounds, histogram._buckets, histogram._sum
        except AttributeError:
            pass
        else:
            counts = [0] * len(bounds)
            for value in values:
                # observe() counts a value in the first bucket whose bound is >= it.
                counts[min(bisect.bisect_left(bounds, value), len(bounds) - 1)] += 1
            total.inc(sum(values))
            for bucket, n in zip(buckets, counts, strict=True):
                if n:
                    bucket.inc(n)
            return
    for value in values:
        histogram.observe(value)


_OUTCOMES = {
    Status.COMPLETED.value: COMPLETED,
    "failed": FAILED,
    Status.DEAD.value: FAILED,
    "lease_lost": LOST,
    "snoozed": SNOOZED,
}


def finished(queue: str, outcome: str, n: int = 1) -> None:
    counter = _OUTCOMES.get(outcome)
    if counter is not None:
        _child(counter, queue).inc(n)


def dead_lettered(queue: str, by: str) -> None:
    _child(DEAD, queue, by).inc()


def recovered(queue: str) -> None:
    _child(RECOVERED, queue).inc()


def cancelled(queue: str) -> None:
    _child(CANCELLED, queue).inc()


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class EventsCollector(Collector):
    """The event metrics on scrape: summed over every process writing into the multiproc
    directory when there is one, else this process's."""

    def describe(self) -> Iterable[Metric]:
        return []  # described at collect: the multiproc files decide what exists

    def collect(self) -> Iterable[Metric]:
        path = multiprocess_dir()
        if path is None:
            yield from registry.collect()
            return
        # Deferred: only a multiprocess deployment needs it.
        from prometheus_client.multiprocess import MultiProcessCollector

        # Only zeroloss's own families: the directory may hold a project's metrics as well.
        for family in MultiProcessCollector(None, path=path).collect():
            if family.name in NAMES:
                yield family


def collector() -> EventsCollector:
    return EventsCollector()
