"""What an idle ``zeroloss_worker`` costs its database: transactions a second, nothing to do.

``python -m benchmarks.idle [--seconds N] [--db-name NAME]`` (or
``python -m benchmarks --only idle``, a minute a row; ``--quick``: 20 s).

Each row is one real ``zeroloss_worker`` of the example project (``project.settings``, every
setting at its default, the database transport), started on a fresh database, left idle until
its start-up is over, then counted over the window:

- **over its life**, PostgreSQL: ``pg_stat_database.xact_commit`` of its own database (on a
  private server started for the run, ``benchmarks.retention.private_server``), read before the worker starts and after it exited, per second of its life,
  start-up and shutdown included. PostgreSQL flushes a backend's counts lazily (a rarely active
  one's only at its next activity) but always as it ends, so only the whole life is counted
  exactly. PostgreSQL also wakes every listening backend to read past other databases'
  notifications once they pile up (a transaction of its own, counted in the listener's
  database): a bare ``LISTEN`` connection in a second database counts those over the same life;
  they are shown apart and taken off (none on a quiet server);
- **idle**: from ``SETTLE`` after its start (its first safety-net look has run, so its start-up's
  counts are in) to its exit, by ``xact_commit`` (PostgreSQL) and by the worker's own count
  (``benchmarks/idle_settings.py``: statements run outside a transaction, and commits), over
  the window; SQLite, which has no ``xact_commit``, has the worker's count only.

Every row also gives the statements the worker itself counted. The rows: every registered queue
(ten in the example project) and one queue, with the listener (the default), and with
``--no-listen`` (polling, as behind a transaction-pooling PgBouncer).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from . import db

ROOT = Path(__file__).resolve().parent.parent
#: Seconds before the window opens: the worker's first safety-net look (IDLE_POLL, 30 s) has
#: run, so its claim thread's start-up counts are flushed (PostgreSQL flushes a backend's counts
#: at its next activity, or later).
SETTLE = 35.0
#: The environment a benchmark worker must not inherit: every setting at its default.
STRIPPED = (
    "ZEROLOSS_ACK_TIMEOUT",
    "ZEROLOSS_SWEEP_INTERVAL",
    "ZEROLOSS_SETTINGS_JSON",
    "CELERY_BROKER_URL",
    "REDIS_URL",
)
CASES = (
    ("every queue", ()),
    ("one queue", ("--queue", "demo.record")),
    ("every queue, --no-listen", ("--no-listen",)),
)


def _env(url: str, counts: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="benchmarks.idle_settings",
        PYTHONPATH=str(ROOT),
        ZEROLOSS_BENCH_IDLE_COUNTS=str(counts),
        PGAPPNAME="zl-bench-idle",
    )
    return env


def _counted(counts: Path, since: float, until: float) -> tuple[int, int]:
    """The worker's own (statements, transactions) between two of its per-second lines."""
    lines = [json.loads(x) for x in counts.read_text().splitlines() if x.strip()]
    first = min((x for x in lines if x["t"] >= since), key=lambda x: x["t"])
    last = max((x for x in lines if x["t"] <= until), key=lambda x: x["t"])
    return last["statements"] - first["statements"], last["transactions"] - first["transactions"]


def _migrate(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=300
    )


def _xact_commit(admin_url: str, name: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [name]).fetchone()
    assert row is not None
    return int(row[0])


def _sessions(admin_url: str, name: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [name]).fetchone()
    return int(row[0]) if row else 0


