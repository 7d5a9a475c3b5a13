"""Traces and metrics across real processes: the sender here, real ``zeroloss_worker``s.

Spans: the worker runs with tests/infra/settings_otel.py, whose SDK writes each span to a file as it
ends; this process's SDK keeps its own in memory. Metrics: workers write into one
``PROMETHEUS_MULTIPROC_DIR``; a worker's ``--metrics-port`` serves their sum over HTTP.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from django.db.models.functions import Now
from opentelemetry import trace
from prometheus_client.parser import text_string_to_metric_families

import zeroloss
from project.demo.models import HandledRecord
from tests.infra.pgcluster import free_port
from tests.support.processes import db_worker
from zeroloss.integrations.telemetry import prometheus
from zeroloss.ledger.models import Message, Status
from zeroloss.ledger.service import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _hex(value: int, width: int) -> str:
    return "0x" + format(value, f"0{width}x")


def _worker_spans(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _burst(path: Path, *args: str, **env: str) -> str:
    worker = db_worker(
        "--queue",
        "demo.record",
        "--burst",
        *args,
        DJANGO_SETTINGS_MODULE="tests.infra.settings_otel",
        ZEROLOSS_TEST_SPANS=str(path),
        **env,
    )
    try:
        assert worker.wait_exit(120) == 0, worker.text
    finally:
        worker.terminate()
    return worker.text


def test_producer_and_consumer_spans_share_a_trace_across_processes(spans, tmp_path):
    path = tmp_path / "spans.jsonl"
    zeroloss.send("demo.record", {}, message_id="otel-ok")
    zeroloss.send("demo.record", {"fail": True}, message_id="otel-fail", max_attempts=1)
    sent = {
        s.attributes["messaging.message.id"]: s
        for s in spans.get_finished_spans()
        if s.name == "send demo.record"
    }
    assert set(sent) == {"otel-ok", "otel-fail"}
    assert all(s.kind is trace.SpanKind.PRODUCER for s in sent.values())
    # The context travels in the stored headers.
    for mid, span in sent.items():
        headers = Message.objects.get(message_id=mid).headers or {}
        assert headers["traceparent"].split("-")[1] == format(span.context.trace_id, "032x")

    _burst(path)

    worker = _worker_spans(path)
    process = {
        s["attributes"]["messaging.message.id"]: s for s in worker if s["name"] == "process demo.record"
    }
    assert set(process) == {"otel-ok", "otel-fail"}
    for mid, span in process.items():
        producer = sent[mid]
        assert span["kind"] == "SpanKind.CONSUMER"
        assert span["context"]["trace_id"] == _hex(producer.context.trace_id, 32)
        assert span["parent_id"] == _hex(producer.context.span_id, 16)
        assert span["links"] == []  # the parent says it: one message, one trace
        attributes = span["attributes"]
        assert attributes["messaging.system"] == "zeroloss"
        assert attributes["messaging.destination.name"] == "demo.record"
        assert attributes["messaging.operation.type"] == "process"
        assert attributes["messaging.operation.name"] == "process"
        assert attributes["zeroloss.attempt"] == 1
        assert span["resource"]["attributes"]["service.name"].startswith("worker-")
    assert process["otel-ok"]["status"]["status_code"] == "UNSET"
    failed = process["otel-fail"]
    assert failed["status"]["status_code"] == "ERROR"
    assert failed["attributes"]["error.type"] == "RuntimeError"
    [exception] = [e for e in failed["events"] if e["name"] == "exception"]
    assert "this message always fails" in exception["attributes"]["exception.message"]
    # Its dead letter is a span of the same trace.
    [dead] = [s for s in worker if s["name"] == "dead_letter demo.record"]
    assert dead["context"]["trace_id"] == _hex(sent["otel-fail"].context.trace_id, 32)
    assert dead["attributes"]["zeroloss.by"] == "worker"
    # The settle (one transaction for both outcomes) links both messages' traces.
    settles = [s for s in worker if s["name"] == "settle demo.record"]
    linked = {link["attributes"]["messaging.message.id"] for s in settles for link in s["links"]}
    assert linked == {"otel-ok", "otel-fail"}


def test_a_retry_keeps_the_trace(spans, tmp_path):
    path = tmp_path / "spans.jsonl"
    zeroloss.send("demo.record", {"fail": True}, message_id="otel-retry", max_attempts=2)
    [producer] = [s for s in spans.get_finished_spans() if s.name == "send demo.record"]
    # The first attempt; its retry 10 minutes off (no jitter), then due by the database's clock.
    far_off = {"RETRY_BACKOFF": {"BASE": 600, "MAX": 600, "JITTER": False}}
    _burst(path, "--max-messages", "1", ZEROLOSS_SETTINGS_JSON=json.dumps(far_off))
    assert Message.objects.get(message_id="otel-retry").status == Status.PENDING
    Message.objects.filter(message_id="otel-retry").update(available_at=Now())
    _burst(path)
    assert Message.objects.get(message_id="otel-retry").status == Status.DEAD
    runs = [s for s in _worker_spans(path) if s["name"] == "process demo.record"]
    assert [r["attributes"]["zeroloss.attempt"] for r in runs] == [1, 2]
    assert {r["context"]["trace_id"] for r in runs} == {_hex(producer.context.trace_id, 32)}
    assert {r["parent_id"] for r in runs} == {_hex(producer.context.span_id, 16)}


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_two_workers_write_one_multiprocess_dir_and_one_scrape_sums_them(tmp_path):
    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    q = ("queue", "demo.record")
    sent_before = prometheus.SENT.labels("demo.record")._value.get()
    zeroloss.send_many("demo.record", [{} for _ in range(12)])
    zeroloss.send_many("demo.record", [{"fail": True} for _ in range(3)], max_attempts=1)
    first = db_worker("--queue", "demo.record", "--burst", **env)
    assert first.popen.wait(timeout=120) == 0, first.text
    first.terminate()
    handled_by_first = HandledRecord.objects.count()
    assert handled_by_first == 12
    zeroloss.send_many("demo.record", [{} for _ in range(8)])
    port = free_port()
    second = db_worker("--queue", "demo.record", "--metrics-port", str(port), "--poll-interval", "0.1", **env)
    try:
        assert wait_until(lambda: HandledRecord.objects.count() == 20, timeout=120), second.text
        assert wait_until(lambda: not Message.objects.exclude(status__in=("completed", "dead")).exists(), 60)
        completed = Message.objects.filter(status="completed").count()
        dead = Message.objects.filter(status="dead").count()
        assert (completed, dead) == (20, 3)
        # Outcomes are counted after their commit: wait for the scrape to catch up, bounded.
        assert wait_until(
            lambda: _scrape(port).get(("zeroloss_messages_completed_total", (q,))) == completed, 30
        ), second.text
        samples = _scrape(port)
        worker_pids = {r.worker for r in HandledRecord.objects.all()}
        assert len(worker_pids) == 2  # both processes ran handlers; this one scrape sums both
    finally:
        second.terminate()
    assert samples[("zeroloss_messages_started_total", (q,))] == completed + dead
    assert samples[("zeroloss_messages_failed_total", (q,))] == dead
    assert samples[("zeroloss_messages_dead_lettered_total", (("by", "worker"), q))] == dead
    assert samples[("zeroloss_handler_duration_seconds_count", (("outcome", "ok"), q))] == completed
    assert samples[("zeroloss_handler_duration_seconds_count", (("outcome", "error"), q))] == dead
    assert samples[("zeroloss_pickup_latency_seconds_count", (q,))] == completed + dead
    assert samples[("zeroloss_claim_batch_size_sum", (q,))] == completed + dead
    # Sent is counted by the sender: this process (not in the multiprocess directory).
    assert prometheus.SENT.labels("demo.record")._value.get() - sent_before == 23


@pytest.fixture
def celery_broker(settings):
    """Celery over the real Redis broker (tests/process/test_transport.py's, a db index emptied first)."""
    import redis

    from project.celery import app as celery_app
    from tests.support.celery import REDIS_URL, use_broker

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    settings.ZEROLOSS = {**settings.ZEROLOSS, "TRANSPORT": "celery"}
    old = celery_app.conf.broker_url
    use_broker(REDIS_URL)
    yield REDIS_URL
    use_broker(old)
    client.flushdb()
    client.close()


@pytest.mark.slow
def test_the_trace_survives_the_celery_broker(spans, tmp_path, celery_broker):
    from tests.support.processes import celery_worker

    path = tmp_path / "spans.jsonl"
    worker = celery_worker(
        celery_broker, DJANGO_SETTINGS_MODULE="tests.infra.settings_otel", ZEROLOSS_TEST_SPANS=str(path)
    )
    try:
        zeroloss.send("demo.record", {}, message_id="via-celery")
        [producer] = [s for s in spans.get_finished_spans() if s.name == "send demo.record"]
        assert wait_until(
            lambda: Message.objects.get(message_id="via-celery").status == Status.COMPLETED, timeout=120
        ), worker.text[-3000:]
        assert wait_until(
            lambda: any(s["name"] == "process demo.record" for s in _worker_spans(path)), timeout=30
        )
    finally:
        worker.terminate(timeout=15)
    [process] = [s for s in _worker_spans(path) if s["name"] == "process demo.record"]
    assert process["kind"] == "SpanKind.CONSUMER"
    assert process["context"]["trace_id"] == _hex(producer.context.trace_id, 32)
    assert process["parent_id"] == _hex(producer.context.span_id, 16)
    assert process["attributes"]["messaging.message.id"] == "via-celery"
