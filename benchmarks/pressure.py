"""Pressure cells (issue 24): a fixed offered load while the database is put under pressure.

Modelled on a public cross-queue benchmark's cells. Each cell offers 800 msg/s of 1 ms
messages (``bench.pressure``) to one real ``zeroloss_worker`` (default ZEROLOSS settings, its
own process) through three phases, clean -> pressure -> recovery:

- ``idle_in_tx``: one session runs ``BEGIN; SELECT txid_current()`` and sits: the xmin
  horizon is held, so no dead row version of the hot tables can be removed;
- ``readers``: four overlapping REPEATABLE READ readers of the hot tables (each keeps its
  snapshot for ``reader_hold`` seconds, reading every few seconds; a new one starts before the
  oldest ends, so a snapshot is always open);
- ``overload``: 1.5x the offered load (1,200 msg/s) for the pressure phase;
- ``burst``: the steady 800 msg/s plus ``burst_seconds`` worth of messages sent at once at the
  start of the pressure phase.

The producer is paced by the clock (open loop: it sends what the schedule says is due,
whether or not the worker keeps up). Per phase, from the ledger's own timestamps: completion
(messages completed within the phase against those offered in it), pickup latency (created
-> started) p50/p99 of the messages created in it, the backlog at its end, and the dead tuples
of the hot tables (pg_stat_user_tables). During every cell, ``EXPLAIN (ANALYZE, BUFFERS)`` of
the claim, the sweep, a renewal and an acknowledgement, each in a transaction rolled back,
samples what those statements pay over time.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from . import db
from .db import EVT, MSG
from .report import Figure, Target

QUEUE = "bench.pressure"
CELLS = ("idle_in_tx", "readers", "overload", "burst")
PHASES = ("clean", "pressure", "recovery")
OFFERED = 800.0
OVERLOAD = 1.5
#: The worker's threads: at 800 msg/s of 1 ms handlers one thread would spend 80% of its time in
#: the handler, measuring the handler; four leave the ledger as what is measured.
WORKER_ARGS = ("--concurrency", "4")


@dataclass(frozen=True)
class Profile:
    clean: float
    pressure: float  # the idle_in_tx and readers cells
    overload: float  # the overload cell's pressure phase
    burst: float  # the burst cell's pressure phase
    recovery: float
    burst_seconds: float  # the burst: this many seconds of the offered load, sent at once
    reader_hold: float
    reader_every: float
    explain_every: float

    @classmethod
    def for_profile(cls, quick: bool) -> Profile:
        if quick:
            return cls(3, 6, 6, 3, 5, 3, 4, 1, 2)
        return cls(60, 600, 180, 60, 120, 30, 40, 5, 20)

    def phases(self, cell: str) -> list[tuple[str, float]]:
        pressure = {"overload": self.overload, "burst": self.burst}.get(cell, self.pressure)
        return [("clean", self.clean), ("pressure", pressure), ("recovery", self.recovery)]


@dataclass
class PhaseResult:
    cell: str
    phase: str
    seconds: float
    offered: int
    sent: int
    completed: int
    p50_ms: float
    p99_ms: float
    unstarted: int
    backlog_end: int
    dead_msg: int
    dead_evt: int
    drained_after_s: float | None = None

    @property
    def completion(self) -> float:
        return 100.0 * self.completed / self.offered if self.offered else float("nan")


@dataclass
class Explained:
    cell: str
    phase: str
    at_s: float  # seconds since the phase started
    statement: str
    sample: int  # which sampling round (the four statements of one round share it)
    ms: float
    buffers: int  # shared blocks hit + read, the whole statement
    chose_buffers: int  # of those, the locking subquery's (the index ranges walked)
    rows: int


@dataclass
class CellRun:
    phases: list[PhaseResult] = field(default_factory=list)
    explains: list[Explained] = field(default_factory=list)
    worker_log_tail: str = ""


# -- the pressure sessions ----------------------------------------------------------------


class XidHolder:
    """``BEGIN; SELECT txid_current();`` and nothing more until released: the xmin is held."""

    def __init__(self, url: str):
        self.conn = psycopg.connect(url, autocommit=False)
        row = self.conn.execute("SELECT txid_current()").fetchone()
        self.xid = int(row[0]) if row else 0

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


class Readers:
    """Four overlapping REPEATABLE READ readers of the hot tables."""

    def __init__(self, url: str, hold: float, every: float, count: int = 4):
        self.url, self.hold, self.every, self.count = url, hold, every, count
        self._halt = threading.Event()
        self.reads = 0
        self.errors: list[str] = []
        self._threads = [
            threading.Thread(target=self._run, args=(i * hold / count,), daemon=True) for i in range(count)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _run(self, offset: float) -> None:
        if self._halt.wait(offset):
            return
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self._halt.is_set():
                    ends = time.monotonic() + self.hold
                    with conn.transaction():
                        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        while not self._halt.is_set():
                            conn.execute(f"SELECT status, count(*) FROM {MSG} GROUP BY status").fetchall()
                            conn.execute(
                                f"SELECT reason, count(*) FROM {EVT} WHERE created_at > now() - interval '1 minute' "
                                "GROUP BY reason"
                            ).fetchall()
                            self.reads += 1
                            left = ends - time.monotonic()
                            if left <= 0 or self._halt.wait(min(self.every, left)):
                                break
        except Exception as exc:  # reported, never hidden: a reader that died is no pressure
            self.errors.append(repr(exc))

    def stop(self) -> None:
        self._halt.set()
        for t in self._threads:
            t.join(timeout=30)


# -- EXPLAIN sampler ----------------------------------------------------------------------


class ExplainSampler(threading.Thread):
    """Every ``every`` seconds, EXPLAIN (ANALYZE, BUFFERS) of the statements the claim path runs,
    each in its own transaction rolled back, with the same parameters the ledger passes."""

    def __init__(self, url: str, every: float, cell: str, clock: Any):
        super().__init__(daemon=True)
        from zeroloss.conf import get_settings
        from zeroloss.ledger.postgres import PostgresEngine

        self.url, self.every, self.cell, self.clock = url, every, cell, clock
        self.engine = PostgresEngine()
        self.sql = self.engine.sql
        self.ack_timeout = get_settings().ACK_TIMEOUT
        self.samples: list[Explained] = []
        self.rounds = 0
        self.errors: list[str] = []
        self._halt = threading.Event()

    def _explain(
        self, conn: psycopg.Connection[Any], name: str, sql: str, params: list[Any] | dict[str, Any]
    ) -> None:
        phase, at = self.clock()
        try:
            with conn.transaction(force_rollback=True):
                row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params).fetchone()
        except psycopg.Error as exc:
            self.errors.append(f"{name}: {exc!r}")
            return
        assert row is not None
        plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]
        top = plan["Plan"]
        # A claim's or the sweep's locking subquery: what it walked to choose its rows.
        chose = [p for p in top.get("Plans", []) if p.get("Parent Relationship") == "InitPlan"]
        self.samples.append(
            Explained(
                self.cell,
                phase,
                round(at, 1),
                name,
                self.rounds,
                float(plan["Execution Time"]),
                int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)),
                sum(int(p.get("Shared Hit Blocks", 0)) + int(p.get("Shared Read Blocks", 0)) for p in chose),
                int(top.get("Actual Rows", 0)),
            )
        )

    def sample(self, conn: psycopg.Connection[Any]) -> None:
        held = conn.execute(
            f"SELECT message_id, lease_token, created_at FROM {MSG} WHERE status = 'processing' "
            "AND lease_expires_at > statement_timestamp() LIMIT 10"
        ).fetchall()
        mids, toks = [r[0] for r in held], [r[1] for r in held]
        self.rounds += 1
        # The variants from the head only every third round: under a held xmin each is the
        # heaviest statement of the cell, and the worker makes one a minute itself.
        heads = self.rounds % 3 == 1
        for name, params in claim_params(conn, self.sql["CLAIM"], self.ack_timeout, 100).items():
            if heads or not name.endswith("head"):
                self._explain(conn, name, self.sql["CLAIM"], params)
        for name, params in sweep_params(conn, self.sql["SWEEP"], 1000).items():
            if heads or not name.endswith("head"):
                self._explain(conn, name, self.sql["SWEEP"], params)
        # RENEW and ACK are written whole: named parameters (ACK's audit detail among them). The
        # leases' creation times bound both to their partitions, as the worker's do.
        bounded = self.engine.period([r[2] for r in held])
        self._explain(
            conn, "RENEW", self.sql["RENEW"], {"ttl": self.ack_timeout, "mid": mids, "tok": toks, **bounded}
        )
        acked = {"mid": mids, "tok": toks, "res": ["null"] * len(mids), "detail": ""}
        self._explain(conn, "ACK", self.sql["ACK"], {**acked, **bounded})

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self._halt.wait(self.every):
                    self.sample(conn)
        except Exception as exc:
            self.errors.append(repr(exc))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=60)


def claim_params(
    conn: psycopg.Connection[Any], sql: str, ack_timeout: float, limit: int
) -> dict[str, list[Any] | dict[str, Any]]:
    """CLAIM's parameters as :meth:`zeroloss.ledger.leases.Leases.claim` passes them: the
    claim after a previous one (a worker's usual claim: its last message claimed a moment ago) and
    the claim from the head. Before issue 24 there was only the claim from the head."""
    start = [ack_timeout, "bench-explain"]
    if sql.count("%s") == 4:
        return {"CLAIM": [*start, QUEUE, limit]}
    from zeroloss.ledger import leases

    row = conn.execute("SELECT statement_timestamp()").fetchone()
    assert row is not None
    since = row[0] - leases.CLAIM_REWIND
    if "%(queue)s" in sql:  # written whole (sql/claims.sql): named parameters
        named = {"ack_timeout": ack_timeout, "claimed_by": "bench-explain", "queue": QUEUE, "limit": limit}
        return {
            "CLAIM": {**named, "priority": 0, "since": since, "detail": ""},
            "CLAIM head": {**named, "priority": leases._FROM_HEAD, "since": None, "detail": ""},
        }
    head = [QUEUE, leases._FROM_HEAD]
    after = [QUEUE, 0]
    return {
        "CLAIM": [*start, *after, limit, *after, since, limit, *after, limit, limit],
        "CLAIM head": [*start, *head, limit, *head, None, limit, *head, limit, limit],
    }


def sweep_params(
    conn: psycopg.Connection[Any], sql: str, batch: int
) -> dict[str, list[Any] | dict[str, Any]]:
    """SWEEP's parameters as the worker's sweep passes them: the sweep of what expired since its
    previous complete sweep (2 s ago), and the sweep from the head (before issue 24: only that)."""
    if sql.count("%s") == 1:  # before issue 24
        return {"SWEEP": [batch]}
    from zeroloss.ledger import sweep

    row = conn.execute("SELECT statement_timestamp()").fetchone()
    assert row is not None
    since = row[0] - dt.timedelta(seconds=2) - sweep.SWEEP_REWIND
    if "%(since)s" in sql:  # written whole (sql/claims.sql): named parameters
        return {
            "SWEEP": {"since": since, "limit": batch},
            "SWEEP head": {"since": sweep._LONG_AGO, "limit": batch},
        }
    return {"SWEEP": [since, batch, since], "SWEEP head": [sweep._LONG_AGO, batch, sweep._LONG_AGO]}


# -- one cell --------------------------------------------------------------------------


def _db_now(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


def _dead_tuples(conn: psycopg.Connection[Any]) -> dict[str, int]:
    # A partitioned table's dead tuples are its partitions'.
    rows = conn.execute(
        "SELECT p.relname, SUM(s.n_dead_tup) FROM pg_stat_user_tables s "
        "LEFT JOIN pg_inherits i ON i.inhrelid = s.relid "
        "JOIN pg_class p ON p.oid = COALESCE(i.inhparent, s.relid) WHERE p.relname IN (%s, %s) GROUP BY p.relname",
        [MSG, EVT],
    ).fetchall()
    return {name: int(n) for name, n in rows}


def _backlog(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        f"SELECT count(*) FROM {MSG} WHERE queue_name = %s AND status IN ('pending', 'processing')", [QUEUE]
    ).fetchone()
    return int(row[0]) if row else 0


def schedule_for(cell: str, profile: Profile) -> dict[str, Any]:
    """The producer's schedule: (seconds, rate) segments, and bursts (offset, count)."""
    segments, bursts, offset = [], [], 0.0
    for phase, seconds in profile.phases(cell):
        rate = OFFERED * OVERLOAD if (cell == "overload" and phase == "pressure") else OFFERED
        segments.append([seconds, rate])
        if cell == "burst" and phase == "pressure":
            bursts.append([offset, int(OFFERED * profile.burst_seconds)])
        offset += seconds
    return {"queue": QUEUE, "prefix": cell, "segments": segments, "bursts": bursts}


def offered_in(cell: str, profile: Profile) -> list[int]:
    sched = schedule_for(cell, profile)
    counts, offset = [], 0.0
    for seconds, rate in sched["segments"]:
        extra = sum(n for at, n in sched["bursts"] if offset <= at < offset + seconds)
        counts.append(int(seconds * rate) + extra)
        offset += seconds
    return counts


def run_cell(suite: Any, cell: str, profile: Profile) -> CellRun:
    from .suite import Child, WorkerProcess, _log

    conn = suite.conn
    db.reset(conn)
    conn.execute(f"VACUUM (ANALYZE) {MSG}, {EVT}")
    worker = WorkerProcess(suite.url, QUEUE, suite.workdir, *WORKER_ARGS)
    producer = Child("paced-producer", schedule_for(cell, profile), suite.url)
    result = CellRun()
    boundaries: list[Any] = []
    phase_state: list[Any] = ["clean", time.monotonic()]  # the phase running, since when

    def clock() -> tuple[str, float]:
        return str(phase_state[0]), time.monotonic() - float(phase_state[1])

    sampler = ExplainSampler(suite.url, profile.explain_every, cell, clock)
    holder: XidHolder | None = None
    readers: Readers | None = None
    dead: list[dict[str, int]] = []
    backlogs: list[int] = []
    try:
        worker.wait_ready()
        producer.ready()
        producer.go()
        sampler.start()
        for phase, seconds in profile.phases(cell):
            phase_state[:] = [phase, time.monotonic()]
            boundaries.append(_db_now(conn))
            ends = time.monotonic() + seconds
            if phase == "pressure" and cell == "idle_in_tx":
                holder = XidHolder(suite.url)
                _log(f"{cell}: xid {holder.xid} held, idle in transaction")
            if phase == "pressure" and cell == "readers":
                readers = Readers(suite.url, profile.reader_hold, profile.reader_every)
                readers.start()
            while (left := ends - time.monotonic()) > 0:
                time.sleep(min(left, 10))
                if worker.popen.poll() is not None:
                    raise RuntimeError(f"worker exited: {worker.log_path.read_text()[-3000:]}")
            if holder is not None:
                holder.release()
                holder = None
            if readers is not None:
                readers.stop()
                if readers.errors:
                    raise RuntimeError(f"a reader failed: {readers.errors[:3]}")
                _log(f"{cell}: {readers.reads} reads by the readers")
                readers = None
            dead.append(_dead_tuples(conn))
            backlogs.append(_backlog(conn))
            _log(f"{cell}/{phase}: backlog {backlogs[-1]}, dead tuples {dead[-1]}")
        boundaries.append(_db_now(conn))
        produced = producer.result()
    finally:
        if holder is not None:
            holder.release()
        if readers is not None:
            readers.stop()
        sampler.stop()
        if producer.popen.poll() is None:
            producer.popen.kill()
            producer.popen.wait(timeout=10)
        worker.stop()
        result.worker_log_tail = worker.log_path.read_text()[-2000:]
    if sampler.errors:
        _log(f"{cell}: EXPLAIN sampler errors: {sampler.errors[:3]}")
    result.explains = sampler.samples
    offered = offered_in(cell, profile)
    for i, (phase, seconds) in enumerate(profile.phases(cell)):
        start, end = boundaries[i], boundaries[i + 1]
        row = conn.execute(
            f"SELECT count(*), "
            "count(*) FILTER (WHERE started_at IS NULL OR started_at >= %(cell_end)s), "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM "
            "coalesce(least(started_at, %(cell_end)s), %(cell_end)s) - created_at)), "
            "percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM "
            "coalesce(least(started_at, %(cell_end)s), %(cell_end)s) - created_at)) "
            f"FROM {MSG} WHERE queue_name = %(q)s AND created_at >= %(start)s AND created_at < %(end)s",
            {"q": QUEUE, "start": start, "end": end, "cell_end": boundaries[-1]},
        ).fetchone()
        done = conn.execute(
            f"SELECT count(*) FROM {MSG} WHERE queue_name = %s AND completed_at >= %s AND completed_at < %s",
            [QUEUE, start, end],
        ).fetchone()
        assert row is not None and done is not None
        result.phases.append(
            PhaseResult(
                cell,
                phase,
                seconds,
                offered[i],
                int(row[0]),
                int(done[0]),
                float(row[2] or 0) * 1000,
                float(row[3] or 0) * 1000,
                int(row[1]),
                backlogs[i],
                dead[i].get(MSG, 0),
                dead[i].get(EVT, 0),
            )
        )
    if cell == "burst":
        result.phases[-1].drained_after_s = _drained_after(conn, boundaries[1], boundaries[-1])
    _log(f"{cell}: producer {produced}")
    return result


def _drained_after(conn: psycopg.Connection[Any], burst_at: Any, cell_end: Any) -> float | None:
    """Seconds from the burst until every message created up to that second had started,
    to within one second of the offered load (the steady state's own in-flight messages)."""
    row = conn.execute(
        "WITH s AS (SELECT generate_series(%(b)s::timestamptz + interval '1 second', %(e)s::timestamptz, "
        "interval '1 second') AS t) "
        "SELECT extract(epoch FROM min(s.t) - %(b)s::timestamptz) FROM s WHERE "
        f"(SELECT count(*) FROM {MSG} m WHERE m.queue_name = %(q)s AND m.created_at <= s.t "
        "AND (m.started_at IS NULL OR m.started_at > s.t)) <= %(steady)s",
        {"b": burst_at, "e": cell_end, "q": QUEUE, "steady": int(OFFERED)},
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else None


# -- the suite entry point --------------------------------------------------------------


def table(runs: dict[str, CellRun]) -> str:
    headers = [
        "cell",
        "phase",
        "s",
        "offered/s",
        "completed",
        "pickup p50 ms",
        "pickup p99 ms",
        "backlog at end",
        "dead tuples msg / evt",
    ]
    rows = []
    for cell, run in runs.items():
        for p in run.phases:
            done = f"{p.completion:.1f}%"
            if p.drained_after_s is not None:
                done += f" (burst drained {p.drained_after_s:.0f} s after it)"
            rows.append(
                [
                    cell,
                    p.phase,
                    f"{p.seconds:.0f}",
                    f"{p.offered / p.seconds:,.0f}",
                    done,
                    f"{p.p50_ms:,.1f}",
                    f"{p.p99_ms:,.1f}",
                    f"{p.backlog_end:,}",
                    f"{p.dead_msg:,} / {p.dead_evt:,}",
                ]
            )
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join(out)


def explain_table(runs: dict[str, CellRun]) -> str:
    """Buffers and time of each sampled statement over the cell, one line per sample time."""
    names = ("CLAIM", "CLAIM head", "SWEEP", "SWEEP head", "RENEW", "ACK")
    lines = ["cell/phase   t(s) | " + " | ".join(f"{s:>14}" for s in names)]
    for cell, run in runs.items():
        by_round: dict[int, dict[str, Explained]] = {}
        for e in run.explains:
            by_round.setdefault(e.sample, {})[e.statement] = e
        for stmts in by_round.values():
            first = next(iter(stmts.values()))
            phase, at = first.phase, first.at_s
            cells = []
            for name in names:
                got = stmts.get(name)
                # The claim's and the sweep's choosing subquery: what they walked to find rows.
                shown = got.chose_buffers or got.buffers if got else 0
                cells.append(f"{shown:>6}b {got.ms:>5.1f}ms" if got else " " * 14)
            lines.append(f"{cell[:4]}/{phase[:5]:<5} {at:>6.0f} | " + " | ".join(cells))
    return "\n".join(lines)


def run_in_suite(suite: Any, quick: bool, cells: list[str] | None = None) -> None:
    from .suite import _log

    profile = Profile.for_profile(quick)
    runs: dict[str, CellRun] = {}
    for cell in cells or CELLS:
        t0 = time.monotonic()
        runs[cell] = run_cell(suite, cell, profile)
        _log(f"pressure cell {cell}: {time.monotonic() - t0:.0f}s")
        for p in runs[cell].phases:
            _log(
                f"{cell}/{p.phase}: {p.completion:.1f}% of {p.offered} offered, pickup p50 {p.p50_ms:.1f} "
                f"p99 {p.p99_ms:.1f} ms, backlog {p.backlog_end}, dead {p.dead_msg}/{p.dead_evt}"
            )
    _figures(suite, runs)
    suite.pressure = runs
    db.reset(suite.conn)


def _figures(suite: Any, runs: dict[str, CellRun]) -> None:
    for cell, run in runs.items():
        pressure = next(p for p in run.phases if p.phase == "pressure")
        what = {
            "idle_in_tx": "held xmin",
            "readers": "4 REPEATABLE READ readers",
            "overload": "1.5x offered",
            "burst": "burst",
        }[cell]
        targeted = cell in ("idle_in_tx", "readers")
        done: Figure = suite.figure(
            f"pressure.{cell}.completion",
            f"pressure {cell}: completed against offered, {pressure.seconds:.0f} s {what}",
            "%",
            target=Target(">= 99%", "min", 99.0) if targeted else None,
        )
        done.values.append(pressure.completion)
        p99: Figure = suite.figure(
            f"pressure.{cell}.p99",
            f"pressure {cell}: pickup p99 (created -> started), {what}",
            "ms",
            higher_is_better=False,
            target=Target("<= 500 ms", "max", 500.0) if targeted else None,
        )
        p99.values.append(pressure.p99_ms)
        p99.info["phases"] = [asdict(p) for p in run.phases]
        p99.info["explain"] = [asdict(e) for e in run.explains]
        if cell == "burst":
            recovery = run.phases[-1]
            # The burst is sent as its phase starts: drained in time by the end of the recovery.
            by = pressure.seconds + recovery.seconds
            drained: Figure = suite.figure(
                "pressure.burst.drained",
                "pressure burst: seconds from the burst until it is drained",
                "s",
                higher_is_better=False,
                target=Target(f"within the recovery phase (<= {by:.0f} s)", "max", by),
            )
            if recovery.drained_after_s is not None:
                drained.values.append(recovery.drained_after_s)
            drained.checks["drained"] = recovery.drained_after_s is not None


def notes(suite: Any) -> None:
    runs = getattr(suite, "pressure", None)
    if not runs:
        return
    print("\npressure cells (offered 800 msg/s, 1 ms handler, one zeroloss_worker --concurrency 4):")
    print(table(runs))
    print("\nEXPLAIN (ANALYZE, BUFFERS) over time: shared buffers (hit + read) and time per statement")
    print(explain_table(runs))
    sys.stdout.flush()