def measure(vendor: str, args: tuple[str, ...], seconds: float, server: str, name: str) -> dict[str, Any]:
    """One worker, idle ``seconds`` seconds once settled: its transactions and statements a second."""
    admin_url = db.with_database(server, "postgres")
    with tempfile.TemporaryDirectory(prefix="zeroloss-idle-") as work:
        counts = Path(work) / "counts.jsonl"
        bare: db.BenchDatabase | None = None
        if vendor == "postgresql":
            database = db.BenchDatabase(server, name)
            database.create()
            url = database.url
            bare = db.BenchDatabase(server, f"{name}_bare")
            bare.create()
        else:
            database = None
            url = f"sqlite:///{work}/idle.sqlite3"
        listener = psycopg.connect(bare.url, autocommit=True) if bare is not None else None
        try:
            if listener is not None:
                listener.execute("LISTEN zeroloss_wakeup")
            env = _env(url, counts)
            _migrate({**env, "ZEROLOSS_BENCH_IDLE_COUNTS": ""})
            if database is not None:
                # The migration's writes would have autovacuum analyse every table during the
                # window (a transaction each, in this database's count): done now instead.
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE")
            before = _xact_commit(admin_url, name) if database else 0
            bare_before = _xact_commit(admin_url, bare.name) if bare else 0
            born = time.time()
            worker = subprocess.Popen(
                [sys.executable, "manage.py", "zeroloss_worker", *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            try:
                time.sleep(SETTLE)
                since = time.time()
                at_since = _xact_commit(admin_url, name) if database else 0
                bare_at_since = _xact_commit(admin_url, bare.name) if bare else 0
                time.sleep(seconds)
                until = time.time()
                os.killpg(worker.pid, signal.SIGTERM)
                if listener is not None:
                    listener.close()
                _, err = worker.communicate(timeout=60)
                if worker.returncode != 0:
                    raise RuntimeError(f"the idle worker exited {worker.returncode}: {err[-2000:]}")
                stopped = time.time()
            finally:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait(timeout=30)
            statements, transactions = _counted(counts, since, until)
            row: dict[str, Any] = {
                "statements_per_s": statements / (until - since),
                "client_transactions_per_s": transactions / (until - since),
            }
            if database is not None and bare is not None:
                deadline = time.monotonic() + 30
                while (
                    _sessions(admin_url, name) or _sessions(admin_url, bare.name)
                ) and time.monotonic() < deadline:
                    time.sleep(0.2)
                lived = stopped - born
                elsewhere = (_xact_commit(admin_url, bare.name) - bare_before) / lived
                total = (_xact_commit(admin_url, name) - before) / lived
                row["xact_commit_per_s"] = total - elsewhere
                row["elsewhere_per_s"] = elsewhere
                row["lived"] = lived
                idle_elsewhere = _xact_commit(admin_url, bare.name) - bare_at_since
                row["xact_commit_idle_per_s"] = (
                    _xact_commit(admin_url, name) - at_since - idle_elsewhere
                ) / (stopped - since)
            return row
        finally:
            if listener is not None:
                listener.close()
            for d in (database, bare):
                if d is not None:
                    d.drop()


def run(seconds: float, db_name: str = "zeroloss_bench") -> list[dict[str, Any]]:
    """Every row; PostgreSQL's on a private server started for the run (``tests/infra/pgcluster.py``):
    on a shared one, other databases' notifications reach every listener (see the module doc)."""
    from .retention import private_server

    rows = []
    with private_server(f"{db_name}_idle_server") as url:
        for vendor in ("postgresql", "sqlite"):
            for label, args in CASES:
                if vendor == "sqlite" and "--no-listen" in args:
                    continue  # SQLite never listens: its rows are the polling ones
                figures = measure(vendor, args, seconds, url, f"{db_name}_idle")
                rows.append({"database": vendor, "worker": label, "seconds": seconds, **figures})
                print(f"  . idle {vendor}, {label}: {figures}", file=sys.stderr, flush=True)
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| database | worker (1 thread, default settings) | transactions / s idle (xact_commit) | "
        "transactions / s idle (counted by the worker) | transactions / s over its life (xact_commit) | "
        "other databases' notifications / s (taken off) | statements / s idle | idle window / life |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        idle = f"{r['xact_commit_idle_per_s']:.2f}" if "xact_commit_idle_per_s" in r else "-"
        life = f"{r['xact_commit_per_s']:.2f}" if "xact_commit_per_s" in r else "-"
        elsewhere = f"{r['elsewhere_per_s']:.2f}" if "elsewhere_per_s" in r else "-"
        lived = f"{r['lived']:.0f} s" if "lived" in r else "-"
        lines.append(
            f"| {r['database']} | {r['worker']} | {idle} | {r['client_transactions_per_s']:.2f} | {life} | "
            f"{elsewhere} | {r['statements_per_s']:.2f} | {r['seconds']:.0f} s / {lived} |"
        )
    return "\n".join(lines)


def run_in_suite(suite: Any) -> None:
    """``python -m benchmarks --only idle``: printed after the table."""
    seconds = 20.0 if suite.sizes.sigkill_runs == 1 else 60.0  # the quick profile's sizes
    print("\nidle worker:\n" + report(run(seconds, suite.database.name)), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.idle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="The window counted, per row.")
    parser.add_argument("--db-name", default="zeroloss_bench", help="Its database is <name>_idle.")
    args = parser.parse_args(argv)
    started = time.monotonic()
    print(report(run(args.seconds, args.db_name)))
    print(f"total {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
