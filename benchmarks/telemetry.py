"""Telemetry's cost: the worker drain with tracing and metrics on against off, same run.

``python -m benchmarks --only telemetry``. Off: ``ZEROLOSS["TELEMETRY"] = False``. On: the SDK
recording every span and OpenTelemetry metric, and prometheus_client in multi-process mode
(benchmarks/otel_settings.py). Both drain the same messages, each carrying a ``traceparent``
header (so "on" makes every consumer span a child of a remote parent), alternating run by run;
the ratio is on's median over off's. Target: at most 10% cost (ratio >= 0.90).
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

from . import db
from .db import MSG
from .report import Target
from .suite import WorkerProcess, _log, child_env

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


#: (key, label, extra environment of the "on" side); None: off.
VARIANTS: tuple[tuple[str, str, dict[str, str] | None], ...] = (
    ("off", "telemetry off", None),
    ("traces", "traces + Prometheus (multiproc)", {"ZEROLOSS_BENCH_OTEL_METRICS": "0"}),
    ("all", "traces + Prometheus (multiproc) + OTel metrics", {}),
)


def _drain(suite: Any, procs: int, extra: dict[str, str] | None) -> tuple[float, dict[str, bool]]:
    with tempfile.TemporaryDirectory(prefix="zl-prom-", dir=suite.workdir) as prom:
        if extra is not None:
            env = child_env(
                suite.url,
                DJANGO_SETTINGS_MODULE="benchmarks.otel_settings",
                PROMETHEUS_MULTIPROC_DIR=prom,
                **extra,
            )
        else:
            env = child_env(suite.url, ZEROLOSS_SETTINGS_JSON=json.dumps({"TELEMETRY": False}))
        workers = [
            WorkerProcess(
                suite.url,
                "bench.noop",
                suite.workdir,
                "--batch-size",
                "10",
                "--poll-interval",
                "0.1",
                env=env,
            )
            for _ in range(procs)
        ]
        try:
            for w in workers:
                w.wait_ready()
            db.reset(suite.conn)
            suite.load_pending("bench.noop", suite.sizes.drain)
            with suite.conn.transaction():
                suite.conn.execute(
                    f"UPDATE {MSG} SET headers = %s::jsonb WHERE queue_name = 'bench.noop'",
                    [json.dumps({"traceparent": TRACEPARENT})],
                )
            suite.wait_drained("bench.noop", suite.sizes.drain)
            window, checks = suite.drain_window("bench.noop")
        finally:
            for w in workers:
                w.stop()
    return suite.sizes.drain / window, checks


def run_in_suite(suite: Any) -> None:
    figs = {}
    for procs in (1, 4):
        plural = "es" if procs > 1 else ""
        for key, label, extra in VARIANTS:
            figs[f"{key}{procs}"] = suite.figure(
                f"telemetry.{key}{procs}",
                f"drain, {label}, {procs} process{plural}",
                "msg/s",
                **(
                    {}
                    if extra is None
                    else {
                        "ratio_to": f"telemetry.off{procs}",
                        "ratio_label": "off",
                        "target": Target("cost <= 10% (ratio >= 0.90)", "ratio", 0.90),
                    }
                ),
            )
    checks = dict.fromkeys(figs, True)
    for run in range(suite.runs):
        for procs in (1, 4):
            # Rotate which side goes first, so a drift in the machine's load favours none.
            shift = run % len(VARIANTS)
            for key, _, extra in VARIANTS[shift:] + VARIANTS[:shift]:
                rate, ok = _drain(suite, procs, extra)
                figs[f"{key}{procs}"].values.append(rate)
                checks[f"{key}{procs}"] &= all(ok.values())
            _log(
                f"telemetry run {run + 1}, {procs} proc: "
                + ", ".join(f"{key} {figs[f'{key}{procs}'].values[-1]:,.0f}" for key, _, _ in VARIANTS)
                + " msg/s"
            )
    for key, passed in checks.items():
        figs[key].checks["exactly once"] = passed
    db.reset(suite.conn)
