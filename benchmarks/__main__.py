"""``python -m benchmarks [--quick] [--runs N] [--only NAME ...] [--json FILE] [--profile DIR]``

Creates its own PostgreSQL databases (``--db-name``, default ``zeroloss_bench``, and
``<name>_retained`` for the retained-rows comparison) on the server
of ``--server-url`` / ``ZEROLOSS_BENCH_POSTGRES_URL`` / ``ZEROLOSS_TEST_POSTGRES_URL`` (default
``postgres://postgres@127.0.0.1:5432/postgres``), migrates it, runs the workloads of issue 8
with the raw-SQL limits measured in the same run, prints one table and drops the database.
Never gates on a number: exits 0 unless the suite itself fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

WORKLOADS = [
    "insert",
    "pgbench",
    "bulk",
    "claimack",
    "sweep",
    "retained",
    "drain",
    "latency",
    "sigkill",
    "tasks_sigkill",
]
#: Issue 12 and 16 workloads (benchmarks/throughput.py); run with ``--only``, and in the full profile.
MORE_WORKLOADS = ["batched", "bulksend", "celery", "peers", "e2e", "ordered"]
#: Run only when named in --only: minutes each (benchmarks/retention.py: on a private server;
#: benchmarks/pressure.py: the pressure cells of issue 24, 36 minutes in the full profile;
#: benchmarks/pool.py: the process pool's drain against the thread pool's, issue 27;
#: benchmarks/limits.py: queue limits' cost and accuracy, issue 27;
#: benchmarks/abort.py: abort latency on both databases, its own databases, a minute;
#: benchmarks/telemetry.py: each telemetry backend against off, 24 drains, minutes a run;
#: benchmarks/wal_life.py: WAL a message writes over its life, on a private server, issue 31;
#: benchmarks/idle.py: an idle worker's transactions a second on both databases, issue 49;
#: benchmarks/workflows.py: fan-in, release latency and chains against plain drains, issue 47).
OPT_IN = ["retention", "pressure", "pool", "limits", "abort", "telemetry", "wal_life", "idle", "workflows"]
#: Run only when named: the fault suite's soak (minutes; its own servers; benchmarks/faults.py).
ON_REQUEST = ["faults"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="Small sizes: proves the suite works (CI).")
    parser.add_argument("--runs", type=int, help="Runs per figure (default 3; the table shows the median).")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=WORKLOADS + MORE_WORKLOADS + OPT_IN + ON_REQUEST,
        metavar="NAME",
        help=f"Run only: {', '.join(WORKLOADS + MORE_WORKLOADS + OPT_IN + ON_REQUEST)} "
        "(faults: the fault suite's soak, with --quick its CI profile).",
    )
    parser.add_argument(
        "--pressure-cells",
        nargs="+",
        choices=["idle_in_tx", "readers", "overload", "burst"],
        metavar="CELL",
        help="With --only pressure: run only these cells (idle_in_tx, readers, overload, burst).",
    )
    parser.add_argument(
        "--telemetry-sides",
        nargs="+",
        choices=["prom", "api", "traces", "sampled", "all"],
        metavar="SIDE",
        help="With --only telemetry: run only these sides against off (prom, api, traces, sampled, all).",
    )
    parser.add_argument(
        "--telemetry-procs",
        nargs="+",
        type=int,
        choices=[1, 4],
        metavar="N",
        help="With --only telemetry: only these worker process counts (1, 4).",
    )
    parser.add_argument(
        "--retained-rows",
        type=int,
        metavar="N",
        help="With retained: this many completed messages retained (default 1,000,000; --quick 100,000).",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        metavar="DIR",
        help="With --only workflows: a checkout of the code before workflows, with its own .venv, "
        "whose plain drain is measured beside this code's.",
    )
    parser.add_argument("--json", type=Path, help="Also save every figure and the machine to this file.")
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="Profile persist and the worker drain with py-spy."
    )
    parser.add_argument("--server-url", help="Any database URL on the PostgreSQL server to use.")
    parser.add_argument("--db-name", default="zeroloss_bench", help="The database to create and drop.")
    parser.add_argument("--keep-db", action="store_true", help="Do not drop the database at the end.")
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = 3
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    return args


def machine_info(conn: Any) -> dict[str, Any]:
    import django
    import psycopg

    settings = {
        name: conn.execute(f"SHOW {name}").fetchone()[0]
        for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "shared_buffers")
    }
    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "",
        )
    revision = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        root = Path(__file__).resolve().parent.parent
        git = ["git", "-C", str(root)]
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "zeroloss"], capture_output=True, text=True
        ).stdout
        revision = f"{head}{' + uncommitted changes in zeroloss/' if dirty.strip() else ''}"
    return {
        "revision": revision,
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "postgresql": settings.pop("server_version"),
        **settings,
        "loadavg_start": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.only and "faults" in args.only:
        from .faults import main as faults_main

        code = faults_main([], profile="ci" if args.quick else "soak")
        args.only = [name for name in args.only if name != "faults"]
        return max(code, _run_suite(args)) if args.only else code
    return _run_suite(args)


def _run_suite(args: argparse.Namespace) -> int:
    from .db import BenchDatabase, server_url
    from .suite import STRIPPED_ENV, Sizes, Suite

    database = BenchDatabase(server_url(args.server_url), args.db_name)
    retained = BenchDatabase(database.server, f"{args.db_name}_retained")
    database.create()
    retained.create()
    for name in STRIPPED_ENV:
        os.environ.pop(name, None)
    os.environ["DATABASE_URL"] = database.url
    os.environ["ZEROLOSS_BENCH_RETAINED_URL"] = retained.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    started = time.monotonic()
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        call_command("migrate", verbosity=0, interactive=False, database="retained")
        with tempfile.TemporaryDirectory(prefix="zeroloss-bench-") as workdir:
            sizes = Sizes.for_profile(args.quick)
            if args.retained_rows:
                sizes = dataclasses.replace(sizes, retained=args.retained_rows)
            suite = Suite(database, retained, sizes, args.runs, Path(workdir))
            machine = machine_info(suite.conn)
            print(
                f"machine: {machine['nproc']} cores ({machine['cpu']}), Python {machine['python']}, "
                f"Django {machine['django']}, psycopg {machine['psycopg']}, PostgreSQL {machine['postgresql']} "
                f"(fsync={machine['fsync']}, synchronous_commit={machine['synchronous_commit']}, "
                f"wal_sync_method={machine['wal_sync_method']}), load average {machine['loadavg_start'][0]:.2f}, "
                f"code {machine['revision']}",
                flush=True,
            )
            print(
                f"profile: {'quick' if args.quick else 'full'}, {args.runs} runs per figure, database {database.name}",
                flush=True,
            )
            for name in args.only or (WORKLOADS if args.quick else WORKLOADS + MORE_WORKLOADS):
                t0 = time.monotonic()
                print(f"- {name} ...", file=sys.stderr, flush=True)
                if name == "retention":
                    from .retention import run_in_suite

                    run_in_suite(suite)
                elif name == "wal_life":
                    from .wal_life import run_in_suite as run_wal_life

                    run_wal_life(suite)
                elif name == "telemetry":
                    from .telemetry import run_in_suite as run_telemetry

                    run_telemetry(suite, sides=args.telemetry_sides, process_counts=args.telemetry_procs)
                elif name == "limits":
                    from .limits import run_in_suite as run_limits

                    run_limits(suite, quick=args.quick)
                elif name == "workflows":
                    from .workflows import run_in_suite as run_workflows

                    run_workflows(suite, quick=args.quick, baseline_tree=args.baseline_tree)
                elif name == "idle":
                    from .idle import run_in_suite as run_idle

                    run_idle(suite)
                elif name == "abort":
                    from .abort import run_in_suite as run_abort

                    run_abort(suite)
                elif name == "pressure":
                    from .pressure import run_in_suite as run_pressure

                    run_pressure(suite, quick=args.quick, cells=args.pressure_cells)
                elif name == "pool":
                    from .pool import run_in_suite as run_pool

                    run_pool(suite, quick=args.quick)
                else:
                    getattr(suite, f"run_{name.replace('claimack', 'claim_ack')}")()
                print(f"- {name}: {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
            from .report import evaluate, save_json, table

            evaluate(suite.figures)
            machine["loadavg_end"] = os.getloadavg()
            print()
            print(table(suite.figures))
            _notes(suite)
            print(
                f"\ntotal {time.monotonic() - started:.0f}s, load average at end {machine['loadavg_end'][0]:.2f}"
            )
            if args.json:
                save_json(args.json, machine, {k: str(v) for k, v in vars(args).items()}, suite.figures)
            if args.profile:
                from .hotpath import run_profiles

                run_profiles(suite, args.profile)
            suite.conn.close()
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            database.drop()
            retained.drop()
    return 0


def _notes(suite: Any) -> None:
    figs = suite.figures
    lines = []
    if "latency.p99" in figs and figs["latency.p99"].info:
        info = figs["latency.p99"].info
        lines.append(
            f"lock waits among the 8 claimers: {info['row_lock_wait_samples']} row-lock wait samples in "
            f"{info['activity_samples']} pg_stat_activity samples (all heavyweight-lock waits: "
            f"{info['lock_wait_samples'] or 'none'}); max claim latency {max(info.get('max_ms', [0])):.1f} ms"
        )
        if info.get("lock_wait_blockers"):
            lines.append(f"blocked by (the blocker's current statement): {info['lock_wait_blockers']}")
        probe = info["skip_locked_probe"]
        lines.append(
            f"SKIP LOCKED probe: queue head locked by another transaction, claim_next "
            f"{'skipped it' if probe['skipped_locked_head'] else 'did NOT skip it'} in {probe['claim_ms']:.1f} ms "
            f"(lock_timeout 1 s){' error: ' + probe['error'] if probe['error'] else ''}"
        )
    if "sigkill.rerun" in figs and figs["sigkill.rerun"].info.get("kill_to_sweep_s"):
        lines.append(
            f"SIGKILL: seconds from kill to the sweep's requeue: {figs['sigkill.rerun'].info['kill_to_sweep_s']}"
        )
    if "sweep.empty" in figs and figs["sweep.empty"].info:
        lines.append(f"sweep rate (empty): {figs['sweep.empty'].info['messages_per_second']:,.0f} msg/s")
    if lines:
        print("\n" + "\n".join(lines))
    from .pressure import notes

    notes(suite)


if __name__ == "__main__":
    sys.exit(main())
