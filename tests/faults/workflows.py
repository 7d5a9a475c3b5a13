"""The workflow fault run (issue 47): a group of steps followed by one transactional callback,
and a chain of diamonds (A -> B, C -> D), drained by three ``zeroloss_worker`` processes while
one of them is SIGKILLed every few seconds and PostgreSQL restarts once in the middle.

Both workflows are sent (one transaction, before the workers start) by this module run as a
process of the run's database (``tests/faults/workflow_sender.py``). The checks, from
the ledger once everything ended:

- every step of both workflows exists (none lost) and completed (terminal);
- the callback's effect row (written in its handler's transaction) exists exactly once, although
  its first attempt is SIGKILLed mid-handler (it waits for that; the run kills it once the
  fault schedule is over);
- no step was claimed before every step it depends on had completed: its first ``claimed``
  audit row is later than each dependency's ``completed_at`` (the callback's against all the
  group's members), and each waiting step was released once (one ``dependencies_completed``
  row);
- ``zeroloss_verify --json`` exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.support.waiting import wait_until

from .cluster import FaultCluster
from .injector import Fault, Injector
from .scenario import LoadSampler, _count
from .workload import ROOT, Proc, WorkerPool, child_env
from .zeroloss_handlers import CALLBACK_MARKER, EFFECT_TABLE, WF_CALLBACK_QUEUE, WF_QUEUE

GROUP = "faults-group"
DIAMONDS = "faults-diamonds"
CALLBACK = f"{GROUP}/callback"
MAX_ATTEMPTS = 100  # as the database scenario's: the faults cannot spend them (tests/faults/scenario.py)


@dataclass(frozen=True)
class WorkflowProfile:
    name: str
    members: int
    diamonds: int
    kills: int
    #: Seconds between two kills' starts (the injector adds its own settling gap).
    kill_every: float
    member_sleep_ms: float
    diamond_sleep_ms: float
    workers: int = 3
    concurrency: int = 2
    ack_timeout: float = 2.0
    sweep_interval: float = 2.0
    drain_timeout: float = 240.0


#: CI: sized to run in about a minute on a loaded 2-core host; the soak: the issue's sizes.
WF_CI = WorkflowProfile(
    "ci", members=1_500, diamonds=25, kills=10, kill_every=2.5, member_sleep_ms=5, diamond_sleep_ms=10
)
WF_SOAK = WorkflowProfile(
    "soak", members=10_000, diamonds=200, kills=16, kill_every=4.0, member_sleep_ms=5, diamond_sleep_ms=20
)
WF_PROFILES = {"ci": WF_CI, "soak": WF_SOAK}


@dataclass
class WorkflowResult:
    profile: str
    seed: int
    faults: list[Fault]
    wall_s: float
    load: dict[str, float]
    run_dir: Path
    steps: int = 0
    expected_steps: int = 0
    completed: int = 0
    not_terminal: int = 0
    callback_effects: int = 0
    callback_starts: int = 0
    callback_claimed_after_members_s: float | None = None
    early_claims: int = 0
    releases_not_once: int = 0
    reruns: int = 0
    drained_s: float = 0.0
    verify_exit: int | None = None
    verify_issues: list[Any] = field(default_factory=list)
    injector_error: str = ""

    @property
    def violations(self) -> list[str]:
        v = []
        if self.steps != self.expected_steps:
            v.append(
                f"{self.expected_steps - self.steps} steps lost ({self.steps}/{self.expected_steps} stored)"
            )
        if self.completed != self.expected_steps or self.not_terminal:
            v.append(f"{self.completed}/{self.expected_steps} completed, {self.not_terminal} not terminal")
        if self.callback_effects != 1:
            v.append(f"the callback's effect committed {self.callback_effects} times")
        if self.callback_starts < 2:
            v.append(f"the callback started {self.callback_starts} times: its first attempt was not killed")
        if self.callback_claimed_after_members_s is None or self.callback_claimed_after_members_s < 0:
            v.append(
                f"the callback was claimed before its last member completed ({self.callback_claimed_after_members_s})"
            )
        if self.early_claims:
            v.append(f"{self.early_claims} steps claimed before a dependency completed")
        if self.releases_not_once:
            v.append(f"{self.releases_not_once} waiting steps not released exactly once")
        if self.verify_exit != 0:
            v.append(f"zeroloss_verify --json exited {self.verify_exit}: {self.verify_issues[:5]}")
        if self.injector_error:
            v.append(f"injector: {self.injector_error}")
        return v

    @property
    def ok(self) -> bool:
        return not self.violations


# -- the run ----------------------------------------------------------------------------------


def _plan(profile: WorkflowProfile) -> list[tuple[float, str]]:
    """Kills every ``kill_every`` seconds from 2 s on; the restart halfway through them."""
    plan = [(2.0 + n * profile.kill_every, "sigkill") for n in range(profile.kills)]
    plan.append((2.0 + profile.kills // 2 * profile.kill_every + profile.kill_every / 2, "restart-immediate"))
    return sorted(plan)


UNFINISHED = (
    "SELECT count(*) FROM zeroloss_message WHERE workflow_id IN (%s, %s) "
    "AND status NOT IN ('completed', 'dead', 'cancelled')"
)


def run_workflows(
    cluster: FaultCluster,
    profile: WorkflowProfile,
    seed: int,
    base_dir: Path,
    log: Callable[[str], None] = print,
) -> WorkflowResult:
    started = time.monotonic()
    sampler = LoadSampler()
    sampler.start()
    run_dir = base_dir / "workflows"
    run_dir.mkdir(parents=True, exist_ok=True)
    dbname = "zl_faults_wf"
    url = cluster.create_database(dbname)
    env = child_env(
        url,
        run_dir,
        ZEROLOSS_ACK_TIMEOUT=str(profile.ack_timeout),
        ZEROLOSS_SWEEP_INTERVAL=str(profile.sweep_interval),
    )
    expected = profile.members + 1 + 4 * profile.diamonds
    args = [profile.members, profile.diamonds, profile.member_sleep_ms, profile.diamond_sleep_ms]
    sender = Proc(
        "sender",
        [sys.executable, "-m", "tests.faults.workflow_sender", json.dumps(args)],
        env,
        run_dir / "sender.log",
    )
    if sender.popen.wait(timeout=300) != 0:
        raise RuntimeError(f"the workflows were not sent:\n{sender.log()}")
    pool = WorkerPool(
        "zeroloss",
        profile.workers,
        env,
        run_dir,
        concurrency=profile.concurrency,
        queues=[WF_QUEUE, WF_CALLBACK_QUEUE],
    )
    injector: Injector | None = None
    try:
        pool.start()
        plan = _plan(profile)
        log(
            f"  workflows: {profile.members:,}-step group + callback, {profile.diamonds} diamonds ({expected:,} steps), "
            f"{pool.count} workers x {profile.concurrency}, {len(plan)} faults planned: {dict(Counter(k for _, k in plan))}"
        )
        injector = Injector(
            plan,
            seed=seed,
            pool=pool,
            cluster=cluster,
            dbname=dbname,
            ack_timeout=profile.ack_timeout,
            sweep_interval=profile.sweep_interval,
            log=log,
        )
        injector.start()
        injector.join(timeout=profile.kills * (profile.kill_every + 10) + 120)
        injector.halt()
        waited = time.monotonic()
        _kill_the_callback(pool, run_dir, injector.faults, profile.drain_timeout, log)
        wait_until(
            lambda: _count(url, UNFINISHED, [GROUP, DIAMONDS]) == 0, profile.drain_timeout, interval=0.25
        )
        drained = time.monotonic() - waited
        log(f"  workflows: every step ended {drained:.1f}s after the fault schedule ended")
        pool.shutdown()
        result = WorkflowResult(
            profile.name,
            seed,
            injector.faults,
            0.0,
            {},
            run_dir,
            expected_steps=expected,
            drained_s=round(drained, 1),
            injector_error=injector.error,
        )
        _check(url, run_dir, result)
        result.wall_s = round(time.monotonic() - started, 1)
        result.load = sampler.finish()
        return result
    finally:
        if injector is not None:
            injector.halt()
        pool.kill_all()


def _kill_the_callback(
    pool: WorkerPool, run_dir: Path, faults: list[Fault], timeout: float, log: Callable[[str], None]
) -> None:
    """SIGKILL the worker running the callback's first attempt, mid-handler (it waits for it)."""
    marker = run_dir / CALLBACK_MARKER
    if not wait_until(marker.exists, timeout, interval=0.1):
        raise RuntimeError(f"the callback's first attempt did not start in {timeout}s")
    pid = int(marker.read_text())
    slot = next((s for s in range(pool.count) if pool.pid(s) == pid), None)
    if slot is None:  # a kill of the schedule already ended it (the injector favours lease holders)
        log(f"  the callback's first attempt (pid {pid}) was already ended by a scheduled fault")
        return
    began = time.time()
    generation = pool.kill(slot)
    fault = Fault(
        "sigkill", began, time.time(), slot, generation.pids, {"victim": "the callback, mid-handler"}
    )
    pool.restart(slot)
    faults.append(fault)
    log(f"  fault {len(faults):>2}: {fault.describe()}")


