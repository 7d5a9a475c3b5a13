"""The event metrics as OpenTelemetry instruments (recorded by the project's meter provider).

Names follow the messaging semantic conventions where they define one
(``messaging.client.sent.messages``, ``messaging.client.consumed.messages``,
``messaging.process.duration``); zeroloss's own events are under ``zeroloss.``. Without a
meter provider set nothing is built or called (:func:`_i`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics

from ...core.states import Status
from . import buckets
from .buckets import version

SYSTEM = "zeroloss"


try:  # the API's stand-ins until a provider is set: recording to them would record nothing
    from opentelemetry.metrics import _internal as _api

    _NO_SDK: tuple[type, ...] = (metrics.NoOpMeterProvider, _api._ProxyMeterProvider)
except (ImportError, AttributeError):  # another API version: only the explicit no-op
    _NO_SDK = (metrics.NoOpMeterProvider,)


class _Instruments:
    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter("zeroloss", version())
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", "{message}", "Messages stored by a send (committed)."
        )
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", "{message}", "Handler runs started (every attempt)."
        )
        self.process = meter.create_histogram(
            "messaging.process.duration",
            "s",
            "Seconds a handler ran.",
            explicit_bucket_boundaries_advisory=buckets.DURATION,
        )
        self.outcomes = {
            name: meter.create_counter(f"zeroloss.messages.{name}", "{message}", text)
            for name, text in (
                (Status.COMPLETED.value, "Attempts whose success was recorded."),
                ("failed", "Attempts whose failure was recorded (retried, or dead-lettered)."),
                ("dead_lettered", "Messages dead-lettered."),
                ("lease_lost", "Attempts whose outcome was refused: the lease was gone."),
                ("recovered", "Messages the sweep put back to pending."),
                (Status.CANCELLED.value, "Messages cancelled."),
                ("snoozed", "Attempts whose handler raised zeroloss.Snooze (not counted)."),
            )
        }
        self.pickup = meter.create_histogram(
            "zeroloss.pickup.duration",
            "s",
            "Seconds from a message becoming claimable to its handler's start.",
            explicit_bucket_boundaries_advisory=buckets.PICKUP,
        )
        self.batch = meter.create_histogram(
            "zeroloss.claim.batch_size",
            "{message}",
            "Messages one claim returned.",
            explicit_bucket_boundaries_advisory=[float(b) for b in buckets.BATCH],
        )


_instruments: _Instruments | None = None
_from: object = None


def _i() -> _Instruments | None:
    """The instruments of the global meter provider; None while none is set (the API alone:
    then nothing is built or called). Checked per call: a provider may be set later."""
    global _instruments, _from
    provider = metrics.get_meter_provider()
    if provider is _from:
        return _instruments
    _from = provider
    _instruments = None if isinstance(provider, _NO_SDK) else _Instruments(provider)
    return _instruments


_attributes: dict[tuple[str, str], dict[str, Any]] = {}


def _attrs(queue: str, operation: str = "process") -> dict[str, Any]:
    # Built once per queue and operation (the instruments do not keep the dict they are given).
    found = _attributes.get((queue, operation))
    if found is None:
        found = _attributes[(queue, operation)] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": queue,
            "messaging.operation.name": operation,
        }
    return found


def sent(queue: str, n: int) -> None:
    i = _i()
    if i is not None:
        i.sent.add(n, _attrs(queue, "send"))


def claimed(queue: str, n: int) -> None:
    i = _i()
    if i is not None and n:
        i.batch.record(n, _attrs(queue, "receive"))


def started(queue: str, n: int, waits: Sequence[float]) -> None:
    i = _i()
    if i is None:
        return
    attrs = _attrs(queue)
    i.consumed.add(n, attrs)
    record = i.pickup.record
    for waited in waits:  # (the API has no record-many: one call per observation)
        record(waited, attrs)


def handled(queue: str, error_type: str | None, seconds: Sequence[float]) -> None:
    i = _i()
    if i is None:
        return
    attrs = _attrs(queue)
    if error_type is not None:
        attrs = {**attrs, "error.type": error_type}
    record = i.process.record
    for s in seconds:
        record(s, attrs)


_OUTCOME_NAMES = {Status.DEAD.value: "failed"}


def finished(queue: str, outcome: str, n: int = 1) -> None:
    i = _i()
    counter = None if i is None else i.outcomes.get(_OUTCOME_NAMES.get(outcome, outcome))
    if counter is not None:
        counter.add(n, _attrs(queue))


def dead_lettered(queue: str, by: str) -> None:
    i = _i()
    if i is not None:
        i.outcomes["dead_lettered"].add(1, {**_attrs(queue), "zeroloss.by": by})


def recovered(queue: str) -> None:
    i = _i()
    if i is not None:
        i.outcomes["recovered"].add(1, _attrs(queue))


def cancelled(queue: str) -> None:
    i = _i()
    if i is not None:
        i.outcomes[Status.CANCELLED].add(1, _attrs(queue))
