"""The history checker: what the producer was told, every handler run, the audit trail, the ledger.

Inputs, all written while the workload ran and read once it has drained:

- the producer's log (every ``send`` call: accepted or refused, with its message id);
- the run logs (every handler *start*, and every handler end, with the lease's attempt and
  token and the worker's pid);
- the ledger: ``zeroloss_message``, the audit trail ``zeroloss_messageevent``, and the
  transactional handler's effect table (a row per committed run);
- the faults injected and the worker generations (who was killed when).

:meth:`Checker.check` returns a :class:`Findings`: the counts the report prints and the
``violations`` — anything a guarantee rules out. An empty list is a pass.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import sqlite3
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from zeroloss.core.states import ANNOTATIONS, is_allowed

from .injector import DB_FAULTS, NETWORK_FAULTS, STORAGE_FAULTS, Fault, actor_pid
from .workload import ROOT, Generation
from .zeroloss_handlers import EFFECT_TABLE, TX_QUEUE

#: Allowance between the database's clock (audit times) and this process's (same machine).
CLOCK_SLACK = 0.5
_ANNOTATIONS = {r.value for r in ANNOTATIONS}


@dataclass
class Send:
    began: float
    returned: float
    message_id: str
    queue: str
    attempt: int
    accepted: bool
    error: str


@dataclass
class Run:
    at: float
    kind: str
    message_id: str
    attempt: int
    token: str
    pid: int
    ended: float | None = None


@dataclass
class Event:
    id: int
    message_id: str
    source: str
    target: str
    reason: str
    actor: str
    attempt: int
    at: float
    detail: str


@dataclass
class Claim:
    message_id: str
    attempt: int
    actor: str
    pid: int | None
    at: float
    end_reason: str = ""
    end_at: float | None = None
    runs: list[Run] = field(default_factory=list)


@dataclass
class Findings:
    seed: int
    sends: int = 0
    accepted: int = 0
    refused_sends: int = 0
    refused_then_accepted: int = 0
    landed_despite_error: int = 0
    given_up: int = 0
    given_up_in_ledger: int = 0
    completed: int = 0
    lost: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    effects_twice: list[str] = field(default_factory=list)
    effects_missing: list[str] = field(default_factory=list)
    effects_not_of_acked_run: list[str] = field(default_factory=list)
    runs: int = 0
    #: When each handler run started (epoch seconds): what ran during a fault.
    run_starts: list[float] = field(default_factory=list)
    #: Claims whose lease ran out with no handler run: an attempt spent unrun (the sweep
    #: requeued them).
    expired_unrun: int = 0
    reruns: Counter[str] = field(default_factory=Counter)
    rerun_causes: Counter[str] = field(default_factory=Counter)
    unjustified: list[str] = field(default_factory=list)
    bad_edges: list[str] = field(default_factory=list)
    failed_events: int = 0
    lease_expired_events: int = 0
    released_events: int = 0
    kill_landings: Counter[str] = field(default_factory=Counter)
    stops: list[dict[str, Any]] = field(default_factory=list)
    fault_timing: list[dict[str, Any]] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    #: Celery workers that exited on a broker connection loss (Celery's behaviour; restarted).
    celery_exits: list[str] = field(default_factory=list)
    late_outcomes_refused: int = 0
    verify_exit: int | None = None
    verify_issues: list[Any] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def effects_twice_count(self) -> int:
        return len(self.effects_twice)

    @property
    def max_fault_to_drained(self) -> float:
        values = [t["victims_done_s"] for t in self.fault_timing if t["victims_done_s"] is not None]
        return max(values, default=0.0)


def read_sends(path: Path) -> list[Send]:
    sends = []
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        began, returned, mid, queue, attempt, result, error = line.split(" ", 6)
        if result == "fatal":
            raise AssertionError(f"the producer hit a bug of the suite: {line}")
        sends.append(
            Send(float(began), float(returned), mid, queue, int(attempt), result == "accepted", error)
        )
    return sends


def read_runs(run_dir: Path) -> list[Run]:
    starts: dict[tuple[str, int], Run] = {}
    runs: list[Run] = []
    for log in sorted((run_dir / "runs").glob("*.log")):
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) != 8:
                continue  # a line cut by a SIGKILL cannot happen (one write), but be strict elsewhere
            at, event, kind, mid, attempt, token, pid, _thread = parts
            if event == "start":
                run = Run(float(at), kind, mid, int(attempt), token, int(pid))
                runs.append(run)
                starts[(token, int(pid))] = run
            elif event == "end" and (token, int(pid)) in starts:
                starts[(token, int(pid))].ended = float(at)
    return runs


def _celery_unrecoverable(log: Path) -> str:
    """The "Unrecoverable error" line a Celery worker logs before exiting, if any."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if "Unrecoverable error" in line:
            return line.split("Unrecoverable error", 1)[1].strip(": ")[:200]
    return ""


