"""Partitions and dead hosts: a worker cut off from PostgreSQL by the network, with default settings.

Everything runs in Linux network namespaces (:mod:`tests.infra.netns`): the private
PostgreSQL cluster in a "database host" namespace, listening on its loopback and on the veth
addresses; each scenario's cut-off ``zeroloss_worker`` in a "worker host" namespace of its
own, connected over its veth pair; a healthy ``zeroloss_worker`` beside PostgreSQL (over the
database host's loopback). The harness itself, the producer and the checker stay in the root
namespace and reach the cluster over its Unix socket.

Scenarios, each for a plain and a transactional handler (``ACK_TIMEOUT`` 5 s, every setting
default):

- ``partition``: the cut-off worker holds messages (its handlers running: 1.5 s each) when its
  link is taken down for ``Profile.partition_s`` (60 s in the soak, 25 s in CI: longer than
  the ``ACK_TIMEOUT`` + 15 s target); the healthy worker should take the messages over
  meanwhile. Then the healthy worker stops, the link heals, new messages are sent, and the
  cut-off worker must drain them on its own;
- ``host-death``: the same cut, then every process in the worker's namespace is SIGKILLed and
  the namespace deleted: its kernel's FIN is lost on the down link, so PostgreSQL never hears
  that the peer is gone. The healthy worker should take the messages over. If it has not
  after ``Profile.dead_host_wait_s``, the harness ends the orphaned server sessions itself
  (counted in the report) so that the run can drain and be checked.

Measured per scenario: the messages the cut-off worker held at the cut (from the ledger), the
seconds from the cut until each one's handler started on the healthy worker (its takeover
time), the attempts each counted, and the fault suite's checks over the whole history
(:class:`tests.faults.checker.Checker`: lost, effects twice, every re-run justified, the
audit trail). :func:`report` prints the table docs/guarantees.md shows.

The healthy worker is started first and frozen (SIGSTOP) until the cut, so that the messages
are the cut-off worker's, not shared at random; it is thawed at the moment of the cut.
"""

from __future__ import annotations

import shutil
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from tests.infra.netns import SUBNET_PREFIX, Link, NetnsLab
from tests.support.waiting import pause, wait_until

from .checker import Checker, Findings, read_runs
from .cluster import FaultCluster
from .injector import Fault
from .workload import Proc, WorkerPool, child_env, producer
from .zeroloss_handlers import PLAIN_QUEUE, TX_QUEUE

#: zeroloss's default lease (no setting is overridden here) and the issue-24 target.
ACK_TIMEOUT = 5.0
TAKEOVER_TARGET_S = ACK_TIMEOUT + 15.0
FAULTS = ("partition", "host-death")


@dataclass(frozen=True)
class Handler:
    """A handler kind and the moment of the cut."""

    queue: str
    #: When the link is cut: ``handler`` (a handler of the cut-off worker is running) or
    #: ``flush`` (its outcome flush's transaction is open: the acknowledgement statement ran,
    #: its COMMIT not yet sent).
    moment: str
    label: str


HANDLERS = {
    "plain": Handler(PLAIN_QUEUE, "handler", "plain, cut while a handler runs"),
    "plain-flush": Handler(PLAIN_QUEUE, "flush", "plain, cut inside an outcome flush"),
    "transactional": Handler(TX_QUEUE, "handler", "transactional, cut while a handler of the batch runs"),
}
#: Makes the cut-off worker's acknowledgement statement take 1 s a row (a loaded server), so that
#: the ``flush`` moment is hit every time: the cut lands while the statement runs, its result is
#: lost, and the session stays open in its transaction holding the row. Other sessions are not slowed.
SLOW_OUTCOME_SQL = (
    "CREATE FUNCTION faults_slow_outcome() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF current_setting('application_name') LIKE 'faults-cut%' THEN PERFORM pg_sleep(1); END IF; "
    "RETURN NEW; END $$",
    "CREATE TRIGGER faults_slow_outcome BEFORE UPDATE ON zeroloss_message FOR EACH ROW "
    "WHEN (OLD.status = 'processing' AND NEW.status = 'completed') EXECUTE FUNCTION faults_slow_outcome()",
)
#: Messages the cut-off worker is given (it claims them all before the cut) and their handler time.
HELD = 4
HANDLER_MS = 1500
MAX_ATTEMPTS = 100


