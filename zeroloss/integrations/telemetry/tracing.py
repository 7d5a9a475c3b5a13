"""Spans of a message's life, per the OpenTelemetry messaging semantic conventions.

Imported only when ``opentelemetry-api`` is installed (:mod:`zeroloss.integrations.telemetry` decides). The
producer's context travels in the message's headers, so it survives the ledger, the Celery
broker (which carries only the id) and every retry: the headers stay on the row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Link, NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from ...ledger.types import Completion
    from ...runtime.delivery import Delivery

from .buckets import version

SYSTEM = "zeroloss"
#: The tracer spans are made with: from the global provider (or set directly, as the tests do).
_tracer: trace.Tracer | None = None
#: The global provider :data:`_tracer` came from; None when it was set directly.
_from: object = None
_NO_SDK = (ProxyTracerProvider, NoOpTracerProvider)


def live() -> trace.Tracer | None:
    """The tracer, or None while no SDK provider is set: with only the API installed nothing
    would record, so nothing is built (checked per call: a provider may be set later)."""
    global _tracer, _from
    found = _tracer
    if found is not None:
        if _from is None:
            return found
        provider = trace.get_tracer_provider()
        if provider is _from:
            return found
    else:
        provider = trace.get_tracer_provider()
    if isinstance(provider, _NO_SDK):
        return None
    _tracer, _from = provider.get_tracer("zeroloss", version()), provider
    return _tracer


def tracer() -> trace.Tracer:
    return live() or trace.get_tracer("zeroloss", version())


_bases: dict[tuple[str, str], dict[str, Any]] = {}


def _base(operation: str, kind: str, queue: str) -> dict[str, Any]:
    """A fresh copy of the attributes every span of this operation and queue has (the
    template built once; the SDK copies what it is given anyway)."""
    found = _bases.get((operation, queue))
    if found is None:
        if len(_bases) > 4096:  # queue names are few; never grow without bound
            _bases.clear()
        found = _bases[(operation, queue)] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": operation,
            "messaging.operation.type": kind,
            "messaging.destination.name": queue,
        }
    return dict(found)


class SendSpan:
    """The PRODUCER span of one send; its context is what the messages' headers carry."""

    __slots__ = ("carrier", "span")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.carrier: dict[str, str] = {}
        if span.get_span_context().is_valid:
            propagate.inject(self.carrier, context=trace.set_span_in_context(span))

    def headers(self, headers: Any) -> Any:
        """``headers`` with the trace context added; a context the caller set is kept."""
        if not self.carrier or not (headers is None or isinstance(headers, dict)):
            return headers  # (not a dict: validation refuses it as before)
        if headers and "traceparent" in headers:
            return headers
        return {**self.carrier, **(headers or {})}

    def stored(self, messages: Sequence[Any]) -> None:
        if len(messages) == 1 and self.span.is_recording():
            self.span.set_attribute("messaging.message.id", messages[0].message_id)


@contextlib.contextmanager
def send_span(queue: str, count: int) -> Iterator[Any]:
    tracer = live()
    if tracer is None:
        yield None
        return
    attributes = _base("send", "send", queue)
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with tracer.start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes) as span:
        yield SendSpan(span)


_ROOT = otel_context.Context()


_extracted: dict[tuple[Any, ...], otel_context.Context] = {}
#: The global propagator the cache is for, the header names it reads (sorted), and whether it
#: is the default pair (W3C trace context, W3C baggage: what the SDK sets unless told otherwise).
_fields: tuple[Any, tuple[str, ...], bool] = (None, (), False)
_TRACECONTEXT = TraceContextTextMapPropagator()


def _is_w3c_default(propagator: Any) -> bool:
    inner = getattr(propagator, "_propagators", None)
    return (
        type(propagator) is CompositePropagator
        and isinstance(inner, list | tuple)
        and [type(p) for p in inner] == [TraceContextTextMapPropagator, W3CBaggagePropagator]
    )


def _extract(headers: dict[str, Any] | None) -> otel_context.Context | None:
    """The producer's context in ``headers``, extracted once per distinct value of the
    propagator's fields: the messages of one ``send_many`` (one claim batch, usually) share it,
    and a batch's settle span finds each message's context its process span extracted."""
    global _fields
    if not headers:
        return None
    traceparent = headers.get("traceparent")
    if traceparent is None:
        return None
    propagator = propagate.get_global_textmap()
    if _fields[0] is not propagator:
        _fields = (propagator, tuple(sorted(propagator.fields)), _is_w3c_default(propagator))
        _extracted.clear()
    tracestate, baggage = headers.get("tracestate"), headers.get("baggage")
    w3c = _fields[2]
    if w3c:
        key: tuple[Any, ...] = (traceparent, tracestate, baggage)
    else:
        key = tuple([headers.get(name) for name in _fields[1]])
    found = _extracted.get(key)
    if found is None:
        # Small: a claim batch's contexts are what is asked for again (by its settle span), and
        # contexts kept longer outlive the young GC generation, costing more than they save.
        if len(_extracted) >= 256:
            _extracted.clear()
        if w3c and baggage is None and isinstance(traceparent, str) and isinstance(tracestate, str | None):
            # What the default pair yields without a baggage header, minus its composite and
            # the baggage propagator's pass (the trace context propagator reads only its fields).
            found = _TRACECONTEXT.extract(headers, context=_ROOT)
        else:
            found = propagator.extract({k: v for k, v in headers.items() if isinstance(v, str)})
        _extracted[key] = found
    return found