def _check(url: str, run_dir: Path, r: WorkflowResult) -> None:
    with psycopg.connect(url, autocommit=True) as conn:

        def one(sql: str, params: list[Any] | None = None) -> Any:
            row = conn.execute(sql, params or []).fetchone()
            return row[0] if row else None

        wfs = [GROUP, DIAMONDS]
        r.steps = one("SELECT count(*) FROM zeroloss_message WHERE workflow_id IN (%s, %s)", wfs)
        r.completed = one(
            "SELECT count(*) FROM zeroloss_message WHERE workflow_id IN (%s, %s) AND status = 'completed'",
            wfs,
        )
        r.not_terminal = one(UNFINISHED, wfs)
        r.callback_effects = one(f"SELECT count(*) FROM {EFFECT_TABLE} WHERE message_id = %s", [CALLBACK])
        # Its first claim against the last member's completion (the database's clock, both).
        r.callback_claimed_after_members_s = one(
            "SELECT extract(epoch FROM (SELECT min(e.created_at) FROM zeroloss_messageevent e JOIN zeroloss_message m "
            "ON m.id = e.message_id WHERE m.message_id = %s AND e.reason = 'claimed') - "
            "(SELECT max(completed_at) FROM zeroloss_message WHERE workflow_id = %s AND message_id <> %s))",
            [CALLBACK, GROUP, CALLBACK],
        )
        if r.callback_claimed_after_members_s is not None:
            r.callback_claimed_after_members_s = float(r.callback_claimed_after_members_s)
        # Every edge: the downstream's first claim after the upstream's completion.
        r.early_claims = one(
            "SELECT count(DISTINCT d.downstream) FROM zeroloss_dependency d "
            "JOIN zeroloss_message up ON up.message_id = d.upstream "
            "JOIN LATERAL (SELECT min(created_at) AS t FROM zeroloss_messageevent WHERE message_id = d.downstream "
            "AND reason = 'claimed') c ON true "
            "WHERE d.workflow_id IN (%s, %s) AND (c.t IS NULL OR up.completed_at IS NULL OR c.t < up.completed_at)",
            wfs,
        )
        r.releases_not_once = one(
            "SELECT count(*) FROM (SELECT d.downstream FROM zeroloss_dependency d WHERE d.workflow_id IN (%s, %s) "
            "GROUP BY d.downstream) w WHERE (SELECT count(*) FROM zeroloss_messageevent e "
            "WHERE e.message_id = w.downstream AND e.reason = 'dependencies_completed') <> 1",
            wfs,
        )
    starts: Counter[str] = Counter()
    for path in (run_dir / "runs").glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[1] == "start":
                starts[parts[3]] += 1
    r.callback_starts = starts[CALLBACK]
    r.reruns = sum(n - 1 for n in starts.values() if n > 1)
    done = subprocess.run(
        [sys.executable, "manage.py", "zeroloss_verify", "--json"],
        cwd=ROOT,
        env=child_env(url, run_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    r.verify_exit = done.returncode
    try:
        r.verify_issues = json.loads(done.stdout).get("issues", [])
    except ValueError:
        r.verify_issues = [done.stdout[-2000:], done.stderr[-2000:]]


def report(results: list[WorkflowResult]) -> str:
    lines = [
        "| workflows run | faults | steps | completed | callback effects | callback starts | callback claimed after "
        "last member (s) | early claims | re-runs | verify | wall s | load avg (mean/max) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        kinds = Counter(f.kind for f in r.faults)
        after = (
            "-" if r.callback_claimed_after_members_s is None else f"{r.callback_claimed_after_members_s:.3f}"
        )
        lines.append(
            f"| {r.profile}, seed {r.seed} | {sum(kinds.values())}: "
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
            + f" | {r.steps:,}/{r.expected_steps:,} | {r.completed:,} | {r.callback_effects} | {r.callback_starts} | "
            f"{after} | {r.early_claims} | {r.reruns} | exit {r.verify_exit} | {r.wall_s:.0f} | "
            f"{r.load.get('mean', 0):.1f}/{r.load.get('max', 0):.1f} |"
        )
    for r in results:
        for v in r.violations:
            lines.append(f"  VIOLATION ({r.profile}): {v}")
    return "\n".join(lines)
