"""The example project's settings with an OpenTelemetry SDK whose spans go to a file.

For tests/process/test_telemetry_processes.py: a real ``zeroloss_worker`` exports each span, as it
ends, as one JSON line to ``ZEROLOSS_TEST_SPANS`` (a SimpleSpanProcessor: nothing is lost
when the process exits).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from project.settings import *  # noqa: F403


class FileSpanExporter(SpanExporter):
    """Appends each span as one JSON line (the SDK's own ``to_json``) to a file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(json.loads(s.to_json())) + "\n" for s in spans)
        with self.lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(lines)
        return SpanExportResult.SUCCESS


if os.environ.get("ZEROLOSS_TEST_SPANS"):
    _provider = TracerProvider(resource=Resource.create({"service.name": f"worker-{os.getpid()}"}))
    _provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(os.environ["ZEROLOSS_TEST_SPANS"])))
    trace.set_tracer_provider(_provider)