class ProcessSpan:
    """The CONSUMER span of one handler run, current until :meth:`end`."""

    __slots__ = ("span", "token")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.token = otel_context.attach(trace.set_span_in_context(span))

    def end(self, ok: bool, exc: BaseException | None) -> None:
        span = self.span
        if not ok:
            if exc is not None:
                span.record_exception(exc)
                span.set_attribute("error.type", _error_type(exc))
            span.set_status(Status(StatusCode.ERROR, _description(exc)))
        try:
            otel_context.detach(self.token)
        finally:
            span.end()


def _error_type(exc: BaseException) -> str:
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _description(exc: BaseException | None) -> str:
    if exc is None:
        return "the handler failed"
    try:
        return f"{type(exc).__name__}: {exc}"[:500]
    except Exception:  # a hostile __str__
        return type(exc).__name__


_process_bases: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}


def _process_base(queue: str, worker: str) -> tuple[str, dict[str, Any]]:
    """The span name and the attributes every run of ``queue`` on ``worker`` shares, built once."""
    found = _process_bases.get((queue, worker))
    if found is None:
        if len(_process_bases) > 4096:  # queue names and workers are few; never grow without bound
            _process_bases.clear()
        attributes = _base("process", "process", queue)
        if worker:
            attributes["messaging.client.id"] = worker
        found = _process_bases[(queue, worker)] = (f"process {queue}", attributes)
    return found


def process(delivery: Delivery, worker: str) -> ProcessSpan | None:
    """The handler run's CONSUMER span; None with no SDK provider set."""
    tracer = live()
    if tracer is None:
        return None
    lease = delivery.lease
    # The claim read the headers: no copy through Delivery.headers (it reads them when not).
    parent = _extract(lease.headers if lease.headers is not None else delivery.headers)
    name, base = _process_base(lease.queue_name, worker)
    attributes = {**base, "messaging.message.id": lease.message_id, "zeroloss.attempt": lease.attempt}
    # One message, one trace: the producer's context is the parent (no link: it would say the
    # same, at a cost per message). A message sent without one starts a trace of its own.
    span = tracer.start_span(
        name,
        context=parent if parent is not None else _ROOT,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )
    return ProcessSpan(span)


@contextlib.contextmanager
def settle_span(batch: Sequence[Completion]) -> Iterator[None]:
    tracer = live()
    if tracer is None:
        yield
        return
    queues = {c.lease.queue_name for c in batch}
    queue = next(iter(queues)) if len(queues) == 1 else ""
    attributes: dict[str, Any] = _base("settle", "settle", queue) if queue else {"messaging.system": SYSTEM}
    attributes["messaging.batch.message_count"] = len(batch)
    links = []
    for c in batch:
        parent = _extract(c.lease.headers)
        if parent is not None:
            ctx = trace.get_current_span(parent).get_span_context()
            links.append(Link(ctx, {"messaging.message.id": c.lease.message_id}))
    with tracer.start_as_current_span(
        f"settle {queue}".strip(), kind=SpanKind.CLIENT, attributes=attributes, links=links
    ):
        yield


def event(
    name: str,
    queue: str,
    message_id: str,
    attempt: int,
    headers: dict[str, Any] | None,
    **extra: Any,
) -> None:
    """A dead-letter, recovery or cancel: an event on the current span (the sweep's, an
    operator action's) or, with none, a span of its own in the message's trace."""
    tracer = live()
    if tracer is None:
        return
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.message.id": message_id,
    }
    if attempt:
        attributes["zeroloss.attempt"] = attempt
    attributes.update({f"zeroloss.{k}": v for k, v in extra.items()})
    parent = _extract(headers)
    current = trace.get_current_span()
    if parent is None and current.is_recording():
        current.add_event(f"zeroloss.{name}", attributes)
        return
    with tracer.start_as_current_span(
        f"{name} {queue}", context=parent, kind=SpanKind.INTERNAL, attributes=attributes
    ):
        pass


@contextlib.contextmanager
def operation(name: str, attributes: dict[str, Any]) -> Iterator[None]:
    tracer = live()
    if tracer is None:
        yield
        return
    attrs = {"messaging.system": SYSTEM, **{f"zeroloss.{k}": v for k, v in attributes.items()}}
    with tracer.start_as_current_span(f"zeroloss {name}", kind=SpanKind.INTERNAL, attributes=attrs):
        yield


def current_ids() -> tuple[str, str] | None:
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
