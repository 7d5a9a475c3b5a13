"""The scenarios and their profiles: the whole fault run, from an empty cluster to the report.

- :func:`run_database`: ``zeroloss_worker`` processes drain a transactional and a plain queue
  while a producer sends and the injector kills, freezes, disconnects and restarts;
- :func:`run_celery`: the same workload over the Celery transport (a private Redis broker, a
  ``zeroloss_sweep --loop`` publishing again what the broker lost), with FLUSHALL and broker
  restarts besides worker kills and a database fault;
- :func:`measure_recovery`: with zeroloss's *default* settings (no ``ACK_TIMEOUT`` override),
  seconds from PostgreSQL accepting connections again after a restart to the first
  acknowledgement.

Each returns a :class:`Result` whose ``findings`` the caller asserts on (no violations);
:func:`report` formats them as the table ``docs/guarantees.md`` shows.

Why ``max_attempts`` is 100: every fault ends at most one attempt of each message in flight
(an expired lease counts the attempt; a release does not), so a message can lose at most one
attempt per fault plus one per lease a slow worker let expire. The soak injects fewer than 40
faults; 100 attempts cannot be spent by the faults, so any dead letter is a finding.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.support.waiting import wait_for, wait_until

from .checker import Checker, Findings
from .cluster import FaultCluster, RedisServer
from .injector import Fault, Injector, schedule
from .workload import QUEUES, Proc, WorkerPool, child_env, producer, sweeper

MAX_ATTEMPTS = 100


@dataclass(frozen=True)
class Profile:
    name: str
    workers: int
    messages: int
    #: Seconds the producer sends (faults are injected meanwhile).
    duration: float
    faults: dict[str, int]
    celery_messages: int
    celery_duration: float
    celery_faults: dict[str, int]
    #: Restarts of each mode (immediate, fast) for the default-settings recovery measurement.
    recovery_restarts: int
    concurrency: int = 2
    ack_timeout: float = 2.0
    sweep_interval: float = 2.0
    sleep_ms_max: float = 30.0
    drain_timeout: float = 120.0
    #: Partitions and dead hosts (tests/faults/partitions.py), with default settings: how long
    #: the link stays down (longer than ACK_TIMEOUT + 15 s, so the takeover target is tested),
    #: and how long a dead host's messages are waited for before the harness ends its sessions.
    partition_s: float = 25.0
    dead_host_wait_s: float = 25.0
    #: Storage faults (tests/faults/storage.py): how long the disk stays full, and the workload
    #: around it (the fault starts a third of the way into the sending).
    storage_full_s: float = 6.0
    storage_messages: int = 180
    storage_duration: float = 12.0
    #: fsync stalls: 5 s each for this long; one long stall of this long.
    storage_stalls_s: float = 6.0
    storage_stall_s: float = 8.0
    #: Sending goes on this long past a fault that ends after ``storage_duration``.
    storage_tail_s: float = 5.0


CI = Profile(
    name="ci",
    workers=3,
    messages=2400,
    duration=60,
    faults={"sigkill": 4, "sigstop": 1, "terminate": 1, "restart-immediate": 1, "restart-fast": 1},
    celery_messages=400,
    celery_duration=25,
    celery_faults={"sigkill": 1, "flushall": 1, "broker-restart": 1, "terminate": 1},
    recovery_restarts=1,
)
SOAK = Profile(
    name="soak",
    workers=4,
    messages=12000,
    duration=330,
    faults={"sigkill": 24, "sigstop": 3, "terminate": 3, "restart-immediate": 3, "restart-fast": 3},
    celery_messages=2000,
    celery_duration=120,
    celery_faults={"sigkill": 4, "flushall": 2, "broker-restart": 2, "terminate": 1, "restart-immediate": 1},
    recovery_restarts=3,
    partition_s=60.0,
    dead_host_wait_s=90.0,
    storage_full_s=20.0,
    storage_messages=1200,
    storage_duration=60.0,
    storage_stalls_s=60.0,
    storage_stall_s=30.0,
    storage_tail_s=15.0,
)
PROFILES = {p.name: p for p in (CI, SOAK)}


@dataclass
class Result:
    scenario: str
    seed: int
    findings: Findings
    faults: list[Fault]
    wall_s: float
    load: dict[str, float]
    run_dir: Path
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    injector_error: str = ""

    @property
    def ok(self) -> bool:
        drained_again = all(r["to_first_ack_s"] is not None for r in self.recoveries)
        return not self.findings.violations and not self.injector_error and drained_again


class LoadSampler(threading.Thread):
    """The 1-minute load average every 5 s while a scenario runs (the machine is shared)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self._stop_sampling = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop_sampling.wait(5):
                return

    def finish(self) -> dict[str, float]:
        self._stop_sampling.set()
        self.join(timeout=6)
        s = self.samples or [os.getloadavg()[0]]
        return {"start": round(s[0], 2), "mean": round(sum(s) / len(s), 2), "max": round(max(s), 2)}


