"""The fault schedule (seeded) and the thread that injects it while the workload runs.

The schedule is a list of ``(seconds after the start, kind)`` drawn uniformly from the fault
window with ``random.Random(seed)``; the same seed gives the same schedule and the same
victims, though not the same interleaving with the workload (that is the point: the kills
land wherever the workers happen to be — claiming, in a handler, before an acknowledgement).
Faults run one after another; each is recorded as a :class:`Fault` with its wall-clock start
and end, its victim's pids and what it observed.

Kinds: ``sigkill`` (a worker's whole process group; the supervisor's restart follows after a
random 0.2-1 s), ``sigstop`` (a worker holding leases is frozen until the sweep has expired
one of them and another worker can take it — the real ``ACK_TIMEOUT`` passes, nothing is
moved by hand — then SIGCONT; its late outcomes must be refused), ``terminate``
(``pg_terminate_backend`` of every ledger session), ``restart-immediate`` and
``restart-fast`` (``pg_ctl restart -m ...``, down for a random 0-1.5 s more), and for the
Celery transport ``flushall`` and ``broker-restart`` (SIGKILL of redis-server, restarted on
the same port without its data).
"""

from __future__ import annotations

import heapq
import random
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tests.support.waiting import pause, wait_until

from .cluster import FaultCluster, RedisServer
from .workload import WorkerPool

KINDS = ("sigkill", "sigstop", "terminate", "restart-immediate", "restart-fast", "flushall", "broker-restart")
DB_FAULTS = ("terminate", "restart-immediate", "restart-fast")
#: The ledger's disk full or stalling (tests/faults/storage.py): a fault of the database, not of a worker.
STORAGE_FAULTS = ("disk-full", "wal-full", "fsync-stalls", "fsync-stall", "sqlite-full")
#: A worker's host cut off by a link taken down, or dead while cut off (tests/faults/partitions.py).
NETWORK_FAULTS = ("partition", "host-death")
_PID_IN_ACTOR = re.compile(r":(\d+):[0-9a-f]+(?:/|$)")


def actor_pid(actor: str) -> int | None:
    """The pid in an instance id ``host:pid:random[/thread]`` (``sweep@...`` included)."""
    match = _PID_IN_ACTOR.search(actor)
    return int(match.group(1)) if match else None


@dataclass
class Fault:
    kind: str
    began: float
    ended: float
    slot: int | None = None
    pids: list[int] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        who = f" w{self.slot} pids {self.pids}" if self.pids else ""
        extra = ", ".join(f"{k}={v}" for k, v in self.detail.items())
        return f"{self.kind}{who} at {time.strftime('%H:%M:%S', time.localtime(self.began))} ({extra})"


def schedule(counts: dict[str, int], window: tuple[float, float], seed: int) -> list[tuple[float, str]]:
    """``counts[kind]`` faults of each kind at uniformly random offsets within ``window``."""
    rng = random.Random(seed)
    lo, hi = window
    plan = [(round(rng.uniform(lo, hi), 3), kind) for kind in KINDS for _ in range(counts.get(kind, 0))]
    return sorted(plan)


