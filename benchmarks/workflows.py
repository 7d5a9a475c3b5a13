"""Workflows (issue 47): ``python -m benchmarks --only workflows [--baseline-tree DIR]``.

Every drain starts the way users meet it: the backlog is committed first, then 4
``zeroloss_worker`` processes start (``--batch-size 10 --poll-interval 0.1``, as the suite's
drains) and drain it; windows and latencies are read from the audit rows (database clock).

- **fan-in**: a chord of 10,000 no-op members and 1 callback, against a plain drain of 10,000
  messages measured in the same run (the ratio of the windows, first claim to last
  acknowledgement);
- **release latency**: from the last member's ``acknowledged`` audit row to the callback's
  ``claimed`` one, over chords of 100 members sent one after another to idle workers (and the
  10,000-member chord's, for each run);
- **chain**: 1,000 steps one after another: from each step's ``acknowledged`` to the next
  step's ``claimed``;
- **before workflows**: the same plain drain by the code of ``--baseline-tree`` (a checkout of
  the commit before workflows, with its own ``.venv``) on a database migrated by that code,
  alternating with this code's runs.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from . import db
from .db import EVT, MSG, BenchDatabase
from .report import Figure, Target
from .suite import WorkerProcess, _log, _pct, child_env

QUEUE = "bench.noop"
WORKFLOW_TABLES = ("zeroloss_workflow", "zeroloss_dependency", "zeroloss_fanin")
WORKERS = 4
WORKER_ARGS = ("--batch-size", "10", "--poll-interval", "0.1")

#: Per downstream step of a workflow, seconds to its first claim from its last dependency's
#: acknowledgement, and from its own release (``dependencies_completed``: the last statement
#: before the outcome's commit, so an upper bound of commit to claim); the audit rows' times.
RELEASE_TO_CLAIM = f"""
WITH ack AS (
  SELECT m.message_id, max(e.created_at) AS t FROM {MSG} m
  JOIN {EVT} e ON e.message_id = m.id AND e.reason = 'acknowledged'
  WHERE m.workflow_id = %(wf)s GROUP BY m.message_id),
claim AS (
  SELECT m.id, min(e.created_at) FILTER (WHERE e.reason = 'claimed') AS t,
    min(e.created_at) FILTER (WHERE e.reason = 'dependencies_completed') AS released FROM {MSG} m
  JOIN {EVT} e ON e.message_id = m.id
  WHERE m.workflow_id = %(wf)s GROUP BY m.id)
SELECT d.downstream, extract(epoch FROM claim.t - max(ack.t)), extract(epoch FROM claim.t - claim.released)
FROM zeroloss_dependency d JOIN ack ON ack.message_id = d.upstream JOIN claim ON claim.id = d.downstream
WHERE d.workflow_id = %(wf)s GROUP BY d.downstream, claim.t, claim.released
"""


#: Statements told apart by a piece of their text (sql/workflows.sql, sql/outcomes.sql, ...).
STATEMENTS = [
    ("zeroloss_dependency SET settled_status", "SETTLE"),
    ("UPDATE zeroloss_fanin", "FANIN_DECREMENT"),
    ("SET waiting_on = zeroloss_message.waiting_on", "STEP_DECREMENT"),
    ("status = 'waiting' AND waiting_on = 0", "STEP_RELEASE"),
    ("workflow_id <> ''", "STEPS_AMONG"),
    ("SET status = 'completed'", "acknowledge"),
    ("SET status = 'processing'", "claim"),
    ("INSERT INTO zeroloss_messageevent", "audit rows"),
]


def statement(query: str) -> str:
    for needle, name in STATEMENTS:
        if needle in query:
            return name
    return " ".join(query.split())[:50]


class ActivitySampler(threading.Thread):
    """Samples what the database's other sessions are doing every few milliseconds: by statement
    and wait (``CPU`` when running, ``client`` when idle in a transaction, between statements)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._halt.wait(0.005):
                rows = conn.execute(
                    "SELECT state, wait_event_type, wait_event, query FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND state IN ('active', 'idle in transaction')"
                ).fetchall()
                self.samples += 1
                for state, kind, event, query in rows:
                    where = "client" if state != "active" else (f"{kind}:{event}" if kind else "CPU")
                    self.counts[f"{statement(query)} [{where}]"] += 1

    def stop(self) -> dict[str, Any]:
        self._halt.set()
        self.join(timeout=10)
        top = self.counts.most_common(12)
        return {"samples": self.samples, "top": [(k, round(n / max(self.samples, 1), 2)) for k, n in top]}


