"""Telemetry's cost: the worker drain with each backend on against telemetry off, same run.

``python -m benchmarks --only telemetry``. Off: ``ZEROLOSS["TELEMETRY"] = False``. The other
sides (benchmarks/otel_settings.py): Prometheus only (multi-process mode, no OpenTelemetry
installed); the OpenTelemetry API without an SDK provider (no Prometheus); traces (the SDK, a
BatchSpanProcessor, every span recorded) + Prometheus; the same with one trace in ten sampled
(``TraceIdRatioBased(0.1)``); and every span + OpenTelemetry metrics (the SDK's MeterProvider). Each drains the same messages, every one carrying a ``traceparent`` header
(so a recorded consumer span is the child of a remote parent), with a no-op handler and with a
handler doing 1 ms of work (``bench.pressure``: a sleep), each message its own trace, variants rotated run by run; a ratio is
the side's median over off's. The issue's target: at most 10% cost (ratio >= 0.90).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from . import db
from .db import MSG
from .report import Target
from .suite import WorkerProcess, _log, child_env

#: (key, label, ZEROLOSS_BENCH_TELEMETRY of the side); None: off.
VARIANTS: tuple[tuple[str, str, str | None], ...] = (
    ("off", "telemetry off", None),
    ("prom", "Prometheus (multiproc) only", "prom"),
    ("api", "OTel API, no SDK provider", "api"),
    ("traces", "traces (SDK) + Prometheus", "traces"),
    ("sampled", "traces sampled 10% + Prometheus", "sampled"),
    ("all", "traces + Prometheus + OTel metrics", "all"),
)
#: (key, queue, label): the handler the drain runs.
HANDLERS = (("noop", "bench.noop", "no-op handler"), ("1ms", "bench.pressure", "1 ms handler"))


def _cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drain(suite: Any, queue: str, procs: int, mode: str | None) -> tuple[float, float, dict[str, bool]]:
    """Messages per second (the database's clock) and the workers' CPU microseconds per
    message: CPU time is what another process's load cannot inflate much, where throughput on
    a shared host swings by tens of percent from drain to drain."""
    # 6 sides x 2 handlers x 2 process counts per run: the full profile's 20,000 a drain
    # would take most of an hour; 5,000 are enough for a rate and a CPU figure.
    count = min(suite.sizes.drain, 5_000)
    with tempfile.TemporaryDirectory(prefix="zl-prom-", dir=suite.workdir) as prom:
        if mode is not None:
            env = child_env(
                suite.url,
                DJANGO_SETTINGS_MODULE="benchmarks.otel_settings",
                PROMETHEUS_MULTIPROC_DIR=prom,
                ZEROLOSS_BENCH_TELEMETRY=mode,
            )
        else:
            env = child_env(suite.url, ZEROLOSS_SETTINGS_JSON=json.dumps({"TELEMETRY": False}))
        workers = [
            WorkerProcess(
                suite.url,
                queue,
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
            cpu = sum(_cpu_seconds(w.pid) for w in workers)
            db.reset(suite.conn)
            suite.load_pending(queue, count)
            with suite.conn.transaction():
                # Each message its own trace (as single sends make): no extraction is shared,
                # and a ratio sampler sees a spread of trace ids.
                suite.conn.execute(
                    f"UPDATE {MSG} SET headers = jsonb_build_object('traceparent', '00-' || "
                    "md5(message_id) || '-' || left(md5(message_id || '.'), 16) || '-01') "
                    "WHERE queue_name = %s",
                    [queue],
                )
            suite.wait_drained(queue, count)
            cpu = sum(_cpu_seconds(w.pid) for w in workers) - cpu
            window, checks = suite.drain_window(queue)
        finally:
            for w in workers:
                w.stop()
    return count / window, cpu * 1e6 / count, checks


def run_in_suite(suite: Any, sides: list[str] | None = None, process_counts: list[int] | None = None) -> None:
    """``sides``/``process_counts`` (``--telemetry-sides``/``--telemetry-procs``): only these "on" sides (always against off) and process counts."""
    variants = VARIANTS if not sides else tuple(v for v in VARIANTS if v[0] == "off" or v[0] in sides)
    figs = {}
    cells = [(h, n) for h in HANDLERS for n in (process_counts or (1, 4))]
    for (handler, _, handler_label), procs in cells:
        plural = "es" if procs > 1 else ""
        for key, label, mode in variants:
            figs[f"{handler}.{key}{procs}"] = suite.figure(
                f"telemetry.{handler}.{key}{procs}",
                f"drain, {handler_label}, {label}, {procs} process{plural}",
                "msg/s",
                **(
                    {}
                    if mode is None
                    else {
                        "ratio_to": f"telemetry.{handler}.off{procs}",
                        "ratio_label": "off",
                        "target": Target("cost <= 10% (ratio >= 0.90)", "ratio", 0.90),
                    }
                ),
            )
            figs[f"{handler}.{key}{procs}.cpu"] = suite.figure(
                f"telemetry.{handler}.{key}{procs}.cpu",
                f"worker CPU, {handler_label}, {label}, {procs} process{plural}",
                "µs/msg",
                higher_is_better=False,
                **(
                    {}
                    if mode is None
                    else {"ratio_to": f"telemetry.{handler}.off{procs}.cpu", "ratio_label": "off"}
                ),
            )
    checks = {key: True for key in figs if not key.endswith(".cpu")}
    for run in range(suite.runs):
        for (handler, queue, _), procs in cells:
            # Rotate which side goes first, so a drift in the machine's load favours none.
            shift = run % len(variants)
            for key, _, mode in variants[shift:] + variants[:shift]:
                rate, cpu, ok = _drain(suite, queue, procs, mode)
                figs[f"{handler}.{key}{procs}"].values.append(rate)
                figs[f"{handler}.{key}{procs}.cpu"].values.append(cpu)
                checks[f"{handler}.{key}{procs}"] &= all(ok.values())
            _log(
                f"telemetry run {run + 1}, {handler}, {procs} proc: "
                + ", ".join(
                    f"{key} {figs[f'{handler}.{key}{procs}'].values[-1]:,.0f}" for key, _, _ in variants
                )
                + " msg/s; CPU "
                + ", ".join(
                    f"{key} {figs[f'{handler}.{key}{procs}.cpu'].values[-1]:,.0f}" for key, _, _ in variants
                )
                + " µs/msg"
            )
    for key, passed in checks.items():
        figs[key].checks["exactly once"] = passed
    db.reset(suite.conn)