class Injector(threading.Thread):
    """Runs a schedule against a pool (and the cluster, and the broker) from ``start_at`` on."""

    def __init__(
        self,
        plan: list[tuple[float, str]],
        *,
        seed: int,
        pool: WorkerPool,
        cluster: FaultCluster,
        dbname: str,
        ack_timeout: float,
        sweep_interval: float,
        redis: RedisServer | None = None,
        stop_retries: int = 3,
        log: Callable[[str], None] = print,
    ) -> None:
        super().__init__(name="fault-injector", daemon=True)
        self.plan = list(plan)
        heapq.heapify(self.plan)
        self.rng = random.Random(seed + 1)
        self.pool = pool
        self.cluster = cluster
        self.dbname = dbname
        self.ack_timeout = ack_timeout
        self.sweep_interval = sweep_interval
        self.redis = redis
        self.stop_retries = stop_retries
        self.log = log
        self.faults: list[Fault] = []
        self.error: str = ""
        self.start_at = 0.0
        self._halt = threading.Event()

    # -- the thread -------------------------------------------------------------------------

    def run(self) -> None:
        self.start_at = time.monotonic()
        try:
            while self.plan and not self._halt.is_set():
                at, kind = heapq.heappop(self.plan)
                if self._halt.wait(max(0.0, self.start_at + at - time.monotonic())):
                    break
                fault = getattr(self, "_" + kind.replace("-", "_"))()
                if fault is not None:
                    self.faults.append(fault)
                    self.log(f"  fault {len(self.faults):>2}: {fault.describe()}")
                    # Let the system settle before the next fault, so that each fault's
                    # recovery is its own (a kill needs less: other workers go on).
                    gap = 1.5 if kind == "sigkill" else self.ack_timeout + self.sweep_interval
                    if self._halt.wait(gap):
                        break
        except Exception:
            self.error = traceback.format_exc()
            self.log(f"  fault injector failed:\n{self.error}")

    def halt(self) -> None:
        self._halt.set()

    # -- helpers --------------------------------------------------------------------------

    def _query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        rows: list[list[Any]] = []
        errors: list[psycopg.OperationalError] = []

        def answered() -> bool:
            try:
                with psycopg.connect(
                    self.cluster.url(dbname=self.dbname), autocommit=True, connect_timeout=5
                ) as c:
                    rows[:] = [c.execute(sql, params or []).fetchall()]
                    return True
            except psycopg.OperationalError as exc:
                errors[:] = [exc]
                return False

        if not wait_until(answered, 30, interval=0.2):
            raise errors[-1]
        return rows[0]

    def _ready_slots(self, timeout: float = 20) -> list[int]:
        return wait_until(lambda: [s for s in range(self.pool.count) if self.pool.ready(s)], timeout) or []

    def _holders(self, queue: str | None = None) -> set[int]:
        """Pids whose claim threads hold leases right now (of ``queue``, or any)."""
        rows = self._query(
            "SELECT DISTINCT claimed_by FROM zeroloss_message WHERE status = 'processing' "
            "AND (%s::text IS NULL OR queue_name = %s::text)",
            [queue, queue],
        )
        return {pid for (actor,) in rows if (pid := actor_pid(actor)) is not None}

    def _in_transaction(self, application_name: str) -> bool:
        """Whether a session of that worker is inside a transaction (its rows may be locked)."""
        rows = self._query(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT NULL",
            [application_name],
        )
        return bool(rows[0][0])

    # -- the faults -----------------------------------------------------------------------

    def _sigkill(self) -> Fault | None:
        slots = self._ready_slots()
        if not slots:
            return None
        # The moment is the schedule's; the victim is one holding leases at that moment if
        # any does (a kill of an idle worker tests little), else any worker.
        holders = self._holders()
        holding = [s for s in slots if self.pool.pid(s) in holders]
        slot = self.rng.choice(holding or slots)
        began = time.time()
        generation = self.pool.kill(slot)
        dead = time.time()  # every process of its group is gone
        delay = round(self.rng.uniform(0.2, 1.0), 2)
        pause(self._halt, delay)  # the fault itself: down for a random while
        self.pool.restart(slot)  # the supervisor's job: a killed worker comes back
        return Fault("sigkill", began, dead, slot, generation.pids, {"restarted_after_s": delay})

    def _sigstop(self) -> Fault | None:
        if self.pool.kind != "zeroloss":
            return None
        slots = self._ready_slots()
        if not slots:
            return None
        # Freeze a worker, then look: unless it holds a lease the sweep can expire — a claim
        # of its while none of its sessions is inside a transaction (a transactional batch
        # locks its rows, and the sweep rightly skips locked rows) — let it go at once and try
        # again a moment later, for up to 20 s. Those brief freezes are harmless.
        tries = 0
        deadline = time.monotonic() + 20
        while True:
            tries += 1
            holders = self._holders(queue="faults.plain") or self._holders()
            holding = [s for s in slots if self.pool.pid(s) in holders]
            slot = self.rng.choice(holding or slots)
            pid = self.pool.pid(slot)
            before = self.pool.outcomes(slot).get("lease_lost", 0)
            began = time.time()
            self.pool.pause(slot)
            pause(self._halt, 0.15)  # the freeze's length: a statement it had sent completes meanwhile
            expirable = pid in self._holders() and not self._in_transaction(self.pool.appname(slot))
            if expirable:
                break
            self.pool.resume(slot)
            if time.monotonic() > deadline:
                # Nothing expirable found: not a stop past the lease. Try again later.
                if self.stop_retries > 0:
                    self.stop_retries -= 1
                    heapq.heappush(self.plan, (time.monotonic() - self.start_at + 2, "sigstop"))
                self.log(f"  (no worker held an expirable lease in {tries} brief freezes; retrying later)")
                return None
            pause(self._halt, self.rng.uniform(0.02, 0.1))  # the fault schedule: a random gap between tries
            slots = self._ready_slots() or slots
        # Wait for the real lease expiry and the sweep (another worker's) to requeue one of its
        # messages: ACK_TIMEOUT + a few sweep intervals, bounded.
        limit = began + self.ack_timeout + 3 * self.sweep_interval + 8

        def expired_count() -> int:
            return int(
                self._query(
                    "SELECT count(*) FROM zeroloss_messageevent WHERE reason = 'lease_expired' "
                    "AND created_at >= to_timestamp(%s) AND detail LIKE %s",
                    [began, f"%:{pid}:%"],
                )[0][0]
            )

        expired = wait_until(expired_count, max(0.0, limit - time.time()), interval=0.2) or 0
        if expired:
            pause(
                self._halt, self.sweep_interval
            )  # the fault's length: another worker may claim it meanwhile
        self.pool.resume(slot)
        ended = time.time()
        # Its late outcomes: refused by the fence and counted by the worker (lease_lost).
        wait_until(lambda: self.pool.health_updated(slot) >= ended + 1.5, 10, interval=0.1)
        after = self.pool.outcomes(slot).get("lease_lost", 0)
        fault = Fault(
            "sigstop",
            began,
            ended,
            slot,
            [pid],
            {
                "stopped_s": round(ended - began, 1),
                "tries": tries,
                "expired": expired,
                "lease_lost_delta": after - before,
            },
        )
        if not expired and self.stop_retries > 0:
            self.stop_retries -= 1
            heapq.heappush(self.plan, (time.monotonic() - self.start_at + 2, "sigstop"))
        return fault

    def _terminate(self) -> Fault:
        began = time.time()
        killed = self.cluster.terminate_sessions(self.dbname)
        return Fault("terminate", began, time.time(), detail={"sessions": killed})

    def _restart(self, mode: str) -> Fault:
        restart = self.cluster.restart(
            mode, down_for=round(self.rng.uniform(0, 1.5), 2), dbname=self.dbname, stop=self._halt
        )
        return Fault(
            f"restart-{mode}",
            restart.began,
            restart.up,
            detail={"down_s": round(restart.up - restart.began, 2)},
        )

    def _restart_immediate(self) -> Fault:
        return self._restart("immediate")

    def _restart_fast(self) -> Fault:
        return self._restart("fast")

    def _flushall(self) -> Fault | None:
        if self.redis is None:
            return None
        began = time.time()
        keys = self.redis.flushall()
        return Fault("flushall", began, time.time(), detail={"keys": keys})

    def _broker_restart(self) -> Fault | None:
        if self.redis is None:
            return None
        began = time.time()
        _down, up = self.redis.restart(down_for=round(self.rng.uniform(0.5, 2.0), 2), stop=self._halt)
        return Fault("broker-restart", began, up, detail={"down_s": round(up - began, 2)})