def reset(conn: psycopg.Connection[Any], *, workflows: bool = True) -> None:
    """An empty ledger: no message and, on this code, no workflow."""
    if workflows:
        conn.execute(f"TRUNCATE {', '.join(WORKFLOW_TABLES)}")
    db.reset(conn)


class WorkflowBench:
    def __init__(self, suite: Any, *, quick: bool, baseline_tree: Path | None) -> None:
        self.suite = suite
        self.members = 1_000 if quick else 10_000
        self.chain_steps = 100 if quick else 1_000
        self.chords = 20 if quick else 100
        self.chord_members = 100
        self.baseline_tree = baseline_tree
        self.base_db: BenchDatabase | None = None
        self.base_conn: psycopg.Connection[Any] | None = None
        self.n = 0

    # -- set-up ---------------------------------------------------------------------------

    def _baseline(self) -> None:
        """A database migrated by the baseline's own code, for its workers."""
        assert self.baseline_tree is not None
        python = self.baseline_tree / ".venv" / "bin" / "python"
        if not python.exists():
            raise RuntimeError(
                f"--baseline-tree {self.baseline_tree}: no .venv/bin/python (make .venv there)"
            )
        self.base_db = BenchDatabase(self.suite.database.server, f"{self.suite.database.name}_before")
        self.base_db.create()
        subprocess.run(
            [str(python), "manage.py", "migrate", "--verbosity", "0"],
            cwd=self.baseline_tree,
            env=self._base_env(),
            check=True,
            capture_output=True,
        )
        self.base_conn = self.base_db.connect()

    def _base_env(self) -> dict[str, str]:
        assert self.base_db is not None and self.baseline_tree is not None
        env = child_env(self.base_db.url, PYTHONPATH=str(self.baseline_tree))
        env.pop("ZEROLOSS_BENCH_RETAINED_URL", None)
        return env

    def _workers(self, base: bool = False) -> list[WorkerProcess]:
        suite = self.suite
        if base:
            assert self.base_db is not None and self.baseline_tree is not None
            extra: dict[str, Any] = {
                "env": self._base_env(),
                "tree": self.baseline_tree,
                "python": str(self.baseline_tree / ".venv" / "bin" / "python"),
            }
        else:
            extra = {}
        url = self.base_db.url if base and self.base_db else suite.url
        workers = [WorkerProcess(url, QUEUE, suite.workdir, *WORKER_ARGS, **extra) for _ in range(WORKERS)]
        for w in workers:
            w.wait_ready()
        return workers

    def _send(self, flow: Any) -> None:
        from django.db import transaction

        with transaction.atomic():
            flow.send()

    def _wf(self, name: str) -> str:
        self.n += 1
        return f"bench-{name}-{self.n}"

    # -- drains ---------------------------------------------------------------------------

    def plain(self, base: bool = False, sampler: ActivitySampler | None = None) -> tuple[float, bool]:
        """Seconds to drain ``members`` plain messages (backlog first), and the exactly-once check."""
        conn = self.base_conn if base else self.suite.conn
        assert conn is not None
        reset(conn, workflows=not base)
        self.suite.load_pending(QUEUE, self.members, conn)
        workers = self._workers(base)
        if sampler is not None:
            sampler.start()
        try:
            self.suite.wait_drained(QUEUE, self.members, conn)
        finally:
            if sampler is not None:
                sampler.stop()
            for w in workers:
                w.stop()
        window, checks = self.suite.drain_window(QUEUE, conn)
        return window, all(checks.values())

    def fan_in(self, sampler: ActivitySampler | None = None) -> tuple[float, float, bool]:
        """A chord of ``members`` + 1 callback, sent, then drained: (window s, last member's
        acknowledgement to the callback's claim s, exactly once)."""
        import zeroloss

        conn = self.suite.conn
        reset(conn)
        wf = self._wf("fanin")
        self._send(
            zeroloss.chord([(QUEUE, {"n": i}) for i in range(self.members)], (QUEUE, {}), workflow_id=wf)
        )
        db.analyze(conn)
        workers = self._workers()
        if sampler is not None:
            sampler.start()
        try:
            self.suite.wait_drained(QUEUE, self.members + 1, conn)
        finally:
            if sampler is not None:
                sampler.stop()
            for w in workers:
                w.stop()
        window, checks = self.suite.drain_window(QUEUE, conn)
        latency = _latencies(conn, wf)
        assert len(latency) == 1, latency
        return window, latency[0][0], all(checks.values())

    def _wait_done(self, wf: str, steps: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            row = self.suite.conn.execute(
                f"SELECT count(*) FROM {MSG} WHERE workflow_id = %s AND status = 'completed'", [wf]
            ).fetchone()
            if row and row[0] >= steps:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"workflow {wf}: {row[0] if row else 0}/{steps} completed in {timeout}s")
            time.sleep(0.01)

    def chords_in_turn(self, workers_running: bool) -> list[tuple[float, float]]:
        """Chords of ``chord_members`` sent one after another (each once the one before it
        completed): the release-to-claim latency of each callback, seconds."""
        import zeroloss

        assert workers_running
        out = []
        for _ in range(self.chords):
            wf = self._wf("chord")
            self._send(
                zeroloss.chord(
                    [(QUEUE, {"n": i}) for i in range(self.chord_members)], (QUEUE, {}), workflow_id=wf
                )
            )
            self._wait_done(wf, self.chord_members + 1, 120)
            out += _latencies(self.suite.conn, wf)
        return out

    def chain(self) -> list[tuple[float, float]]:
        """A chain of ``chain_steps``: per link, the step's acknowledgement to the next's claim, s."""
        import zeroloss

        wf = self._wf("chain")
        self._send(zeroloss.chain(*[(QUEUE, {"n": i}) for i in range(self.chain_steps)], workflow_id=wf))
        self._wait_done(wf, self.chain_steps, 120 + self.chain_steps * 0.5)
        return _latencies(self.suite.conn, wf)

    # -- the run --------------------------------------------------------------------------

    def run(self) -> None:
        suite = self.suite
        n = f"{self.members:,}"
        base_fig: Figure | None = None
        if self.baseline_tree is not None:
            self._baseline()
            base_fig = suite.figure(
                "workflows.plain_before",
                f"plain drain {n}, {WORKERS} procs, code before workflows ({_revision(self.baseline_tree)})",
                "msg/s",
            )
        plain_fig = suite.figure(
            "workflows.plain",
            f"plain drain {n}, {WORKERS} procs, no workflow in the ledger",
            "msg/s",
            ratio_to="workflows.plain_before" if base_fig else None,
            ratio_label="before",
            target=Target("within 3% of before", "within", 0.03) if base_fig else None,
        )
        fan_fig = suite.figure(
            "workflows.fanin",
            f"fan-in {n} -> 1 (chord), {WORKERS} procs: drain window",
            "s",
            higher_is_better=False,
            ratio_label="plain",
            target=Target("<= 1.25x plain", "ratio_max", 1.25),
        )
        big_fig = suite.figure(
            "workflows.fanin_release",
            f"fan-in {n} -> 1: last member's ack to callback's claim",
            "ms",
            higher_is_better=False,
            target=Target("<= 50 (p99)", "max", 50),
        )
        p50_fig = suite.figure(
            "workflows.chord_p50",
            f"chord {self.chord_members} -> 1, one at a time: last ack to callback's claim, p50",
            "ms",
            higher_is_better=False,
            target=Target("<= 10", "max", 10),
        )
        p99_fig = suite.figure(
            "workflows.chord_p99",
            "... the same, p99",
            "ms",
            higher_is_better=False,
            target=Target("<= 50", "max", 50),
        )
        link_fig = suite.figure(
            "workflows.chain_p50",
            f"chain of {self.chain_steps:,}: a step's ack to the next's claim, p50",
            "ms",
            higher_is_better=False,
            target=Target("<= 5", "max", 5),
        )
        # The same from each step's release (its dependencies_completed row, the release's own
        # statement, last before the outcome's commit): at most commit to claim.
        rel_p50 = suite.figure(
            "workflows.chord_released_p50",
            "chord: the callback's release to its claim, p50",
            "ms",
            higher_is_better=False,
        )
        rel_p99 = suite.figure(
            "workflows.chord_released_p99",
            "chord: the callback's release to its claim, p99",
            "ms",
            higher_is_better=False,
        )
        link_rel = suite.figure(
            "workflows.chain_released_p50",
            "chain: a step's release to its claim, p50",
            "ms",
            higher_is_better=False,
        )
        plain_ok = fan_ok = base_ok = True
        plain_s: list[float] = []
        for run in range(suite.runs):
            if base_fig is not None:
                window, ok = self.plain(base=True)
                base_fig.values.append(self.members / window)
                base_ok &= ok
            window, ok = self.plain()
            plain_s.append(window)
            plain_fig.values.append(self.members / window)
            plain_ok &= ok
            window, release, ok = self.fan_in()
            fan_fig.values.append(window)
            fan_fig.baseline.append(plain_s[-1])
            big_fig.values.append(release * 1000)
            fan_ok &= ok
            _log(
                f"workflows run {run + 1}: plain {plain_fig.values[-1]:,.0f} msg/s"
                + (f" (before {base_fig.values[-1]:,.0f})" if base_fig else "")
                + f", fan-in {window:.2f}s vs plain {plain_s[-1]:.2f}s, release {release * 1000:.1f} ms"
            )
        plain_fig.checks["exactly once"] = plain_ok
        fan_fig.checks["exactly once"] = fan_ok
        if base_fig is not None:
            base_fig.checks["exactly once"] = base_ok
        reset(suite.conn)
        workers = self._workers()
        try:
            chord_pairs = self.chords_in_turn(True)
            link_pairs = self.chain()
        finally:
            for w in workers:
                w.stop()
        chords = sorted(a * 1000 for a, _ in chord_pairs)
        links = sorted(a * 1000 for a, _ in link_pairs)
        chords_released = sorted(r * 1000 for _, r in chord_pairs)
        links_released = sorted(r * 1000 for _, r in link_pairs)
        rel_p50.values.append(_pct(chords_released, 0.5))
        rel_p99.values.append(_pct(chords_released, 0.99))
        link_rel.values.append(_pct(links_released, 0.5))
        link_rel.info = {"p99_ms": _pct(links_released, 0.99)}
        p50_fig.values.append(_pct(chords, 0.5))
        p99_fig.values.append(_pct(chords, 0.99))
        p50_fig.info = {"samples": len(chords), "max_ms": chords[-1] if chords else None}
        link_fig.values.append(_pct(links, 0.5))
        link_fig.info = {
            "samples": len(links),
            "p99_ms": _pct(links, 0.99),
            "mean_ms": statistics.fmean(links),
        }
        _log(
            f"workflows: chord release p50 {p50_fig.values[-1]:.1f} ms p99 {p99_fig.values[-1]:.1f} ms "
            f"({len(chords)} chords); chain link p50 {link_fig.values[-1]:.1f} ms p99 "
            f"{link_fig.info['p99_ms']:.1f} ms ({len(links)} links)"
        )
        # Where the time goes: one more drain of each, sampled (not in the figures above).
        for key in ("plain", "fan-in"):
            sampler = ActivitySampler(suite.url)
            if key == "plain":
                self.plain(sampler=sampler)
            else:
                self.fan_in(sampler=sampler)
            fan_fig.info[f"activity_{key}"] = profile = sampler.stop()
            _log(f"workflows: {key} drain, sessions' share of {profile['samples']} samples: {profile['top']}")
        reset(suite.conn)

    def close(self) -> None:
        if self.base_conn is not None:
            self.base_conn.close()
        if self.base_db is not None:
            self.base_db.drop()


def _latencies(conn: psycopg.Connection[Any], wf: str) -> list[tuple[float, float]]:
    return [(float(r[1]), float(r[2])) for r in conn.execute(RELEASE_TO_CLAIM, {"wf": wf}).fetchall()]


def _revision(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or str(tree)


def run_in_suite(suite: Any, *, quick: bool = False, baseline_tree: Path | None = None) -> None:
    bench = WorkflowBench(suite, quick=quick, baseline_tree=baseline_tree)
    try:
        bench.run()
    finally:
        bench.close()


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks --only workflows [--baseline-tree DIR]")