class NetnsCluster(FaultCluster):
    """The fault suite's private cluster, run inside the database host's namespace.

    It listens on every address of that namespace (its loopback and the veth ends, nothing
    else exists there) and on its Unix socket, which the harness in the root namespace uses."""

    listen_addresses = "*"
    extra_hba = f"host all all {SUBNET_PREFIX}.0.0/16 trust\n"

    def __init__(self, lab: NetnsLab) -> None:
        self.lab = lab
        self.command_prefix = tuple(lab.exec_prefix(lab.db_ns))
        super().__init__()

    def start(self) -> None:
        super().start()
        with self.connect(dbname="postgres") as conn:
            # Each session's end in the server log, with its client address: when (and how) the
            # server let go of a cut-off worker's sessions.
            conn.execute("ALTER SYSTEM SET log_disconnections = on")
            conn.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] %r %a '")
            conn.execute("SELECT pg_reload_conf()")

    def url(self, *, standby: bool = False, dbname: str | None = None) -> str:
        """Over the Unix socket (the root namespace has no route to the database host)."""
        return f"postgres://postgres@{quote(str(self.root), safe='')}:{self.primary_port}/{dbname or self.dbname}"

    def tcp_url(self, host: str, dbname: str) -> str:
        """Over TCP to ``host``: the veth address (from a worker host) or 127.0.0.1 (beside it)."""
        return f"postgres://postgres@{host}:{self.primary_port}/{dbname}"


@dataclass
class NetResult:
    fault: str
    handler: str
    run_dir: Path
    #: Messages the cut-off worker held at the cut (processing under its leases, from the ledger).
    held: list[str] = field(default_factory=list)
    #: Seconds from the cut to the first start of each held message on the healthy worker.
    takeover_s: dict[str, float | None] = field(default_factory=dict)
    #: Each held message's ``attempts`` once the run drained.
    attempts: dict[str, int] = field(default_factory=dict)
    cut_lasted_s: float = 0.0
    #: Server sessions of the dead host the harness ended after the wait (none if taken over).
    orphans_ended: int = 0
    #: After the heal (partition): messages sent, and how many the cut-off worker acknowledged.
    after_heal_sent: int = 0
    after_heal_by_cut_off: int = 0
    #: Seconds from the heal to the cut-off worker's first acknowledgement.
    after_heal_first_ack_s: float | None = None
    findings: Findings | None = None
    wall_s: float = 0.0
    error: str = ""

    @property
    def name(self) -> str:
        return f"{self.fault} / {HANDLERS[self.handler].label}"

    @property
    def max_takeover_s(self) -> float | None:
        values = list(self.takeover_s.values())
        if not values or any(v is None for v in values):
            return None
        return max(v for v in values if v is not None)

    def misses(self) -> list[str]:
        """Every way the run missed the target or a guarantee (empty: it passed)."""
        out: list[str] = []
        if self.error:
            out.append(f"harness error: {self.error.strip().splitlines()[-1]}")
        if not self.held:
            out.append("the cut-off worker held nothing at the cut (the scenario did not happen)")
        late = {m: t for m, t in self.takeover_s.items() if t is None or t > TAKEOVER_TARGET_S}
        if late:
            out.append(
                f"{len(late)} of {len(self.held)} held messages not running on the healthy worker within "
                f"ACK_TIMEOUT + 15 s = {TAKEOVER_TARGET_S:.0f} s: "
                + ", ".join(f"{m} {'never' if t is None else f'{t:.1f} s'}" for m, t in sorted(late.items()))
            )
        over = {m: a for m, a in self.attempts.items() if a > 2}
        if over:
            out.append(f"attempts counted more than once for the cut-off run: {over}")
        if self.orphans_ended:
            out.append(
                f"the harness had to end {self.orphans_ended} orphaned server sessions of the dead host"
            )
        if self.fault == "partition" and self.after_heal_by_cut_off < self.after_heal_sent:
            out.append(
                f"after the heal the cut-off worker acknowledged {self.after_heal_by_cut_off} of the "
                f"{self.after_heal_sent} new messages on its own"
            )
        if self.findings is None:
            out.append("not checked")
        else:
            out.extend(f"VIOLATION: {v}" for v in self.findings.violations)
        return out


