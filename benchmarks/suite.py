"""The workloads of issue 8, each next to its raw-SQL limit. Run by ``python -m benchmarks``."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from . import db, raw
from .db import EVT, MARKER_DIR_ENV, MSG, BenchDatabase
from .report import Figure, Target
from .throughput import ThroughputWorkloads

ROOT = Path(__file__).resolve().parent.parent
PGBENCH_CANDIDATES = ["pgbench", "/usr/lib/postgresql/15/bin/pgbench", "/usr/lib/postgresql/16/bin/pgbench"]
#: Environment overrides of the example project's ZEROLOSS settings: removed, so every process
#: runs with the defaults (ACK_TIMEOUT 5 s, SWEEP_INTERVAL 2 s) and the database transport.
STRIPPED_ENV = (
    "ZEROLOSS_ACK_TIMEOUT",
    "ZEROLOSS_SWEEP_INTERVAL",
    "ZEROLOSS_REDISPATCH_AFTER",
    "CELERY_BROKER_URL",
    "REDIS_URL",
)


@dataclass(frozen=True)
class Sizes:
    insert: int
    bulk: int
    bulk_batch: int
    claim_ack: int
    drain: int
    sweep: int
    retained: int
    latency_per_claimer: int
    pgbench_seconds: int
    sigkill_runs: int

    @classmethod
    def for_profile(cls, quick: bool) -> Sizes:
        if quick:
            return cls(500, 5_000, 500, 1_000, 2_000, 10_000, 100_000, 100, 2, 1)
        return cls(3_000, 50_000, 500, 5_000, 20_000, 100_000, 1_000_000, 500, 5, 3)


def child_env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="benchmarks.settings",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def _log(message: str) -> None:
    print(f"  . {message}", file=sys.stderr, flush=True)


class WorkerProcess:
    """One real ``manage.py zeroloss_worker`` process, output to a file, in its own session."""

    def __init__(
        self,
        url: str,
        queue: str,
        logdir: Path,
        *extra_args: str,
        env: dict[str, str] | None = None,
        tree: Path = ROOT,
        python: str = sys.executable,
    ):
        """``tree`` and ``python``: another checkout of zeroloss and its interpreter (the code
        before a change, measured beside it)."""
        self.log_path = Path(tempfile.mkstemp(prefix="worker-", suffix=".log", dir=logdir)[1])
        self._log = self.log_path.open("w")
        self.popen = subprocess.Popen(
            [python, "manage.py", "zeroloss_worker", "--queue", queue, *extra_args],
            cwd=tree,
            env=env or child_env(url),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while "zeroloss_worker: queues" not in self.log_path.read_text():
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"worker exited ({self.popen.returncode}):\n{self.log_path.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready in {timeout}s:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._log.close()


class Child:
    """A ``benchmarks.child`` process held at the start barrier."""

    def __init__(self, role: str, args: dict[str, Any], url: str):
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.child", role, json.dumps(args)],
            cwd=ROOT,
            env=child_env(url),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ready(self) -> dict[str, Any]:
        """The next JSON line (the ready line, or a round's result for a multi-round child)."""
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"child failed: {self.popen.stderr.read() if self.popen.stderr else ''}")
        return json.loads(line)

    next_line = ready

    def go(self, word: str = "go") -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(f"{word}\n")
        self.popen.stdin.flush()

    def result(self, timeout: float = 600) -> dict[str, Any]:
        out, err = self.popen.communicate(timeout=timeout)
        if self.popen.returncode != 0:
            raise RuntimeError(f"child failed ({self.popen.returncode}): {err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])


class Suite(ThroughputWorkloads):
    def __init__(
        self, database: BenchDatabase, retained: BenchDatabase, sizes: Sizes, runs: int, workdir: Path
    ):
        self.database = database
        self.retained = retained
        self.url = database.url
        self.sizes = sizes
        self.runs = runs
        self.workdir = workdir
        self.conn = database.connect()
        self.figures: dict[str, Figure] = {}
        self.counter = 0

    # -- helpers -----------------------------------------------------------------------

    def figure(self, key: str, label: str, unit: str, **kwargs: Any) -> Figure:
        if key not in self.figures:
            self.figures[key] = Figure(key, label, unit, **kwargs)
        return self.figures[key]

    def prefix(self, name: str) -> str:
        self.counter += 1
        return f"{name}-{self.counter}"

    def service(self, instance_id: str = "bench", using: str = "default") -> Any:
        from zeroloss.ledger.service import ZeroLossMessageService

        return ZeroLossMessageService(instance_id=instance_id, using=using)

    def load_pending(self, queue: str, count: int, conn: psycopg.Connection[Any] | None = None) -> None:
        """Pending messages and fresh statistics, made visible together by one commit."""
        conn = conn or self.conn
        with conn.transaction():
            db.load_messages(conn, queue=queue, prefix=self.prefix(queue), count=count, state="pending")
            db.analyze(conn)

    def drain_window(
        self, queue: str, conn: psycopg.Connection[Any] | None = None
    ) -> tuple[float, dict[str, bool]]:
        """Seconds from the first claim to the last acknowledgement (database clock), and checks."""
        conn = conn or self.conn
        row = conn.execute(
            f"SELECT extract(epoch FROM max(m.completed_at) - min(e.created_at)), count(DISTINCT m.id), "
            f"count(*) FILTER (WHERE m.status = 'completed' AND m.attempts = 1) FROM {MSG} m "
            f"JOIN {EVT} e ON e.message_id = m.id AND e.reason = 'claimed' WHERE m.queue_name = %s",
            [queue],
        ).fetchone()
        acks = conn.execute(
            f"SELECT count(*), count(DISTINCT e.message_id) FROM {EVT} e JOIN {MSG} m ON m.id = e.message_id "
            "WHERE m.queue_name = %s AND e.reason = 'acknowledged'",
            [queue],
        ).fetchone()
        assert row is not None and acks is not None
        total = row[1]
        checks = {"exactly once": row[2] == total and acks[0] == total and acks[1] == total}
        return float(row[0]), checks

    def wait_drained(self, queue: str, count: int, conn: psycopg.Connection[Any] | None = None) -> None:
        conn = conn or self.conn
        deadline = time.monotonic() + 120 + count / 50
        while True:
            row = conn.execute(
                f"SELECT count(*) FROM {MSG} WHERE queue_name = %s AND status = 'completed'", [queue]
            ).fetchone()
            if row and row[0] >= count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{queue}: only {row[0] if row else 0}/{count} completed before the deadline"
                )
            time.sleep(0.05)

    # -- insert: raw limit, pgbench, persist, bulk ----------------------------------------

    def run_insert(self) -> None:
        n = self.sizes.insert
        bare = self.figure("raw.insert_bare", "raw SQL: INSERT message row, 1 commit each", "msg/s")
        audited = self.figure(
            "raw.insert", "raw SQL: INSERT message + audit row (1 statement), 1 commit each", "msg/s"
        )
        persist = self.figure(
            "persist.single",
            "persist_message, 1 per transaction, 1 process",
            "msg/s",
            ratio_to="raw.insert",
            target=Target(">= 3,500 and >= 0.65x raw", "min", 3500, also_ratio_min=0.65),
        )
        service = self.service()
        for run in range(self.runs):
            db.reset(self.conn)
            bare.values.append(
                n
                / raw.insert_loop(
                    self.url, queue="bench.raw", prefix=self.prefix("rb"), count=n, audited=False
                )
            )
            db.reset(self.conn)
            audited.values.append(
                n / raw.insert_loop(self.url, queue="bench.raw", prefix=self.prefix("ra"), count=n)
            )
            db.reset(self.conn)
            prefix = self.prefix("p")
            started = time.perf_counter()
            for i in range(n):
                service.persist_message(f"{prefix}-{i}", "bench.persist", {"n": i})
            persist.values.append(n / (time.perf_counter() - started))
            _log(
                f"insert run {run + 1}: raw bare {bare.values[-1]:,.0f}, raw audited {audited.values[-1]:,.0f}, persist {persist.values[-1]:,.0f} msg/s"
            )
        rows = self.conn.execute(
            f"SELECT count(*) FROM {EVT} e JOIN {MSG} m ON m.id = e.message_id WHERE m.queue_name = 'bench.persist'"
        ).fetchone()
        persist.checks["audit row each"] = bool(rows and rows[0] == n)

    def run_pgbench(self) -> None:
        exe = next((c for c in PGBENCH_CANDIDATES if _which(c)), None)
        fig = self.figure("raw.pgbench", "pgbench: single-row INSERT commits, 1 client", "tps")
        if exe is None:
            fig.info["skipped"] = "pgbench not found"
            return
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_pgbench (id bigserial PRIMARY KEY, v int, t timestamptz DEFAULT now())"
        )
        script = self.workdir / "insert.sql"
        script.write_text("\\set v random(1, 1000000)\nINSERT INTO bench_pgbench (v) VALUES (:v);\n")
        for _ in range(self.runs):
            self.conn.execute("TRUNCATE bench_pgbench")
            out = subprocess.run(
                [
                    exe,
                    "-n",
                    "-c",
                    "1",
                    "-M",
                    "prepared",
                    "-T",
                    str(self.sizes.pgbench_seconds),
                    "-f",
                    str(script),
                    self.url,
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
            if match:
                fig.values.append(float(match.group(1)))
        self.conn.execute("DROP TABLE bench_pgbench")

    def run_bulk(self) -> None:
        n, size = self.sizes.bulk, self.sizes.bulk_batch
        fig = self.figure(
            "persist.bulk",
            f"persist_messages, batches of {size}, 1 process",
            "msg/s",
            target=Target(">= 20,000", "min", 20000),
        )
        service = self.service()
        for _ in range(self.runs):
            db.reset(self.conn)
            prefix = self.prefix("b")
            started = time.perf_counter()
            for start in range(0, n, size):
                service.persist_messages(
                    [(f"{prefix}-{i}", "bench.bulk", {"n": i}) for i in range(start, min(start + size, n))]
                )
            fig.values.append(n / (time.perf_counter() - started))
        rows = self.conn.execute(f"SELECT count(*) FROM {EVT} WHERE reason = 'persisted'").fetchone()
        fig.checks["audit row each"] = bool(rows and rows[0] == n)

    # -- claim + ack in-process, sweep (also used with retained rows) --------------------

    def persist_once(self, alias: str = "default") -> float:
        n = self.sizes.insert
        service = self.service(using=alias)
        prefix = self.prefix("p")
        started = time.perf_counter()
        for i in range(n):
            service.persist_message(f"{prefix}-{i}", "bench.persist", {"n": i})
        return n / (time.perf_counter() - started)

    def claim_ack_once(
        self, conn: psycopg.Connection[Any], alias: str = "default", keep: int = 0
    ) -> tuple[float, bool]:
        n = self.sizes.claim_ack
        db.reset(conn, keep)
        self.load_pending("bench.claimack", n, conn)
        service = self.service(using=alias)
        done = 0
        started = time.perf_counter()
        while leases := service.claim("bench.claimack", limit=10):
            for lease in leases:
                done += service.acknowledge(lease.message_id, lease.token)
        return n / (time.perf_counter() - started), done == n

    def sweep_once(
        self, conn: psycopg.Connection[Any], alias: str = "default", keep: int = 0
    ) -> tuple[float, bool]:
        n = self.sizes.sweep
        db.reset(conn, keep)
        with conn.transaction():
            db.load_messages(conn, queue="bench.sweep", prefix=self.prefix("s"), count=n, state="expired")
            db.analyze(conn)
        service = self.service(using=alias)
        started = time.perf_counter()
        report = service.sweep()
        elapsed = time.perf_counter() - started
        row = conn.execute(
            f"SELECT count(*), count(DISTINCT e.message_id), "
            f"(SELECT count(*) FROM {MSG} WHERE status = 'processing'), "
            f"(SELECT count(*) FROM {MSG} WHERE queue_name = 'bench.sweep' AND status = 'pending' AND attempts = 1) "
            f"FROM {EVT} e WHERE e.reason = 'lease_expired'"
        ).fetchone()
        assert row is not None
        ok = (
            report.total == n
            and len(set(report.requeued)) == n
            and row[0] == n
            and row[1] == n
            and row[2] == 0
            and row[3] == n
        )
        return elapsed, ok

    def run_claim_ack(self) -> None:
        fig = self.figure(
            "claimack.empty",
            "claim_next(10) + acknowledge, in-process, 1 process",
            "msg/s",
            ratio_to="raw.drain1",
        )
        ok = True
        for _ in range(self.runs):
            rate, good = self.claim_ack_once(self.conn)
            fig.values.append(rate)
            ok = ok and good
        fig.checks["exactly once"] = ok

    def run_sweep(self) -> None:
        n = self.sizes.sweep
        fig = self.figure(
            "sweep.empty",
            f"recovery sweep of {n:,} expired leases",
            "s",
            higher_is_better=False,
            target=Target("<= 10 s, exactly once", "max", 10.0),
        )
        ok = True
        for _ in range(self.runs):
            elapsed, good = self.sweep_once(self.conn)
            fig.values.append(elapsed)
            ok = ok and good
        fig.checks["exactly once"] = ok
        fig.info["messages_per_second"] = n / statistics.median(fig.values)

    def run_retained(self) -> None:
        """Persist, claim + ack and sweep with retained completed rows, against an empty ledger.

        Two databases on the same server, one empty and one holding the retained rows, measured
        in alternating runs, so machine noise hits both sides of each ratio alike.
        """
        r = self.sizes.retained
        tag = f"{r // 1_000_000}M" if r >= 1_000_000 else f"{r // 1000}k"
        within = Target("within 10% of empty", "within", 0.10)
        figs = {
            "persist": self.figure(
                "persist.retained",
                f"persist_message with {tag} completed rows retained",
                "msg/s",
                ratio_label="empty",
                target=within,
            ),
            "claim": self.figure(
                "claimack.retained",
                f"claim_next(10) + acknowledge with {tag} retained",
                "msg/s",
                ratio_label="empty",
                target=within,
            ),
            "drain": self.figure(
                "drain.retained",
                f"zeroloss_worker batched drain, 1 process, with {tag} retained",
                "msg/s",
                ratio_label="empty",
                target=within,
            ),
            "sweep": self.figure(
                "sweep.retained",
                f"recovery sweep of {self.sizes.sweep:,} with {tag} retained",
                "s",
                higher_is_better=False,
                ratio_label="empty",
                target=within,
            ),
        }
        other = self.retained.connect()
        try:
            db.reset(other)
            started = time.perf_counter()
            db.load_messages(other, queue="bench.retained", prefix="retained", count=r, state="completed")
            db.analyze(other, vacuum=True)
            keep = db.max_id(other)
            _log(
                f"loaded {r:,} completed messages with {3 * r:,} audit rows in "
                f"{time.perf_counter() - started:.1f}s (setup, not measured)"
            )
            sides = [(self.conn, "default", 0), (other, "retained", keep)]
            urls = {"default": self.url, "retained": self.retained.url}
            ok = {"claim": True, "sweep": True, "drain": True}
            for run in range(self.runs):
                for n, (conn, alias, kept) in enumerate(sides if run % 2 == 0 else sides[::-1]):
                    empty = kept == 0
                    db.reset(conn, kept)
                    rate = self.persist_once(alias)
                    (figs["persist"].baseline if empty else figs["persist"].values).append(rate)
                    rate, good = self.claim_ack_once(conn, alias, kept)
                    (figs["claim"].baseline if empty else figs["claim"].values).append(rate)
                    ok["claim"] &= good
                    elapsed, good = self.sweep_once(conn, alias, kept)
                    (figs["sweep"].baseline if empty else figs["sweep"].values).append(elapsed)
                    ok["sweep"] &= good
                    rate, good = self.drain_once(conn, urls[alias], kept)
                    (figs["drain"].baseline if empty else figs["drain"].values).append(rate)
                    ok["drain"] &= good
                    del n
                _log(
                    f"retained run {run + 1}: persist {figs['persist'].values[-1]:,.0f} "
                    f"(empty {figs['persist'].baseline[-1]:,.0f}) msg/s, claim+ack {figs['claim'].values[-1]:,.0f} "
                    f"(empty {figs['claim'].baseline[-1]:,.0f}) msg/s, sweep {figs['sweep'].values[-1]:.2f} "
                    f"(empty {figs['sweep'].baseline[-1]:.2f}) s, drain {figs['drain'].values[-1]:,.0f} "
                    f"(empty {figs['drain'].baseline[-1]:,.0f}) msg/s"
                )
            figs["claim"].checks["exactly once"] = ok["claim"]
            figs["sweep"].checks["exactly once"] = ok["sweep"]
            figs["drain"].checks["exactly once"] = ok["drain"]
            row = other.execute(
                f"SELECT count(*) FROM {MSG} WHERE id <= %s AND status = 'completed'", [keep]
            ).fetchone()
            figs["persist"].checks["retained rows intact"] = bool(row and row[0] == r)
            for fig in figs.values():
                fig.info["retained_rows"] = r
                fig.info["empty_values"] = fig.baseline
        finally:
            other.close()
        db.reset(self.conn)

    def drain_once(self, conn: psycopg.Connection[Any], url: str, kept: int) -> tuple[float, bool]:
        """One batched drain of sizes.drain messages by one zeroloss_worker on ``url``'s ledger."""
        worker = WorkerProcess(url, "bench.noop", self.workdir, "--poll-interval", "0.1")
        try:
            worker.wait_ready()
            self.load_pending("bench.noop", self.sizes.drain, conn)
            self.wait_drained("bench.noop", self.sizes.drain, conn)
            window, checks = self.drain_window("bench.noop", conn)
        finally:
            worker.stop()
        db.reset(conn, kept)
        return self.sizes.drain / window, all(checks.values())

    # -- drains: raw limit and zeroloss_worker, 1 and 4 processes ------------------------

    def raw_drain(self, procs: int) -> tuple[float, dict[str, bool]]:
        queue = f"bench.raw{procs}"
        db.reset(self.conn)
        children = [
            Child("raw-drain", {"url": self.url, "queue": queue, "batch": 10}, self.url) for _ in range(procs)
        ]
        for c in children:
            c.ready()
        self.load_pending(queue, self.sizes.drain)
        for c in children:
            c.go()
        for c in children:
            c.result()
        window, checks = self.drain_window(queue)
        return self.sizes.drain / window, checks

    def worker_drain(self, workers: list[WorkerProcess]) -> tuple[float, dict[str, bool]]:
        db.reset(self.conn)
        self.load_pending("bench.noop", self.sizes.drain)
        self.wait_drained("bench.noop", self.sizes.drain)
        window, checks = self.drain_window("bench.noop")
        return self.sizes.drain / window, checks

    def start_workers(self, count: int, *extra: str) -> list[WorkerProcess]:
        workers = [
            WorkerProcess(
                self.url, "bench.noop", self.workdir, "--batch-size", "10", "--poll-interval", "0.1", *extra
            )
            for _ in range(count)
        ]
        for w in workers:
            w.wait_ready()
        return workers

    def run_drain(self) -> None:
        figs = {}
        for procs in (1, 4):
            figs[f"raw{procs}"] = self.figure(
                f"raw.drain{procs}",
                f"raw SQL: claim 10 + ack each, {procs} process{'es' if procs > 1 else ''}",
                "msg/s",
            )
            target = Target(">= 1,100", "min", 1100) if procs == 1 else Target(">= 1,600", "min", 1600)
            figs[f"zl{procs}"] = self.figure(
                f"drain.{procs}",
                f"zeroloss_worker drain, {procs} process{'es' if procs > 1 else ''} (no-op handler)",
                "msg/s",
                ratio_to=f"raw.drain{procs}",
                target=target,
            )
        checks: dict[str, bool] = {"raw1": True, "raw4": True, "zl1": True, "zl4": True}
        for run in range(self.runs):
            for procs in (1, 4):
                rate, ok = self.raw_drain(procs)
                figs[f"raw{procs}"].values.append(rate)
                checks[f"raw{procs}"] &= all(ok.values())
                workers = self.start_workers(procs)
                try:
                    rate, ok = self.worker_drain(workers)
                finally:
                    for w in workers:
                        w.stop()
                figs[f"zl{procs}"].values.append(rate)
                checks[f"zl{procs}"] &= all(ok.values())
                _log(
                    f"drain run {run + 1}, {procs} proc: raw {figs[f'raw{procs}'].values[-1]:,.0f}, worker {figs[f'zl{procs}'].values[-1]:,.0f} msg/s"
                )
        for name, passed in checks.items():
            figs[name].checks["exactly once"] = passed
        db.reset(self.conn)

    # -- claim latency under 8 concurrent claimers ----------------------------------------

    def skip_locked_probe(self) -> dict[str, Any]:
        """Lock the head of a queue in another transaction; a claim must skip it without waiting."""
        from django.db import connection

        db.reset(self.conn)
        self.load_pending("bench.probe", 3)
        holder = self.database.connect(autocommit=False)
        try:
            head = holder.execute(
                f"SELECT message_id FROM {MSG} WHERE queue_name = 'bench.probe' ORDER BY available_at, id LIMIT 1 FOR UPDATE"
            ).fetchone()
            assert head is not None
            with connection.cursor() as cur:
                cur.execute("SET lock_timeout = '1s'")
            try:
                t0 = time.perf_counter()
                leases = self.service("probe").claim("bench.probe", limit=1)
                elapsed_ms = (time.perf_counter() - t0) * 1000
                error = ""
            except Exception as exc:  # a lock timeout would mean the claim waited on the held row
                leases, elapsed_ms, error = [], float("nan"), repr(exc)
            finally:
                with connection.cursor() as cur:
                    cur.execute("RESET lock_timeout")
        finally:
            holder.rollback()
            holder.close()
        skipped = bool(leases) and leases[0].message_id != head[0]
        return {"skipped_locked_head": skipped, "claim_ms": elapsed_ms, "error": error}

    def run_latency(self) -> None:
        per = self.sizes.latency_per_claimer
        note = Target("reported; claims never wait on a row lock", "checks")
        p50 = self.figure(
            "latency.p50",
            "claim latency p50, 8 concurrent claimer processes",
            "ms",
            higher_is_better=False,
            target=note,
        )
        p99 = self.figure(
            "latency.p99",
            "claim latency p99, 8 concurrent claimer processes",
            "ms",
            higher_is_better=False,
            target=note,
        )
        waits: Counter[str] = Counter()
        blocked_by: Counter[str] = Counter()
        samples = 0
        db.reset(self.conn)
        children = [Child("claimer", {"queue": "bench.latency", "limit": 1}, self.url) for _ in range(8)]
        backends = [c.ready()["backend"] for c in children]
        try:
            for run in range(self.runs):
                db.reset(self.conn)
                self.load_pending("bench.latency", 8 * per)
                monitor = LockMonitor(self.url, backends)
                monitor.start()
                for c in children:
                    c.go()
                results = [c.next_line() for c in children]
                monitor.stop()
                waits.update(monitor.waits)
                blocked_by.update(monitor.blocked_by)
                samples += monitor.samples
                latencies = sorted(x for r in results for x in r["latencies_ms"])
                p50.values.append(_pct(latencies, 0.50))
                p99.values.append(_pct(latencies, 0.99))
                p99.info.setdefault("max_ms", []).append(latencies[-1])
                acked = sum(r["acked"] for r in results)
                once = p50.checks.get("every message claimed once", True) and acked == 8 * per
                p50.checks["every message claimed once"] = once
                _log(f"latency run {run + 1}: p50 {p50.values[-1]:.1f} ms, p99 {p99.values[-1]:.1f} ms")
        finally:
            for c in children:
                c.go("exit")
                c.result()
        row_waits = sum(n for event, n in waits.items() if event.split(":")[1] in ("tuple", "transactionid"))
        # The target is about claims: SKIP LOCKED must never wait on a row another holds.
        # An acknowledge can wait a few ms on a claimer that locked the row's newest version
        # and then rejected it on PostgreSQL's re-check (EvalPlanQual); that is reported.
        claim_waits = sum(
            n
            for event, n in waits.items()
            if event.split(":")[1] in ("tuple", "transactionid") and event.endswith(":claim")
        )
        probe = self.skip_locked_probe()
        for fig in (p50, p99):
            fig.info.update(
                activity_samples=samples,
                lock_wait_samples=dict(waits),
                lock_wait_blockers=dict(blocked_by),
                row_lock_wait_samples=row_waits,
                claim_row_lock_wait_samples=claim_waits,
                skip_locked_probe=probe,
            )
            fig.checks["claims never wait on a row lock"] = claim_waits == 0
        p99.checks["SKIP LOCKED probe"] = bool(probe["skipped_locked_head"])
        db.reset(self.conn)

    # -- SIGKILL: seconds until the message runs again --------------------------------------

    def run_sigkill(self) -> None:
        fig = self.figure(
            "sigkill.rerun",
            "SIGKILLed worker: seconds until its message runs again (defaults, 2nd worker up)",
            "s",
            higher_is_better=False,
            target=Target("<= 10 s, no operator action", "max", 10.0),
        )
        markers = Path(tempfile.mkdtemp(prefix="markers-", dir=self.workdir))
        env = child_env(self.url, **{MARKER_DIR_ENV: str(markers)})
        db.reset(self.conn)
        workers = [WorkerProcess(self.url, "bench.kill", self.workdir, env=env) for _ in range(2)]
        for w in workers:
            w.wait_ready()
        service = self.service("sigkill-producer")
        ok = True
        try:
            for run in range(self.sizes.sigkill_runs):
                message_id = f"kill-{run}"
                service.persist_message(message_id, "bench.kill", {"run": run})
                first = _wait_file(markers / f"{message_id}.1", 60)
                victim = next(w for w in workers if w.pid == first["pid"])
                os.kill(victim.pid, signal.SIGKILL)
                killed_at = time.time()
                victim.popen.wait(timeout=10)
                db_killed = self.conn.execute("SELECT statement_timestamp()").fetchone()
                second = _wait_file(markers / f"{message_id}.2", 120)
                fig.values.append(second["t"] - killed_at)
                row = self.conn.execute(
                    f"SELECT extract(epoch FROM min(e.created_at) FILTER (WHERE e.reason = 'lease_expired') - %s), "
                    "count(*) FILTER (WHERE e.reason = 'lease_expired') FROM "
                    f"{EVT} e JOIN {MSG} m ON m.id = e.message_id WHERE m.message_id = %s",
                    [db_killed[0] if db_killed else None, message_id],
                ).fetchone()
                if row is not None:
                    fig.info.setdefault("kill_to_sweep_s", []).append(round(float(row[0] or -1), 2))
                    ok = ok and row[1] == 1
                _log(f"sigkill run {run + 1}: ran again after {fig.values[-1]:.2f}s")
                workers.remove(victim)
                victim.stop()
                replacement = WorkerProcess(self.url, "bench.kill", self.workdir, env=env)
                replacement.wait_ready()
                workers.append(replacement)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = self.conn.execute(
                    f"SELECT count(*) FILTER (WHERE status = 'completed' AND attempts = 2), count(*) FROM {MSG} "
                    "WHERE queue_name = 'bench.kill'"
                ).fetchone()
                if row and row[0] == row[1]:
                    break
                time.sleep(0.1)
            ok = ok and bool(row and row[0] == row[1] == self.sizes.sigkill_runs)
        finally:
            for w in workers:
                w.stop()
        fig.checks["recovered exactly once"] = ok
        db.reset(self.conn)

    # -- the same for a Django task: @task(...).enqueue() in a transaction ----------------------

    def run_tasks_sigkill(self) -> None:
        """A task enqueued with ``.enqueue()`` in a transaction; its worker is SIGKILLed mid-task
        and a new worker started: seconds from the kill until the task runs again."""
        from django.db import transaction

        from .tasks import hang_first_attempt

        fig = self.figure(
            "tasks_sigkill.rerun",
            "SIGKILLed worker: seconds until its @task runs again (defaults, new worker started)",
            "s",
            higher_is_better=False,
            target=Target("<= 10 s, no operator action", "max", 10.0),
        )
        markers = Path(tempfile.mkdtemp(prefix="task-markers-", dir=self.workdir))
        env = child_env(self.url, **{MARKER_DIR_ENV: str(markers)})
        db.reset(self.conn)
        worker = WorkerProcess(self.url, "bench.tasks", self.workdir, env=env)
        worker.wait_ready()
        ids = []
        ok = True
        try:
            for run in range(self.sizes.sigkill_runs):
                with transaction.atomic():
                    result = hang_first_attempt.enqueue(run=run)
                ids.append(result.id)
                first = _wait_file(markers / f"{result.id}.1", 60)
                ok = ok and first["pid"] == worker.pid
                os.kill(worker.pid, signal.SIGKILL)
                killed_at = time.time()
                worker.popen.wait(timeout=10)
                worker.stop()
                worker = WorkerProcess(self.url, "bench.tasks", self.workdir, env=env)
                second = _wait_file(markers / f"{result.id}.2", 120)
                fig.values.append(second["t"] - killed_at)
                _log(f"tasks_sigkill run {run + 1}: ran again after {fig.values[-1]:.2f}s")
                worker.wait_ready()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                results = [hang_first_attempt.get_result(i) for i in ids]
                if all(r.is_finished for r in results):
                    break
                time.sleep(0.1)
            ok = ok and all(r.status == "SUCCESSFUL" and r.attempts == 2 for r in results)
        finally:
            worker.stop()
        fig.checks["SUCCESSFUL on attempt 2"] = ok
        db.reset(self.conn)


class LockMonitor(threading.Thread):
    """Samples pg_stat_activity for the claimers' backends waiting on a heavyweight lock."""

    def __init__(self, url: str, backends: list[int]):
        super().__init__(daemon=True)
        self.url = url
        self.backends = backends
        self.waits: Counter[str] = Counter()
        # "claim waits on acknowledge": which statement each waiting one was blocked by, so a
        # rare wait says where it came from the first time it is seen.
        self.blocked_by: Counter[str] = Counter()
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop_event.is_set():
                rows = conn.execute(
                    "SELECT a.wait_event_type, a.wait_event, a.query, "
                    "ARRAY(SELECT b.query FROM pg_stat_activity b WHERE b.pid = ANY(pg_blocking_pids(a.pid))) "
                    "FROM pg_stat_activity a WHERE a.pid = ANY(%s) AND a.state = 'active' "
                    "AND a.wait_event_type = 'Lock'",
                    [self.backends],
                ).fetchall()
                self.samples += 1
                for kind, event, query, blockers in rows:
                    self.waits[f"{kind}:{event}:{_statement(query)}"] += 1
                    blocking = " + ".join(sorted({_statement(b) for b in blockers})) or "(gone)"
                    self.blocked_by[f"{_statement(query)} waits on {blocking}"] += 1
                time.sleep(0.002)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


def _statement(query: str) -> str:
    """Which transition a waiting statement is, from its text."""
    if "SET status = 'completed'" in query:
        return "acknowledge"
    if "SET status = 'processing'" in query:
        return "claim"
    return query[:40]


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def _which(name: str) -> bool:
    from shutil import which

    return which(name) is not None


def _wait_file(path: Path, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path.name} did not appear in {timeout}s")
        time.sleep(0.01)
    return json.loads(path.read_text())
