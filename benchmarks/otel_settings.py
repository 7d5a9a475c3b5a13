"""Benchmark worker settings with telemetry recording (benchmarks/telemetry.py, the "on" sides).

``ZEROLOSS_BENCH_TELEMETRY`` picks what records (the suite sets it, and
``PROMETHEUS_MULTIPROC_DIR``):

- ``prom``: prometheus_client in multi-process mode only; ``opentelemetry`` made unimportable,
  as in a project without ``zeroloss[otel]``;
- ``api``: the OpenTelemetry API installed but no SDK provider set (``prometheus_client`` made
  unimportable): what ``zeroloss[otel]`` costs a project that has not configured OpenTelemetry;
- ``traces``: an SDK TracerProvider whose spans go through a BatchSpanProcessor to an exporter
  that counts and drops them (what an OTLP exporter costs on the wire is the collector's, not
  zeroloss's), and Prometheus;
- ``sampled``: ``traces`` with a ``TraceIdRatioBased(0.1)`` sampler: one trace in ten recorded,
  the others' spans non-recording (the mitigation docs/observability.md names);
- ``all`` (the default): ``traces`` and an SDK MeterProvider aggregating in memory: every
  instrument zeroloss has, recording.
"""

import os
import sys
from collections.abc import Sequence

from benchmarks.settings import *  # noqa: F403

MODE = os.environ.get("ZEROLOSS_BENCH_TELEMETRY", "all")
# A module set to None in sys.modules raises ImportError on import: zeroloss then sees the
# package as not installed (zeroloss.integrations.telemetry loads its backends on first use, after this).
if MODE == "prom":
    sys.modules.setdefault("opentelemetry", None)  # type: ignore[arg-type]
if MODE == "api":
    sys.modules.setdefault("prometheus_client", None)  # type: ignore[arg-type]

# The backends' packages imported now, before the worker is ready: zeroloss imports them on the
# first event, and their one-off import (the propagators' entry points, prometheus_client) would
# otherwise land in the drain's CPU figure (~0.1 s a process: 50 us a message over 2,000).
if MODE != "prom":
    import opentelemetry.metrics
    import opentelemetry.propagate
    import opentelemetry.trace  # noqa: F401
if MODE != "api":
    import prometheus_client  # noqa: F401

if MODE in ("traces", "sampled", "all"):
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, TraceIdRatioBased

    class DroppingExporter(SpanExporter):
        exported = 0

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            DroppingExporter.exported += len(spans)
            return SpanExportResult.SUCCESS

    _provider = TracerProvider(sampler=TraceIdRatioBased(0.1) if MODE == "sampled" else ALWAYS_ON)
    _provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
    trace.set_tracer_provider(_provider)
    if MODE == "all":
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