def _query(url: str, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _held_by(url: str, pid: int) -> list[str]:
    rows = _query(
        url,
        "SELECT message_id FROM zeroloss_message WHERE status = 'processing' AND claimed_by LIKE %s",
        [f"%:{pid}:%"],
    )
    return sorted(r[0] for r in rows)


def _in_slow_outcome(url: str, appname: str) -> bool:
    rows = _query(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event = 'PgSleep' "
        "AND datname = current_database()",
        [appname],
    )
    return bool(rows[0][0])


def _unfinished(url: str) -> int:
    return int(_query(url, "SELECT count(*) FROM zeroloss_message WHERE status <> 'completed'")[0][0])


def _wait(check: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    return bool(wait_until(check, max(0.0, timeout), interval=poll))


def _send(env: dict[str, str], run_dir: Path, prefix: str, queue: str, count: int) -> Proc:
    args = {
        "seed": 1,
        "prefix": prefix,
        "count": count,
        "rate": 50.0,
        "queues": [queue],
        "max_attempts": MAX_ATTEMPTS,
        "sleep_ms": HANDLER_MS,
        "out": str(run_dir / "sends.log"),
        "give_up_after": 60,
    }
    return producer(env, run_dir, args)


def run_cut_off(
    cluster: NetnsCluster,
    link: Link,
    dbname: str,
    *,
    fault: str,
    handler: str,
    partition_s: float,
    dead_host_wait_s: float,
    base_dir: Path,
    seed: int,
    log: Callable[[str], None] = print,
    stop: threading.Event | None = None,
) -> NetResult:
    """One scenario on its own database, worker host and link; never raises (``error`` says why).
    ``stop`` (the run's) ends the partition early: the run is being torn down."""
    started = time.monotonic()
    run_dir = base_dir / f"{fault}-{handler}"
    run_dir.mkdir(parents=True, exist_ok=True)
    result = NetResult(fault, handler, run_dir)
    kind = HANDLERS[handler]
    queue = kind.queue
    url = cluster.url(dbname=dbname)
    env = child_env(url, run_dir)  # default settings: ACK_TIMEOUT 5 s, SWEEP_INTERVAL 2 s
    lab = cluster.lab
    cut_off = WorkerPool(
        "zeroloss",
        1,
        dict(env, DATABASE_URL=cluster.tcp_url(link.db_address, dbname)),
        run_dir,
        queues=[queue],
        prefix=lab.exec_prefix(link.worker_ns),
        name="cut",
    )
    healthy = WorkerPool(
        "zeroloss",
        1,
        dict(env, DATABASE_URL=cluster.tcp_url("127.0.0.1", dbname)),
        run_dir,
        queues=[queue],
        prefix=lab.exec_prefix(lab.db_ns),
        name="ok",
    )
    senders: list[Proc] = []
    faults: list[Fault] = []

    def say(line: str) -> None:
        log(f"  {result.name}: {line}")

    try:
        healthy.start()
        healthy.pause(0)  # frozen until the cut, so that the messages are the cut-off worker's
        # Stored before the cut-off worker starts, so that its first claim takes them all.
        senders.append(_send(env, run_dir, "m", queue, HELD))
        if senders[-1].popen.wait(timeout=120) != 0:
            raise RuntimeError(f"the producer failed:\n{senders[-1].log()}")
        if kind.moment == "flush":
            for sql in SLOW_OUTCOME_SQL:
                _query(url, sql)
        cut_off.start()
        victim = cut_off.pid(0)
        if not _wait(lambda: len(_held_by(url, victim)) == HELD or _unfinished(url) == 0, 90, poll=0.05):
            raise RuntimeError(f"the cut-off worker never held all {HELD} messages: {_held_by(url, victim)}")
        if kind.moment == "flush":
            appname = cut_off.appname(0)
            if not _wait(lambda: _in_slow_outcome(url, appname), 60, poll=0.02):
                raise RuntimeError("the cut-off worker's outcome flush never ran")
        elif not _wait(lambda: any(r.pid == victim for r in read_runs(run_dir)), 30, poll=0.02):
            raise RuntimeError("no handler started on the cut-off worker")
        cut_at = link.cut()
        healthy.resume(0)
        survivor = healthy.pid(0)
        result.held = _held_by(url, victim)
        say(f"link cut; {len(result.held)} messages held by the cut-off worker")
        if fault == "host-death":
            generation = cut_off.kill(0, killer=lambda: lab.kill_host(link.worker_ns))
            ended = time.time()
            faults.append(
                Fault(
                    fault, cut_at, ended, 0, generation.pids, {"killed_after_cut_s": round(ended - cut_at, 2)}
                )
            )
            say(f"worker host dead {ended - cut_at:.2f} s after the cut (pids {generation.pids})")
        wait_for = partition_s if fault == "partition" else dead_host_wait_s
        held = set(result.held)

        def taken_over() -> dict[str, float]:
            firsts: dict[str, float] = {}
            for run in read_runs(run_dir):
                if run.pid == survivor and run.message_id in held:
                    firsts[run.message_id] = min(firsts.get(run.message_id, run.at), run.at)
            return firsts

        _wait(lambda: set(taken_over()) == held, cut_at + wait_for - time.time(), poll=0.2)
        firsts = taken_over()
        result.takeover_s = {m: (round(firsts[m] - cut_at, 2) if m in firsts else None) for m in result.held}
        say(f"takeover times (s after the cut): {result.takeover_s}")
        if fault == "partition":
            # The partition lasts its full length; the taken-over handlers finish meanwhile.
            pause(
                stop or threading.Event(), cut_at + partition_s - time.time()
            )  # the fault itself: its full length
            healthy.shutdown()  # the cut-off worker must drain on its own after the heal
            healed_at = link.heal()
            result.cut_lasted_s = round(healed_at - cut_at, 1)
            faults.append(Fault(fault, cut_at, healed_at, 0, [victim], {"lasted_s": result.cut_lasted_s}))
            say(f"link healed after {result.cut_lasted_s} s; healthy worker stopped")
            senders.append(_send(env, run_dir, "h", queue, HELD))
            result.after_heal_sent = HELD
            drained = _wait(lambda: _unfinished(url) == 0 and not senders[-1].alive, 120, poll=0.25)
            acks = _query(
                url,
                "SELECT extract(epoch FROM e.created_at)::float8 FROM zeroloss_messageevent e "
                "JOIN zeroloss_message m ON m.id = e.message_id WHERE e.reason = 'acknowledged' "
                "AND m.message_id LIKE 'h-%%' AND e.actor LIKE %s",
                [f"%:{victim}:%"],
            )
            result.after_heal_by_cut_off = len(acks)
            if acks:
                result.after_heal_first_ack_s = round(min(a[0] for a in acks) - healed_at, 2)
            say(
                f"after the heal: the cut-off worker acknowledged {len(acks)} of {HELD} new messages"
                + (f", the first {result.after_heal_first_ack_s} s after the heal" if acks else "")
                + ("" if drained else "; NOT DRAINED within 120 s")
            )
            cut_off.shutdown()
        else:
            if set(firsts) != held:
                # PostgreSQL still keeps the dead peer's sessions (and their locks): end them, so
                # that the run drains and the history can be checked. A miss of the target.
                rows = _query(
                    url,
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE client_addr = %s::inet",
                    [link.worker_address],
                )
                result.orphans_ended = int(rows[0][0])
                say(f"not taken over in {wait_for:.0f} s: ended {result.orphans_ended} orphaned sessions")
            result.cut_lasted_s = round(time.time() - cut_at, 1)
            drained = _wait(lambda: _unfinished(url) == 0, 120, poll=0.25)
            if not drained:
                say("NOT DRAINED within 120 s of the wait")
            healthy.shutdown()
        for sender in senders:
            sender.terminate(timeout=30)
        result.attempts = dict(
            _query(
                url,
                "SELECT message_id, attempts FROM zeroloss_message WHERE message_id = ANY(%s)",
                [result.held],
            )
        )
        result.findings = Checker(
            seed=seed,
            database_url=url,
            run_dir=run_dir,
            faults=faults,
            generations=[*cut_off.generations, *healthy.generations],
        ).check()
    except Exception:
        result.error = traceback.format_exc()
        say(f"harness error:\n{result.error}")
    finally:
        if link.up and link.worker_ns in lab.links:
            link.heal()
        for pool in (cut_off, healthy):
            pool.kill_all()
        for sender in senders:
            if sender.alive:
                sender.terminate(timeout=10)
        result.wall_s = round(time.monotonic() - started, 1)
    return result


def run_partitions(
    profile: Any,
    seed: int,
    base_dir: Path,
    log: Callable[[str], None] = print,
    *,
    faults: tuple[str, ...] = FAULTS,
    handlers: tuple[str, ...] = tuple(HANDLERS),
) -> list[NetResult]:
    """Every (fault, handler) scenario at once, each on its own database, worker host and link,
    against one cluster in the database host's namespace. ``profile``: a
    :class:`tests.faults.scenario.Profile` (``partition_s``, ``dead_host_wait_s``)."""
    if profile.partition_s <= TAKEOVER_TARGET_S:
        raise ValueError(
            f"partition_s must be longer than ACK_TIMEOUT + 15 s = {TAKEOVER_TARGET_S:.0f} s (the takeover "
            f"target), not {profile.partition_s}: a shorter cut would heal before the target is tested"
        )
    lab = NetnsLab()
    cluster = NetnsCluster(lab)
    results: list[NetResult] = []
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            log(line)

    stop = threading.Event()  # set by the teardown: the scenarios still running end their gaps
    try:
        cluster.start()
        plans = []
        for fault in faults:
            for handler in handlers:
                dbname = f"zl_net_{fault}_{handler}".replace("-", "_")
                cluster.create_database(dbname)
                plans.append((lab.add_worker_host(), dbname, fault, handler))
        say(
            f"  partitions: {len(plans)} scenarios at once, default settings (ACK_TIMEOUT {ACK_TIMEOUT:.0f} s), "
            f"partition {profile.partition_s:.0f} s, dead host waited for {profile.dead_host_wait_s:.0f} s"
        )
        slots: list[NetResult | None] = [None] * len(plans)

        def one(i: int, link: Link, dbname: str, fault: str, handler: str) -> None:
            slots[i] = run_cut_off(
                cluster,
                link,
                dbname,
                fault=fault,
                handler=handler,
                partition_s=profile.partition_s,
                dead_host_wait_s=profile.dead_host_wait_s,
                base_dir=base_dir,
                seed=seed,
                log=say,
                stop=stop,
            )

        threads = [threading.Thread(target=one, args=(i, *plan), daemon=True) for i, plan in enumerate(plans)]
        for thread in threads:
            thread.start()
            pause(stop, 1.0)  # staggered start-ups: the workers' imports compete for the cores
        limit = time.monotonic() + profile.partition_s + profile.dead_host_wait_s + 600
        for thread in threads:
            thread.join(timeout=max(1.0, limit - time.monotonic()))
        for i, (_link, _db, fault, handler) in enumerate(plans):
            got = slots[i]
            results.append(got or NetResult(fault, handler, base_dir, error="the scenario did not finish\n"))
    finally:
        stop.set()
        try:
            server_log = cluster.root / "primary.log"
            if server_log.exists():  # kept with the run's logs: when each orphaned session ended
                shutil.copy(server_log, base_dir / "postgresql.log")
            cluster.stop()
        finally:
            lab.destroy()
    return results


def report(results: list[NetResult]) -> str:
    """The compact table (docs/guarantees.md, "Partitions and dead hosts")."""
    lines = [
        f"partitions and dead hosts, default settings (ACK_TIMEOUT {ACK_TIMEOUT:.0f} s), "
        f"target: taken over within {TAKEOVER_TARGET_S:.0f} s",
        "",
        "| scenario | handler | held | taken over (max s after the cut) | attempts | lost | effects twice | "
        "cut-off worker after the heal | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        taken = [t for t in r.takeover_s.values() if t is not None]
        if not r.held:
            over = "-"
        elif len(taken) == len(r.held):
            over = f"{len(taken)} of {len(r.held)} ({max(taken):.1f})"
        else:
            over = f"**{len(taken)} of {len(r.held)}**" + (f" ({max(taken):.1f})" if taken else "")
            if r.orphans_ended:
                over += f", then {r.orphans_ended} sessions ended by hand"
        attempts = Counter(r.attempts.values())
        attempts_text = ", ".join(f"{a}: {n}" for a, n in sorted(attempts.items())) or "-"
        f = r.findings
        lost = str(len(f.lost)) if f else "?"
        twice = str(f.effects_twice_count) if f else "?"
        if r.fault == "partition":
            after = f"{r.after_heal_by_cut_off} of {r.after_heal_sent} drained" + (
                f" ({r.after_heal_first_ack_s:.1f} s)" if r.after_heal_first_ack_s is not None else ""
            )
        else:
            after = "(host dead)"
        name = f"{r.fault} {r.cut_lasted_s:.0f} s" if r.fault == "partition" else r.fault
        lines.append(
            f"| {name} | {HANDLERS[r.handler].label} | {len(r.held)} | {over} | {attempts_text} | {lost} | {twice} | {after} | "
            f"{'pass' if not r.misses() else 'FAIL'} |"
        )
    for r in results:
        for miss in r.misses():
            lines.append(f"  {r.name}: {miss}")
        if r.findings is not None and r.findings.rerun_causes:
            causes = ", ".join(f"{c}: {n}" for c, n in r.findings.rerun_causes.most_common())
            lines.append(f"  {r.name}: re-runs {causes}")
    return "\n".join(lines)