class Checker:
    def __init__(
        self,
        *,
        seed: int,
        database_url: str,
        run_dir: Path,
        faults: list[Fault],
        generations: list[Generation],
    ) -> None:
        self.seed = seed
        self.url = database_url
        self.run_dir = run_dir
        self.faults = faults
        self.generations = generations

    # -- loading ----------------------------------------------------------------------------

    def _load(self) -> None:
        if self.url.startswith("sqlite:///"):
            self._load_sqlite(self.url.removeprefix("sqlite:///"))
        else:
            self._load_postgres()
        self.sends = read_sends(self.run_dir / "sends.log")
        self.runs = read_runs(self.run_dir)

    def _load_postgres(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            self.messages = {
                r[0]: {"queue": r[1], "status": r[2], "attempts": r[3], "max_attempts": r[4]}
                for r in conn.execute(
                    "SELECT message_id, queue_name, status, attempts, max_attempts FROM zeroloss_message"
                )
            }
            self.events = [
                Event(r[0], r[1], r[2], r[3], r[4], r[5], r[6], float(r[7]), r[8] or "")
                for r in conn.execute(
                    "SELECT e.id, m.message_id, e.from_status, e.to_status, e.reason, e.actor, e.attempt, "
                    "extract(epoch FROM e.created_at)::float8, e.detail FROM zeroloss_messageevent e "
                    "JOIN zeroloss_message m ON m.id = e.message_id ORDER BY e.id"
                )
            ]
            self.effects = [
                (r[0], r[1], r[2], str(r[3]), float(r[4]))
                for r in conn.execute(
                    f"SELECT message_id, attempt, pid, token, extract(epoch FROM committed_at)::float8 "
                    f"FROM {EFFECT_TABLE}"
                )
            ]

    def _load_sqlite(self, path: str) -> None:
        """The same rows from SQLite's file (the embedded default; times are UTC text there)."""
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as conn:
            self.messages = {
                r[0]: {"queue": r[1], "status": r[2], "attempts": r[3], "max_attempts": r[4]}
                for r in conn.execute(
                    "SELECT message_id, queue_name, status, attempts, max_attempts FROM zeroloss_message"
                )
            }
            self.events = [
                Event(r[0], r[1], r[2], r[3], r[4], r[5], r[6], float(r[7]), r[8] or "")
                for r in conn.execute(
                    "SELECT e.id, m.message_id, e.from_status, e.to_status, e.reason, e.actor, e.attempt, "
                    "(julianday(e.created_at) - 2440587.5) * 86400.0, e.detail FROM zeroloss_messageevent e "
                    "JOIN zeroloss_message m ON m.id = e.message_id ORDER BY e.id"
                )
            ]
            self.effects = [
                (r[0], r[1], r[2], str(r[3]), float(r[4]))
                for r in conn.execute(
                    f"SELECT message_id, attempt, pid, token, (julianday(committed_at) - 2440587.5) * 86400.0 FROM {EFFECT_TABLE}"
                )
            ]

    # -- the checks -------------------------------------------------------------------------

    def check(self) -> Findings:
        self._load()
        f = Findings(seed=self.seed)
        self._check_sends(f)
        claims = self._check_audit_trail(f)
        self._check_runs(f, claims)
        self._check_effects(f, claims)
        self._check_faults(f, claims)
        self._check_verify(f)
        for g in self.generations:
            if g.how != "died":
                continue
            what = f"worker w{g.slot}g{g.number} (pid {g.pid}) exited {g.exit_code}"
            crash = _celery_unrecoverable(g.log)
            if g.health is None and crash:
                # Celery's own consumer gave up on a broker connection reset (kombu's redis
                # transport, while restoring unacknowledged messages): Celery's behaviour, not
                # zeroloss's; the supervisor restarts it, as systemd would.
                f.celery_exits.append(f"{what}: {crash}")
            else:
                f.unexpected_exits.append(what)
        f.late_outcomes_refused = sum(int(g.outcomes.get("lease_lost", 0)) for g in self.generations)
        self._violations(f)
        return f

    def _check_sends(self, f: Findings) -> None:
        by_id: dict[str, list[Send]] = defaultdict(list)
        for s in self.sends:
            by_id[s.message_id].append(s)
        persisted_at = {e.message_id: e.at for e in self.events if e.reason == "persisted"}
        f.sends = len(by_id)
        self.accepted = {mid for mid, calls in by_id.items() if any(c.accepted for c in calls)}
        f.accepted = len(self.accepted)
        f.refused_sends = sum(1 for s in self.sends if not s.accepted)
        for mid, calls in by_id.items():
            refused = [c for c in calls if not c.accepted]
            if not refused:
                continue
            if mid in self.accepted:
                f.refused_then_accepted += 1
                # Did a call that raised commit anyway (its persisted row is from that call)?
                at = persisted_at.get(mid)
                if at is not None and any(
                    c.began - CLOCK_SLACK <= at <= c.returned + CLOCK_SLACK for c in refused
                ):
                    first_ok = min(c.began for c in calls if c.accepted)
                    if at < first_ok:
                        f.landed_despite_error += 1
            else:
                f.given_up += 1
                if mid in self.messages:
                    f.given_up_in_ledger += 1
        f.phantom = sorted(set(self.messages) - set(by_id))
        for mid in sorted(self.accepted):
            status = self.messages.get(mid, {}).get("status")
            if status == "completed":
                f.completed += 1
            elif status == "dead":
                f.dead.append(mid)
            else:
                f.lost.append(mid)
        f.dead = sorted({*f.dead, *(m for m, row in self.messages.items() if row["status"] == "dead")})
        f.unfinished = sorted(
            m for m, row in self.messages.items() if row["status"] in ("pending", "processing")
        )

    def _check_audit_trail(self, f: Findings) -> dict[str, list[Claim]]:
        by_message: dict[str, list[Event]] = defaultdict(list)
        for e in self.events:
            by_message[e.message_id].append(e)
        claims: dict[str, list[Claim]] = defaultdict(list)
        for mid, events in by_message.items():
            previous = ""
            persisted = acknowledged = 0
            open_claim: Claim | None = None
            for e in events:
                if not is_allowed(e.source, e.target, e.reason):
                    f.bad_edges.append(
                        f"{mid}: {e.source or '(new)'} -> {e.target} ({e.reason}) by {e.actor}"
                    )
                if e.reason in _ANNOTATIONS:
                    continue
                if e.source != previous:
                    f.bad_edges.append(
                        f"{mid}: event {e.id} leaves {e.source!r} but the message was {previous!r}"
                    )
                previous = e.target
                persisted += e.reason == "persisted"
                acknowledged += e.reason == "acknowledged"
                f.failed_events += e.reason == "failed"
                f.lease_expired_events += e.reason == "lease_expired"
                f.released_events += e.reason == "released"
                if open_claim is not None:
                    open_claim.end_reason, open_claim.end_at = e.reason, e.at
                    open_claim = None
                if e.reason == "claimed":
                    open_claim = Claim(mid, e.attempt, e.actor, actor_pid(e.actor), e.at)
                    claims[mid].append(open_claim)
            status = self.messages.get(mid, {}).get("status")
            if persisted != 1:
                f.bad_edges.append(f"{mid}: {persisted} persisted events")
            if acknowledged > 1:
                f.bad_edges.append(f"{mid}: acknowledged {acknowledged} times")
            if previous != status:
                f.bad_edges.append(f"{mid}: status {status!r} but its last event moved it to {previous!r}")
        for mid in set(self.messages) - set(by_message):
            f.bad_edges.append(f"{mid}: no audit events at all")
        return claims

    def _claim_of(self, run: Run, claims: list[Claim]) -> Claim | None:
        candidates = [
            c
            for c in claims
            if c.attempt == run.attempt and c.pid == run.pid and c.at <= run.at + CLOCK_SLACK
        ]
        return max(candidates, key=lambda c: c.at) if candidates else None

    def _check_runs(self, f: Findings, claims: dict[str, list[Claim]]) -> None:
        f.runs = len(self.runs)
        f.run_starts = sorted(r.at for r in self.runs)
        by_token = Counter((r.token, r.message_id) for r in self.runs)
        for (token, mid), n in by_token.items():
            if n > 1:
                f.unjustified.append(f"{mid}: the handler started {n} times under one lease ({token})")
        for run in self.runs:
            claim = self._claim_of(run, claims.get(run.message_id, []))
            if claim is None:
                f.unjustified.append(
                    f"{run.message_id}: a {run.kind} run (attempt {run.attempt}, pid {run.pid}) has no claim"
                )
                continue
            claim.runs.append(run)
        for mid, message_claims in claims.items():
            for claim in message_claims:
                if claim.end_reason == "lease_expired" and not claim.runs:
                    f.expired_unrun += 1
                if claim.end_reason == "acknowledged":
                    if not claim.runs:
                        f.unjustified.append(
                            f"{mid}: acknowledged (attempt {claim.attempt}) without a handler run"
                        )
                    continue
                for run in claim.runs:
                    f.reruns[run.kind] += 1
                    cause = self._cause(claim, run)
                    if cause is None:
                        f.unjustified.append(
                            f"{mid}: a {run.kind} run at attempt {run.attempt} (pid {run.pid}) whose claim "
                            f"ended {claim.end_reason or 'never'}"
                        )
                    else:
                        f.rerun_causes[cause] += 1

    def _cause(self, claim: Claim, run: Run) -> str | None:
        """Why a run's outcome was not the message's acknowledgement, from the audit trail."""
        if claim.end_reason == "released":
            return "released (its claim was given back)"
        if claim.end_reason == "failed":
            return "failed (the handler raised)"
        if claim.end_reason != "lease_expired":
            return None
        end = claim.end_at or 0.0
        finished = "handler finished, outcome refused or lost" if run.ended else "handler cut short"
        for fault in self.faults:
            if (
                fault.kind == "sigkill"
                and claim.pid in fault.pids
                and claim.at <= fault.ended + CLOCK_SLACK
                and fault.began <= end
            ):
                return f"lease_expired after sigkill ({finished})"
        for fault in self.faults:
            if (
                fault.kind in NETWORK_FAULTS
                and claim.pid in fault.pids
                and claim.at <= fault.ended + CLOCK_SLACK
                and fault.began <= end + CLOCK_SLACK
            ):
                return f"lease_expired after {fault.kind} ({finished})"
        for fault in self.faults:
            if (
                fault.kind == "sigstop"
                and claim.pid in fault.pids
                and fault.began <= end + CLOCK_SLACK
                and fault.ended >= claim.at - CLOCK_SLACK
            ):
                return f"lease_expired during sigstop ({finished})"
        for fault in self.faults:
            if (
                fault.kind in (*DB_FAULTS, *STORAGE_FAULTS)
                and fault.began <= end + CLOCK_SLACK
                and fault.ended >= claim.at - CLOCK_SLACK
            ):
                return f"lease_expired across {fault.kind} ({finished})"
        return f"lease_expired, no fault at that time: a slow worker ({finished})"

    def _check_effects(self, f: Findings, claims: dict[str, list[Claim]]) -> None:
        effects: dict[str, list[tuple[str, int, int, str, float]]] = defaultdict(list)
        for effect in self.effects:
            effects[effect[0]].append(effect)
        for mid, row in self.messages.items():
            if row["queue"] != TX_QUEUE:
                if effects.get(mid):
                    f.effects_not_of_acked_run.append(f"{mid}: a plain message has an effect row")
                continue
            mine = effects.get(mid, [])
            if len(mine) > 1:
                f.effects_twice.append(mid)
            if row["status"] == "completed" and not mine:
                f.effects_missing.append(mid)
            acked = [c for c in claims.get(mid, []) if c.end_reason == "acknowledged"]
            acked_tokens = {r.token for c in acked for r in c.runs}
            for _, attempt, pid, token, _at in mine:
                if token not in acked_tokens:
                    f.effects_not_of_acked_run.append(
                        f"{mid}: effect of attempt {attempt} (pid {pid}) committed, but that run was not acknowledged"
                    )

    def _check_faults(self, f: Findings, claims: dict[str, list[Claim]]) -> None:
        acks = sorted(e.at for e in self.events if e.reason == "acknowledged")
        completed_at = {e.message_id: e.at for e in self.events if e.reason == "acknowledged"}
        every_claim = [c for cs in claims.values() for c in cs]
        for fault in self.faults:
            victims = fault.pids if fault.kind in ("sigkill", "sigstop", *NETWORK_FAULTS) else None
            # A kill takes effect when the process is gone (``ended``): a claim statement it
            # had sent may commit in between, and that claim was in its hands too.
            held_at = fault.ended if fault.kind == "sigkill" else fault.began
            in_flight = [
                c
                for c in every_claim
                if c.at <= held_at
                and (c.end_at is None or c.end_at >= fault.began)
                and (victims is None or c.pid in victims)
            ]
            i = bisect.bisect_right(acks, fault.ended)
            first_ack = acks[i] if i < len(acks) else None
            done = [completed_at.get(c.message_id) for c in in_flight]
            victims_done = None
            if in_flight and all(d is not None for d in done):
                victims_done = round(max(d for d in done if d is not None) - fault.began, 2)
            f.fault_timing.append(
                {
                    "kind": fault.kind,
                    "in_flight": len(in_flight),
                    "first_ack_after_s": None if first_ack is None else round(first_ack - fault.ended, 2),
                    "victims_done_s": victims_done,
                }
            )
            if fault.kind == "sigkill":
                phases = set()
                for c in in_flight:
                    started = [r for r in c.runs if r.at <= fault.ended]
                    if c.end_reason == "acknowledged":
                        phases.add("its outcome statement in flight (it landed)")
                    elif not started:
                        phases.add("claimed, handler not started")
                    elif any(r.ended is None or r.ended > fault.ended for r in started):
                        phases.add("inside a handler")
                    else:
                        phases.add("handler done, outcome not yet recorded")
                for phase in phases or {"holding nothing"}:
                    f.kill_landings[phase] += 1
            if fault.kind == "sigstop":
                expired = [c for c in in_flight if c.end_reason == "lease_expired"]
                retaken = [
                    c
                    for c in expired
                    if any(
                        o.at > (c.end_at or 0) and o.actor != c.actor for o in claims.get(c.message_id, [])
                    )
                ]
                f.stops.append(
                    {
                        "held": len(in_flight),
                        "expired": len(expired),
                        "claimed_again_by_another": len(retaken),
                        "late_outcomes_refused": fault.detail.get("lease_lost_delta", 0),
                        "stopped_s": fault.detail.get("stopped_s"),
                    }
                )

    def _check_verify(self, f: Findings) -> None:
        from .workload import child_env

        done = subprocess.run(
            [sys.executable, "manage.py", "zeroloss_verify", "--json"],
            cwd=ROOT,
            env=child_env(self.url, self.run_dir),
            capture_output=True,
            text=True,
            timeout=300,
        )
        f.verify_exit = done.returncode
        try:
            report = json.loads(done.stdout)
            f.verify_issues = report.get("issues", [])
        except ValueError:
            f.verify_issues = [done.stdout[-2000:], done.stderr[-2000:]]

    def _violations(self, f: Findings) -> None:
        v = f.violations

        def add(what: str, items: list[str]) -> None:
            if items:
                v.append(f"{what}: {len(items)} (e.g. {items[:5]})")

        add("accepted but not completed (lost)", f.lost)
        add("dead-lettered", f.dead)
        add("in the ledger but never sent", f.phantom)
        add("still pending or processing after the drain", f.unfinished)
        add("transactional effect committed more than once", f.effects_twice)
        add("completed transactional message without its effect", f.effects_missing)
        add("effect not of the acknowledged run", f.effects_not_of_acked_run)
        add("handler runs without a justification in the audit trail", f.unjustified)
        add("audit-trail edges the state machine does not allow", f.bad_edges)
        add("workers that exited on their own", f.unexpected_exits)
        if f.verify_exit != 0:
            v.append(f"zeroloss_verify --json exited {f.verify_exit}: {f.verify_issues[:5]}")
