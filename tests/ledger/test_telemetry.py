"""Telemetry in one process: headers, log records, OpenTelemetry metrics, and nothing of it
without the packages (the cross-process proof is tests/process/test_telemetry_processes.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import zeroloss
from tests.conftest import ROOT, child_env
from zeroloss.ledger.models import Message
from zeroloss.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


_reader = InMemoryMetricReader()


@pytest.fixture
def otel_metrics():
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
    return _reader


def _points(reader, name):
    out = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for p in m.data.data_points:
                        out[tuple(sorted(p.attributes.items()))] = p
    return out


def test_a_send_inside_a_span_is_its_child_and_a_callers_traceparent_is_kept(spans):
    tracer = spans.provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        message = zeroloss.send("demo.record", {}, message_id="child", headers={"requested_by": "me"})
    stored = Message.objects.get(message_id="child").headers or {}
    assert stored["requested_by"] == "me"
    assert stored["traceparent"].split("-")[1] == format(request.get_span_context().trace_id, "032x")
    [send] = [s for s in spans.get_finished_spans() if s.name == "send demo.record"]
    assert send.parent.span_id == request.get_span_context().span_id
    assert send.attributes["messaging.message.id"] == message.message_id
    mine = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    zeroloss.send("demo.record", {}, message_id="own", headers={"traceparent": mine})
    assert Message.objects.get(message_id="own").headers == {"traceparent": mine}


def test_send_many_is_one_producer_span_and_each_message_carries_it(spans):
    zeroloss.send_many("demo.record", [{}, {}, {}], headers=[None, {"a": "1"}, None])
    [send] = [s for s in spans.get_finished_spans() if s.name == "send demo.record"]
    assert send.attributes["messaging.batch.message_count"] == 3
    trace_id = format(send.context.trace_id, "032x")
    rows = [h or {} for h in Message.objects.order_by("id").values_list("headers", flat=True)]
    assert [h["traceparent"].split("-")[1] for h in rows] == [trace_id] * 3
    assert rows[1]["a"] == "1"


def test_log_records_carry_the_trace_and_span_ids(spans, caplog):
    zeroloss.send("demo.record", {"fail": True}, message_id="logged", max_attempts=1)
    with caplog.at_level(logging.WARNING, logger="zeroloss"):
        drain("demo.record")
    [failed] = [r for r in caplog.records if "handler" in r.getMessage() and r.message_id == "logged"]
    [process] = [s for s in spans.get_finished_spans() if s.name == "process demo.record"]
    assert failed.trace_id == format(process.context.trace_id, "032x")
    assert failed.span_id == format(process.context.span_id, "016x")
    # A record made with no span active has none.
    logging.getLogger("zeroloss").warning("outside")
    assert not hasattr(caplog.records[-1], "trace_id")


def test_opentelemetry_metrics_when_a_meter_provider_is_set(spans, otel_metrics):
    before = _points(otel_metrics, "messaging.client.sent.messages")
    zeroloss.send_many("demo.record", [{}, {}])
    zeroloss.send("demo.record", {"fail": True}, max_attempts=1)
    drain("demo.record")
    key = (
        ("messaging.destination.name", "demo.record"),
        ("messaging.operation.name", "send"),
        ("messaging.system", "zeroloss"),
    )
    sent = _points(otel_metrics, "messaging.client.sent.messages")
    assert sent[key].value - (before[key].value if key in before else 0) == 3
    process = _points(otel_metrics, "messaging.process.duration")
    failed = [p for k, p in process.items() if ("error.type", "RuntimeError") in k]
    assert failed and failed[0].count >= 1
    assert _points(otel_metrics, "zeroloss.messages.completed")
    assert _points(otel_metrics, "zeroloss.claim.batch_size")


def test_a_snooze_is_counted_as_snoozed(otel_metrics):
    import tests.infra.retry_app.zeroloss_handlers  # noqa: F401  (the rp.* queues)
    from zeroloss.integrations.telemetry.prometheus import NAMES

    key = (
        ("messaging.destination.name", "rp.script"),
        ("messaging.operation.name", "process"),
        ("messaging.system", "zeroloss"),
    )
    before = _points(otel_metrics, "zeroloss.messages.snoozed")
    zeroloss.send("rp.script", {"script": ["snooze"], "delay": 60})
    assert list(drain("rp.script").outcomes.values()) == ["snoozed"]
    after = _points(otel_metrics, "zeroloss.messages.snoozed")
    assert after[key].value - (before[key].value if key in before else 0) == 1
    assert "zeroloss_messages_snoozed" in NAMES


@pytest.mark.process
def test_zeroloss_works_and_imports_no_opentelemetry_without_it():
    script = textwrap.dedent(
        """
        import importlib.abc, sys

        class Blocked(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, Blocked())
        import django
        django.setup()
        import zeroloss
        from zeroloss.testing import drain
        zeroloss.send("demo.record", {}, message_id="no-otel")
        result = drain("demo.record")
        assert result.outcomes == {"no-otel": "completed"}, result
        from zeroloss.ledger.models import Message
        assert Message.objects.get(message_id="no-otel").headers is None
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert not loaded, loaded
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=child_env(DJANGO_SETTINGS_MODULE="project.settings"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.process
@pytest.mark.parametrize(
    ("port", "text"),
    [
        ("0", "--metrics-port must be 1-65535, got 0."),
        ("70000", "--metrics-port must be 1-65535, got 70000."),
    ],
)
def test_a_bad_metrics_port_is_a_usage_error_before_anything_runs(port, text):
    from tests.support.processes import db_worker

    zeroloss.send("demo.record", {}, message_id="untouched")
    worker = db_worker("--queue", "demo.record", "--burst", "--metrics-port", port)
    assert worker.wait_exit(60) == 2, worker.text
    worker.terminate()
    assert text in worker.text
    assert Message.objects.get(message_id="untouched").status == "pending"  # nothing ran


def test_every_dashboard_query_reads_metrics_zeroloss_exports():
    """docs/grafana/check_queries.py runs the queries against a real Prometheus; this keeps the
    dashboard's metric names in step with the code wherever Prometheus is not installed."""
    import json
    import re

    from zeroloss.integrations.telemetry.prometheus import NAMES
    from zeroloss.ops.metrics import METRICS

    exported = {name for name, _, _ in METRICS}
    for name in NAMES:
        exported |= {f"{name}_total", f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    dashboard = json.loads((ROOT / "docs" / "grafana" / "zeroloss-dashboard.json").read_text())
    used = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used |= set(re.findall(r"\b(zeroloss_[a-z_]+)\b", target["expr"]))
    assert used and used <= exported, used - exported
    # Every event metric has a panel.
    assert set(NAMES) <= {re.sub(r"_(total|bucket|sum|count)$", "", u) for u in used}


def test_asend_and_a_task_enqueue_make_producer_spans(spans):
    from asgiref.sync import async_to_sync

    from tests.infra import task_functions as tf

    async_to_sync(zeroloss.asend)("demo.record", {}, message_id="async-sent")
    [send] = [s for s in spans.get_finished_spans() if s.name == "send demo.record"]
    assert send.kind.name == "PRODUCER"
    assert send.attributes["messaging.message.id"] == "async-sent"
    headers = Message.objects.get(message_id="async-sent").headers or {}
    assert headers["traceparent"].split("-")[1] == format(send.context.trace_id, "032x")
    result = tf.echo.enqueue(1)
    [enqueued] = [s for s in spans.get_finished_spans() if s.name == "send demo.tasks"]
    assert enqueued.attributes["messaging.message.id"] == result.id


@pytest.mark.process
def test_with_the_api_but_no_sdk_provider_nothing_is_built_until_one_is_set():
    # zeroloss[otel] installed, OpenTelemetry not configured: no span, no header, no metric
    # instrument (the cost is a type check per event); a provider set later is followed.
    script = textwrap.dedent(
        """
        import sys
        import django
        django.setup()
        import zeroloss
        from zeroloss.ledger.models import Message
        from zeroloss.integrations.telemetry import otel_metrics, tracing
        from zeroloss.testing import drain
        zeroloss.send("demo.record", {}, message_id="no-sdk")
        assert drain("demo.record").outcomes == {"no-sdk": "completed"}
        assert Message.objects.get(message_id="no-sdk").headers is None
        assert tracing.live() is None and otel_metrics._i() is None
        assert tracing._tracer is None and otel_metrics._instruments is None
        assert not [m for m in sys.modules if m.startswith("opentelemetry.sdk")]

        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        zeroloss.send("demo.record", {}, message_id="sdk")
        assert "traceparent" in Message.objects.get(message_id="sdk").headers
        drain("demo.record")
        names = sorted(s.name for s in exporter.get_finished_spans())
        assert names == ["process demo.record", "send demo.record", "settle demo.record"], names
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=child_env(DJANGO_SETTINGS_MODULE="project.settings"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_messages_of_one_batch_keep_their_own_producers_context(spans):
    # The extracted context is cached per header value: equal headers share it, others do not.
    a = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    b = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for mid, parent in (("a1", a), ("a2", a), ("b1", b)):
        zeroloss.send("demo.record", {}, message_id=mid, headers={"traceparent": parent})
    drain("demo.record")
    finished = spans.get_finished_spans()
    parents = {
        s.attributes["messaging.message.id"]: (
            format(s.context.trace_id, "032x"),
            format(s.parent.span_id, "016x"),
        )
        for s in finished
        if s.name == "process demo.record"
    }
    assert parents == {
        "a1": ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
        "a2": ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
        "b1": ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"),
    }
    linked = {
        (format(link.context.trace_id, "032x"), link.attributes["messaging.message.id"])
        for s in finished
        if s.name == "settle demo.record"
        for link in s.links
    }
    assert linked == {
        ("4bf92f3577b34da6a3ce929d0e0e4736", "a1"),
        ("4bf92f3577b34da6a3ce929d0e0e4736", "a2"),
        ("0af7651916cd43dd8448eb211c80319c", "b1"),
    }


def _lease(mid, queue="demo.record"):
    import datetime as dt
    import uuid

    from zeroloss.ledger.types import Lease

    now = dt.datetime.now(dt.UTC)
    return Lease(
        mid, uuid.uuid4(), now, 1, queue, {}, 5, headers={}, available_at=now - dt.timedelta(seconds=2)
    )


def _count(reader, name, queue="demo.record"):
    return sum(
        p.value if hasattr(p, "value") else p.count  # a counter's point, a histogram's
        for key, p in _points(reader, name).items()
        if ("messaging.destination.name", queue) in key
    )


def test_a_batchs_started_counts_and_durations_are_recorded_once_at_its_end(otel_metrics):
    from zeroloss.integrations import telemetry
    from zeroloss.runtime.delivery import Delivery

    consumed, duration = "messaging.client.consumed.messages", "messaging.process.duration"
    before = (_count(otel_metrics, consumed), _count(otel_metrics, duration))
    with telemetry.batch():
        for i, ok in enumerate((True, True, False)):
            telemetry.process(Delivery(_lease(f"batched-{i}")), "w").end(
                ok, 0.02, None if ok else ValueError("x")
            )
        # Nothing recorded yet: the batch's events wait for its end.
        assert (_count(otel_metrics, consumed), _count(otel_metrics, duration)) == before
    assert _count(otel_metrics, consumed) == before[0] + 3
    assert _count(otel_metrics, duration) == before[1] + 3
    pickup = _points(otel_metrics, "zeroloss.pickup.duration")
    assert any(p.count >= 3 and p.sum >= 6 for p in pickup.values())  # each waited about 2 s
    # Outside a batch each run is recorded as it ends.
    telemetry.process(Delivery(_lease("alone")), "w").end(True, 0.01)
    assert _count(otel_metrics, consumed) == before[0] + 4


def test_a_run_ending_off_its_batchs_thread_is_recorded_at_once(otel_metrics):
    """A handler run that ends on another thread (one abandoned past its time limit ends
    later) records its duration when it ends, never into the batch its claim thread flushes."""
    import threading

    from zeroloss.integrations import telemetry
    from zeroloss.runtime.delivery import Delivery

    duration = "messaging.process.duration"
    before = _count(otel_metrics, duration)
    with telemetry.batch():
        run = telemetry.process(Delivery(_lease("elsewhere")), "w")
        ended = threading.Thread(target=run.end, args=(True, 0.01))
        ended.start()
        ended.join(timeout=10)
        assert not ended.is_alive()
        assert _count(otel_metrics, duration) == before + 1
    assert _count(otel_metrics, duration) == before + 1  # and not again at the batch's end


def test_a_prometheus_histogram_observed_as_a_batch_equals_one_observation_at_a_time():
    from prometheus_client import CollectorRegistry, Histogram

    from zeroloss.integrations.telemetry import buckets
    from zeroloss.integrations.telemetry.prometheus import _observe

    values = [0.0, 0.004, 0.005, 0.0051, 0.3, 0.3, 59.0, 300.0, 301.0, 1e9]
    collected = []
    for record in (lambda h: [h.observe(v) for v in values], lambda h: _observe(h, values)):
        registry = CollectorRegistry()
        histogram = Histogram("h", "h", ["queue"], buckets=buckets.DURATION, registry=registry)
        record(histogram.labels("q"))
        collected.append(
            [
                (s.name, s.labels, s.value)
                for m in registry.collect()
                for s in m.samples
                if s.name != "h_created"
            ]
        )
    assert collected[0] == collected[1]
    assert dict(((n, s["le"]) if "le" in s else n, v) for n, s, v in collected[1])[
        ("h_bucket", "+Inf")
    ] == len(values)


def test_the_producers_context_is_what_the_global_propagator_extracts():
    from opentelemetry import baggage, propagate, trace

    from zeroloss.integrations.telemetry import tracing

    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for headers in (
        {"traceparent": tp},
        {"traceparent": tp, "tracestate": "vendor=1"},
        {"traceparent": tp, "baggage": "user=alice", "other": 3},  # baggage: the whole propagator
        {"traceparent": "00-not-a-context"},
    ):
        ours = tracing._extract(dict(headers))
        theirs = propagate.extract({k: v for k, v in headers.items() if isinstance(v, str)})
        assert ours is not None
        assert (
            trace.get_current_span(ours).get_span_context()
            == trace.get_current_span(theirs).get_span_context()
        )
        assert baggage.get_all(ours) == baggage.get_all(theirs)
    assert baggage.get_all(tracing._extract({"traceparent": tp, "baggage": "user=alice"})) == {
        "user": "alice"
    }
    assert tracing._extract({"tracestate": "vendor=1"}) is None