def _count(url: str, sql: str, params: list[Any]) -> int:
    """A count from the run's database; -1 while it does not answer (a restart)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(sql, params).fetchone()
            return int(row[0]) if row else -1
    except psycopg.OperationalError:
        return -1


def _count_unfinished(url: str) -> int:
    return _count(url, "SELECT count(*) FROM zeroloss_message WHERE status IN ('pending', 'processing')", [])


def _acknowledged(url: str) -> int:
    return _count(url, "SELECT count(*) FROM zeroloss_messageevent WHERE reason = 'acknowledged'", [])


def _nothing_in_flight_since_before(url: str, began: float) -> bool:
    """No message still processing on a claim older than ``began``: the leases a fault orphaned
    have been requeued by the sweep (or their worker's outcomes landed)."""
    sql = (
        "SELECT count(*) FROM zeroloss_message WHERE status = 'processing' AND started_at < to_timestamp(%s)"
    )
    return _count(url, sql, [began]) == 0


def _wait_drained(url: str, producer_proc: Proc, timeout: float, log: Callable[[str], None]) -> float:
    """Wait for the producer to finish and every message to be finished; returns seconds waited."""
    started = time.monotonic()
    deadline = started + timeout
    if not wait_until(lambda: not producer_proc.alive, timeout, interval=0.2):
        log("  producer still running at the deadline: stopping it")
        producer_proc.terminate(timeout=30)
    wait_until(lambda: _count_unfinished(url) == 0, max(0.0, deadline - time.monotonic()), interval=0.2)
    return time.monotonic() - started


def _wait_first_send(run_dir: Path, producer_proc: Proc, timeout: float = 90) -> None:
    """Faults start once the producer is sending (its start-up takes seconds on a loaded host)."""
    sends = run_dir / "sends.log"

    def sending() -> bool:
        if sends.exists() and sends.stat().st_size > 0:
            return True
        if not producer_proc.alive:
            raise RuntimeError(f"the producer sent nothing in {timeout}s:\n{producer_proc.log()}")
        return False

    if not wait_until(sending, timeout, interval=0.1):
        raise RuntimeError(f"the producer sent nothing in {timeout}s:\n{producer_proc.log()}")


def _producer_args(
    run_dir: Path, seed: int, count: int, duration: float, sleep_ms_max: float
) -> dict[str, Any]:
    return {
        "seed": seed,
        "prefix": "m",
        "count": count,
        "rate": count / duration,
        "queues": QUEUES,
        "max_attempts": MAX_ATTEMPTS,
        "sleep_ms_max": sleep_ms_max,
        "slow_every": 25,
        "out": str(run_dir / "sends.log"),
        "give_up_after": 120,
    }


def _run_workload(
    *,
    scenario: str,
    kind: str,
    cluster: FaultCluster,
    dbname: str,
    profile: Profile,
    seed: int,
    base_dir: Path,
    messages: int,
    duration: float,
    fault_counts: dict[str, int],
    extra_env: dict[str, str],
    redis: RedisServer | None = None,
    log: Callable[[str], None] = print,
) -> Result:
    started = time.monotonic()
    sampler = LoadSampler()
    sampler.start()
    run_dir = base_dir / scenario
    run_dir.mkdir(parents=True, exist_ok=True)
    url = cluster.create_database(dbname)
    env = child_env(url, run_dir, **extra_env)
    pool = WorkerPool(
        kind, profile.workers if kind == "zeroloss" else 2, env, run_dir, concurrency=profile.concurrency
    )
    sweep_proc: Proc | None = None
    producer_proc: Proc | None = None
    injector: Injector | None = None
    try:
        pool.start()
        if kind == "celery":
            sweep_proc = sweeper(env, run_dir, interval=1.0)
        plan = schedule(fault_counts, (3.0, max(duration - 3.0, 4.0)), seed)
        log(
            f"  {scenario}: {pool.count} {kind} workers x {profile.concurrency}, {messages} messages over "
            f"{duration:.0f}s, {len(plan)} faults planned: {dict(Counter(k for _, k in plan))}"
        )
        producer_proc = producer(
            env, run_dir, _producer_args(run_dir, seed, messages, duration, profile.sleep_ms_max)
        )
        _wait_first_send(run_dir, producer_proc)
        injector = Injector(
            plan,
            seed=seed,
            pool=pool,
            cluster=cluster,
            dbname=dbname,
            ack_timeout=float(extra_env.get("ZEROLOSS_ACK_TIMEOUT", 5.0)),
            sweep_interval=profile.sweep_interval,
            redis=redis,
            log=log,
        )
        injector.start()
        injector.join(timeout=duration + 180)
        injector.halt()
        waited = _wait_drained(url, producer_proc, duration + profile.drain_timeout + 120, log)
        log(f"  {scenario}: producer done and ledger drained {waited:.1f}s after the fault schedule ended")
        pool.shutdown()
        if sweep_proc is not None:
            sweep_proc.terminate()
        findings = Checker(
            seed=seed, database_url=url, run_dir=run_dir, faults=injector.faults, generations=pool.generations
        ).check()
        return Result(
            scenario,
            seed,
            findings,
            injector.faults,
            round(time.monotonic() - started, 1),
            sampler.finish(),
            run_dir,
            injector_error=injector.error,
        )
    finally:
        if injector is not None:
            injector.halt()
        pool.kill_all()
        for proc in (producer_proc, sweep_proc):
            if proc is not None and proc.alive:
                proc.terminate(timeout=10)


def run_database(
    cluster: FaultCluster, profile: Profile, seed: int, base_dir: Path, log: Callable[[str], None] = print
) -> Result:
    return _run_workload(
        scenario="database",
        kind="zeroloss",
        cluster=cluster,
        dbname="zl_faults_db",
        profile=profile,
        seed=seed,
        base_dir=base_dir,
        messages=profile.messages,
        duration=profile.duration,
        fault_counts=profile.faults,
        extra_env={
            "ZEROLOSS_ACK_TIMEOUT": str(profile.ack_timeout),
            "ZEROLOSS_SWEEP_INTERVAL": str(profile.sweep_interval),
        },
        log=log,
    )


def run_celery(
    cluster: FaultCluster, profile: Profile, seed: int, base_dir: Path, log: Callable[[str], None] = print
) -> Result:
    redis = RedisServer()
    redis.start()
    try:
        return _run_workload(
            scenario="celery",
            kind="celery",
            cluster=cluster,
            dbname="zl_faults_celery",
            profile=profile,
            seed=seed,
            base_dir=base_dir,
            messages=profile.celery_messages,
            duration=profile.celery_duration,
            fault_counts=profile.celery_faults,
            extra_env={
                "CELERY_BROKER_URL": redis.url(0),
                "ZEROLOSS_ACK_TIMEOUT": str(profile.ack_timeout),
                "ZEROLOSS_SWEEP_INTERVAL": str(profile.sweep_interval),
                # The broker forgets tasks (FLUSHALL, a restart without persistence): publish
                # again soon, so the run drains in seconds rather than the default 30 s.
                "ZEROLOSS_REDISPATCH_AFTER": "3",
            },
            redis=redis,
            log=log,
        )
    finally:
        redis.stop()


def _first_ack_after(url: str, after: float, timeout: float = 60) -> float | None:
    """Wall-clock time of the first acknowledgement (audit row or handler effect) after ``after``."""

    def first() -> float | None:
        with (
            contextlib.suppress(psycopg.OperationalError),
            psycopg.connect(url, autocommit=True, connect_timeout=5) as conn,
        ):
            row = conn.execute(
                "SELECT least((SELECT min(created_at) FROM zeroloss_messageevent WHERE reason = 'acknowledged' "
                "AND created_at > to_timestamp(%s)), (SELECT min(committed_at) FROM faults_effect "
                "WHERE committed_at > to_timestamp(%s)))",
                [after, after],
            ).fetchone()
            if row and row[0] is not None:
                return float(row[0].timestamp())
        return None

    return wait_until(first, timeout, interval=0.25)


def measure_recovery(
    cluster: FaultCluster, profile: Profile, seed: int, base_dir: Path, log: Callable[[str], None] = print
) -> Result:
    """Restart PostgreSQL (immediate, then fast, ``recovery_restarts`` times each) under a steady
    workload with zeroloss's default settings; time accepting-again to the first acknowledgement."""
    started = time.monotonic()
    sampler = LoadSampler()
    sampler.start()
    run_dir = base_dir / "recovery"
    run_dir.mkdir(parents=True, exist_ok=True)
    dbname = "zl_faults_recovery"
    url = cluster.create_database(dbname)
    env = child_env(url, run_dir)  # default ACK_TIMEOUT (5 s) and SWEEP_INTERVAL (2 s)
    pool = WorkerPool("zeroloss", 2, env, run_dir, concurrency=profile.concurrency)
    rng = random.Random(seed + 2)
    faults: list[Fault] = []
    recoveries: list[dict[str, Any]] = []
    modes = ["immediate", "fast"] * profile.recovery_restarts
    # Long enough for every restart on a loaded host (an immediate restart's crash recovery
    # took up to 8 s here): the producer is stopped (SIGTERM) after the last measurement.
    duration = 60.0 + 30.0 * len(modes)
    producer_proc: Proc | None = None
    try:
        pool.start()
        producer_proc = producer(
            env, run_dir, _producer_args(run_dir, seed, int(20 * duration), duration, 5.0)
        )
        _wait_first_send(run_dir, producer_proc)
        # the fault schedule: traffic flows end to end before the first restart
        wait_for("40 acknowledgements before the first restart", lambda: _acknowledged(url) >= 40, 90)
        for mode in modes:
            restart = cluster.restart(mode, down_for=round(rng.uniform(0, 1.0), 2), dbname=dbname)
            first = _first_ack_after(url, restart.up)
            faults.append(
                Fault(
                    f"restart-{mode}", restart.began, restart.up, detail={"down_s": round(restart.outage, 2)}
                )
            )
            recoveries.append(
                {
                    "mode": mode,
                    "down_s": round(restart.outage, 2),
                    "to_first_ack_s": None if first is None else round(first - restart.up, 2),
                }
            )
            log(
                f"  recovery: restart -m {mode}: down {restart.outage:.2f}s, first acknowledgement "
                f"{'never' if first is None else f'{first - restart.up:.2f}s'} after accepting connections"
            )
            # the fault schedule: each recovery is its own, complete before the next restart
            wait_for(
                f"the leases orphaned by restart -m {mode} recovered",
                functools.partial(_nothing_in_flight_since_before, url, restart.began),
                profile.drain_timeout + 60,
            )
        producer_proc.signal(15)
        _wait_drained(url, producer_proc, profile.drain_timeout + 60, log)
        pool.shutdown()
        findings = Checker(
            seed=seed, database_url=url, run_dir=run_dir, faults=faults, generations=pool.generations
        ).check()
        return Result(
            "recovery",
            seed,
            findings,
            faults,
            round(time.monotonic() - started, 1),
            sampler.finish(),
            run_dir,
            recoveries=recoveries,
        )
    finally:
        pool.kill_all()
        if producer_proc is not None and producer_proc.alive:
            producer_proc.terminate(timeout=10)


# -- the report -----------------------------------------------------------------------------


def _rerun_text(f: Findings) -> str:
    return f"{sum(f.reruns.values())} (tx {f.reruns.get('tx', 0)}, plain {f.reruns.get('plain', 0)})"


def report(results: list[Result], *, profile: Profile, seed: int) -> str:
    lines = [
        f"fault suite, profile {profile.name}, seed {seed}",
        "",
        "| scenario | faults | accepted | refused sends | completed | lost | effects twice | re-runs | "
        "dead | max s fault -> in-flight drained | wall s | load avg (mean/max) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        f = r.findings
        kinds = Counter(x.kind for x in r.faults)
        lines.append(
            f"| {r.scenario} | {sum(kinds.values())}: "
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
            + f" | {f.accepted} | {f.refused_sends} | {f.completed} | {len(f.lost)} | {f.effects_twice_count} | "
            f"{_rerun_text(f)} | {len(f.dead)} | {f.max_fault_to_drained:.1f} | {r.wall_s:.0f} | "
            f"{r.load['mean']:.1f}/{r.load['max']:.1f} |"
        )
    lines.append("")
    for r in results:
        f = r.findings
        lines.append(f"{r.scenario}:")
        lines.append(
            f"  sends: {f.sends} ids, {f.accepted} accepted, {f.refused_sends} refused calls, "
            f"{f.refused_then_accepted} ids refused then accepted on retry (same id), of which "
            f"{f.landed_despite_error} had committed although send() raised; {f.given_up} given up "
            f"({f.given_up_in_ledger} of them in the ledger)"
        )
        lines.append(
            f"  handler runs: {f.runs}; re-runs {_rerun_text(f)}; audit trail: {f.lease_expired_events} "
            f"lease_expired, {f.released_events} released, {f.failed_events} failed; late outcomes refused "
            f"(worker lease_lost counters): {f.late_outcomes_refused}"
        )
        for cause, n in sorted(f.rerun_causes.items(), key=lambda x: -x[1]):
            lines.append(f"    re-run because {cause}: {n}")
        if f.kill_landings:
            lines.append(
                "  SIGKILLs landed: " + ", ".join(f"{k} {n}" for k, n in f.kill_landings.most_common())
            )
        for s in f.stops:
            lines.append(
                f"  SIGSTOP {s['stopped_s']}s: held {s['held']} leases, {s['expired']} expired and "
                f"{s['claimed_again_by_another']} were claimed again by another worker; "
                f"{s['late_outcomes_refused']} late outcomes refused"
            )
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for t in f.fault_timing:
            by_kind.setdefault(t["kind"], []).append(t)
        for kind, timings in sorted(by_kind.items()):
            drained = [t["victims_done_s"] for t in timings if t["victims_done_s"] is not None]
            first = [t["first_ack_after_s"] for t in timings if t["first_ack_after_s"] is not None]
            lines.append(
                f"  {kind} x{len(timings)}: in flight {sum(t['in_flight'] for t in timings)}, "
                f"max s to all of them completed {max(drained, default=0):.1f}, "
                f"max s from the fault's end to the next acknowledgement {max(first, default=0):.2f}"
            )
        for rec in r.recoveries:
            first_ack = "none within 60" if rec["to_first_ack_s"] is None else rec["to_first_ack_s"]
            lines.append(
                f"  restart -m {rec['mode']} (default settings): down {rec['down_s']}s, first acknowledgement "
                f"{first_ack}s after PostgreSQL accepted connections again"
            )
        for exit_line in f.celery_exits:
            lines.append(f"  Celery worker exited on the broker's loss and was restarted: {exit_line}")
        if any(rec["to_first_ack_s"] is None for rec in r.recoveries):
            lines.append("  NO ACKNOWLEDGEMENT within 60 s of a restart")
        lines.append(f"  zeroloss_verify --json: exit {f.verify_exit}")
        if r.injector_error:
            lines.append(f"  INJECTOR ERROR: {r.injector_error}")
        for v in f.violations:
            lines.append(f"  VIOLATION: {v}")
    return "\n".join(lines)
