"""Traces and metrics of a message's life: one entry point per event (docs/observability.md).

The events of the ledger reach these functions through its event stream (:mod:`.subscriber`
subscribes to :mod:`zeroloss.ledger.events`); the worker and the senders call the spans around
their work here; nothing else of zeroloss touches OpenTelemetry or the event counters. Each backend is loaded on
first use, only when it is installed and ``ZEROLOSS["TELEMETRY"]`` is on:

- :mod:`.tracing` (``opentelemetry-api``, the ``zeroloss[otel]`` extra): PRODUCER and CONSUMER
  spans, the trace context carried in the message's headers;
- :mod:`.prometheus` (``prometheus_client``, the ``zeroloss[metrics]`` extra): counters and
  histograms, multi-process safe under ``PROMETHEUS_MULTIPROC_DIR``;
- :mod:`.otel_metrics` (``opentelemetry-api``): the same events as OpenTelemetry instruments,
  recorded by whichever meter provider the project sets.

Without either package nothing is imported and every entry point is one attribute check.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed

from ...core.settings import get_settings
from ...ledger.events import NO_PROCESS, NO_SPAN

if TYPE_CHECKING:
    from ...ledger.types import Completion, Lease
    from ...runtime.delivery import Delivery

__all__ = [
    "batch",
    "cancelled",
    "claimed",
    "dead_lettered",
    "finished",
    "finished_many",
    "operation",
    "process",
    "recovered",
    "send_span",
    "sent",
    "settle_span",
]


class _Backends:
    """What this process records to: each None when not installed or turned off."""

    __slots__ = ("meters", "tracing")

    def __init__(self) -> None:

        self.tracing: Any = None
        self.meters: list[Any] = []
        if not get_settings().TELEMETRY:
            return
        try:
            from . import otel_metrics, tracing  # deferred: opentelemetry-api is optional
        except ImportError:  # zeroloss[otel] not installed
            pass
        else:
            self.tracing = tracing
            self.meters.append(otel_metrics)
        try:
            from . import prometheus  # deferred: prometheus-client is optional
        except ImportError:  # zeroloss[metrics] not installed
            pass
        else:
            self.meters.append(prometheus)


_backends: _Backends | None = None


def backends() -> _Backends:
    global _backends
    if _backends is None:
        _backends = _Backends()
    return _backends


def _reset(*, setting: str, **kwargs: Any) -> None:
    global _backends
    if setting == "ZEROLOSS":
        _backends = None


setting_changed.connect(_reset, dispatch_uid="zeroloss.telemetry")


def active() -> bool:
    """Whether any backend records (the cheap check before building an event's arguments)."""
    b = backends()
    return b.tracing is not None or bool(b.meters)


# --- producer -------------------------------------------------------------------------------


@contextlib.contextmanager
def send_span(queue_name: str, count: int) -> Iterator[Any]:
    """Around one ``send``/``send_many``: a PRODUCER span whose context ``.headers(h)`` adds to
    the message's headers (``traceparent``/``tracestate``)."""
    tracing = backends().tracing
    if tracing is None:
        yield NO_SPAN
        return
    with tracing.send_span(queue_name, count) as span:
        yield NO_SPAN if span is None else span


def sent(queue_names: Sequence[str]) -> None:
    """Messages of these queues (one name per message) are stored, their transaction committed."""
    meters = backends().meters
    if not meters:
        return
    counts: dict[str, int] = {}
    for queue in queue_names:
        counts[queue] = counts.get(queue, 0) + 1
    for meter in meters:
        for queue, n in counts.items():
            meter.sent(queue, n)


# --- consumer -------------------------------------------------------------------------------


def claimed(queue_name: str, leases: Sequence[Lease]) -> None:
    """A claim of ``queue_name`` returned ``leases`` (the claim batch size histogram)."""
    for meter in backends().meters:
        meter.claimed(queue_name, len(leases))


def process(delivery: Delivery, worker: str) -> Any:
    """A handler is about to run: the started counter, the pickup latency, and a CONSUMER span
    (the current span until ``.end(ok, seconds, exc)``) whose parent is the producer's context."""
    b = backends()
    if b.tracing is None and not b.meters:
        return NO_PROCESS
    lease = delivery.lease
    waited = None
    if lease.available_at is not None:
        waited = max(0.0, time.time() - lease.available_at.timestamp())
    pending: _Pending | None = getattr(_local, "pending", None)
    if pending is not None:
        pending.start(lease.queue_name, waited)
    else:
        for meter in b.meters:
            meter.started(lease.queue_name, 1, () if waited is None else (waited,))
    span = b.tracing.process(delivery, worker) if b.tracing is not None else None
    return _Process(b.meters, lease.queue_name, span, pending)


class _Process:
    __slots__ = ("meters", "pending", "queue", "span")

    def __init__(self, meters: list[Any], queue: str, span: Any, pending: _Pending | None) -> None:
        self.meters, self.queue, self.span, self.pending = meters, queue, span, pending

    def end(self, ok: bool, seconds: float, exc: BaseException | None = None) -> None:
        error = None if ok else _error_type(exc)
        # Only on the batch's own thread while it runs: a handler abandoned past its limit that
        # ends later, or on another thread, records at once (never into a batch being flushed).
        running: _Pending | None = getattr(_local, "pending", None)
        if running is not None and running is self.pending:
            running.handled(self.queue, error, seconds)
        else:
            for meter in self.meters:
                meter.handled(self.queue, error, (seconds,))
        if self.span is not None:
            self.span.end(ok, exc)


# --- one claim batch's metric events, recorded together --------------------------------------

_local = threading.local()


class _Pending:
    """The started counts, pickup latencies and handler durations of one batch on one thread."""

    __slots__ = ("durations", "started", "waits")

    def __init__(self) -> None:
        self.started: dict[str, int] = {}
        self.waits: dict[str, list[float]] = {}
        self.durations: dict[tuple[str, str | None], list[float]] = {}

    def start(self, queue: str, waited: float | None) -> None:
        self.started[queue] = self.started.get(queue, 0) + 1
        if waited is not None:
            self.waits.setdefault(queue, []).append(waited)

    def handled(self, queue: str, error: str | None, seconds: float) -> None:
        self.durations.setdefault((queue, error), []).append(seconds)

    def flush(self, meters: list[Any]) -> None:
        for meter in meters:
            for queue, n in self.started.items():
                meter.started(queue, n, self.waits.get(queue, ()))
            for (queue, error), seconds in self.durations.items():
                meter.handled(queue, error, seconds)


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Around running one claim batch's handlers on this thread (the worker's loop): their
    started counts, pickup latencies and durations are recorded once, when the batch is done
    (one counter update per queue, a histogram's observations together), not one record per
    message while it runs. Spans are not deferred. Outside one (a Celery delivery, a process
    pool's child, a test calling ``run_handler``) each is recorded as it happens."""
    meters = backends().meters
    if not meters or getattr(_local, "pending", None) is not None:
        yield
        return
    pending = _local.pending = _Pending()
    try:
        yield
    finally:
        _local.pending = None
        try:
            pending.flush(meters)
        except Exception:  # a broken metrics backend must not cost the batch its outcomes
            logging.getLogger("zeroloss").exception("zeroloss: telemetry failed recording a batch's metrics")


def _error_type(exc: BaseException | None) -> str:
    if exc is None:
        return "_OTHER"
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


@contextlib.contextmanager
def settle_span(batch: Sequence[Completion]) -> Iterator[None]:
    """Around recording a batch of outcomes (one transaction): a span linked to each message's
    producer context, since one settle covers messages of several traces."""
    tracing = backends().tracing
    if tracing is None or not batch:
        yield
        return
    with tracing.settle_span(batch):
        yield


def finished(lease: Lease, outcome: str) -> None:
    """An attempt's outcome is committed: ``completed``, ``failed`` (retried later), ``dead``
    or ``lease_lost`` (the same ``outcome`` as the ``message_finished`` signal)."""
    finished_many({(lease.queue_name, outcome): 1})


def finished_many(counts: dict[tuple[str, str], int]) -> None:
    """A batch of outcomes is committed: ``counts[(queue, outcome)]`` attempts each (one
    counter update per queue and outcome per batch, not one per message)."""
    for meter in backends().meters:
        for (queue, outcome), n in counts.items():
            meter.finished(queue, outcome, n)


def dead_lettered(
    queue_name: str, message_id: str, attempt: int, by: str, headers: dict[str, Any] | None = None
) -> None:
    """A message went ``dead`` (``by``: ``"worker"`` or ``"sweep"``), after commit."""
    b = backends()
    for meter in b.meters:
        meter.dead_lettered(queue_name, by)
    if b.tracing is not None:
        b.tracing.event("dead_letter", queue_name, message_id, attempt, headers, by=by)


def recovered(queue_name: str, message_id: str, attempt: int) -> None:
    """The sweep put a message whose lease expired back to pending, after commit."""
    b = backends()
    for meter in b.meters:
        meter.recovered(queue_name)
    if b.tracing is not None:
        b.tracing.event("recover", queue_name, message_id, attempt, None)


def cancelled(queue_name: str, message_id: str, by: str = "operator") -> None:
    """A message was cancelled, after commit (the hook for the ``cancelled`` status)."""
    b = backends()
    for meter in b.meters:
        meter.cancelled(queue_name)
    if b.tracing is not None:
        b.tracing.event("cancel", queue_name, message_id, 0, None, by=by)


@contextlib.contextmanager
def operation(name: str, **attributes: Any) -> Iterator[None]:
    """An INTERNAL span around a ledger-wide operation: ``sweep``, ``redispatch`` or an
    operator action (``requeue``, ``redrive``, ``dead_letter``, ``purge``)."""
    tracing = backends().tracing
    if tracing is None:
        yield
        return
    with tracing.operation(name, attributes):
        yield


def current_ids() -> tuple[str, str] | None:
    """The active span's ``(trace_id, span_id)`` in hex, None without one (log records)."""
    tracing = backends().tracing
    return tracing.current_ids() if tracing is not None else None
