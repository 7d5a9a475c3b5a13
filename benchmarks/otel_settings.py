"""Benchmark worker settings with telemetry recording (benchmarks/telemetry.py, the "on" side).

An SDK TracerProvider whose spans go through a BatchSpanProcessor to an exporter that counts
and drops them (what an OTLP exporter costs on the wire is the collector's, not zeroloss's),
an SDK MeterProvider aggregating in memory, and prometheus_client in multi-process mode
(``PROMETHEUS_MULTIPROC_DIR``, set by the suite): every instrument zeroloss has, recording.
"""

import os
from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from benchmarks.settings import *  # noqa: F403


class DroppingExporter(SpanExporter):
    exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        DroppingExporter.exported += len(spans)
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
trace.set_tracer_provider(_provider)
# ZEROLOSS_BENCH_OTEL_METRICS=0: no meter provider (traces and Prometheus only).
if os.environ.get("ZEROLOSS_BENCH_OTEL_METRICS", "1") != "0":
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
