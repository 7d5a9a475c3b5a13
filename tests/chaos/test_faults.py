"""Faults, injected for real, and a checker over the whole history (issue #11, part 3).

- *Unknown commit outcomes* (fast, the test database): a thread records outcomes, claims, or
  runs a transactional batch while the main thread cuts its session at a random moment —
  ``pg_terminate_backend``, or a ``shutdown()`` of the client's socket (a network drop, after
  which the server may commit what the client never hears of) — 200 rounds each. Whatever
  the moment, the ledger never shows a message acknowledged twice or lost, and zeroloss's
  own accounting (the ``CompletionReport`` the worker counts its outcomes from) never
  reports as landed an acknowledgement that did not.
- *The fault suite, CI profile* (``slow``): a private PostgreSQL cluster, real
  ``zeroloss_worker`` processes, a producer sending the whole time, and a seeded schedule of
  SIGKILLs, a SIGSTOP past the lease, ``pg_terminate_backend``, ``-m immediate`` and
  ``-m fast`` restarts; the Celery transport with FLUSHALL and a broker restart; and the
  recovery time after a restart with default settings. ``tests/faults/checker.py`` checks
  the history; the soak profile of the same code is ``python -m benchmarks --only faults``.
- *Partitions and dead hosts* (``slow``, issue 24): in Linux network namespaces, a worker cut
  off by its link taken down, or whose host dies while cut off, for a plain and a
  transactional handler, with default settings: its messages must run on the healthy worker
  within ``ACK_TIMEOUT`` + 15 s (``tests/faults/partitions.py``).
- *Storage faults* (``slow``, issue 51; root: loop mounts, FUSE): the ledger's filesystem
  fills for 6 s, then is freed (PostgreSQL's data directory's, its pg_wal's, SQLite's), and
  pg_wal's fsyncs stall, 5 s each for 6 s, then once for 8 s (``tests/faults/storage.py``; the
  soak's are longer); SQLite's file on a FUSE passthrough refuses writes, then stalls.
- *Faults the suite found in zeroloss* (at the end): fixed; their tests keep them fixed.

The seed is printed (``ZEROLOSS_FAULTS_SEED=N`` replays a schedule).
"""

from __future__ import annotations

import logging
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from django.db import connection, connections, transaction

from tests.faults.checker import read_runs
from tests.faults.cluster import FaultCluster
from tests.faults.partitions import NetResult, run_partitions
from tests.faults.partitions import report as partition_report
from tests.faults.scenario import CI, measure_recovery, report, run_celery, run_database
from tests.faults.storage import CI_STORAGE, StorageRun, run_scenarios, sqlite_on_failing_disk
from tests.faults.storage import report as storage_report
from tests.faults.workflows import WF_CI, run_workflows
from tests.faults.workflows import report as workflow_report
from tests.faults.workload import WorkerPool, child_env, producer
from tests.infra.netns import SUBNET_PREFIX, NetnsLab
from tests.support.waiting import hold_for, pause, wait_until
from zeroloss.core.outage import OutageMonitor, close_connection, is_outage
from zeroloss.ledger.models import Message, MessageEvent
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import Completion, CompletionReport, Lease, Verdict
from zeroloss.runtime.worker.completer import Completer, verdict_counts
from zeroloss.runtime.worker.keeper import LeaseKeeper

pytestmark = [pytest.mark.postgres_only, pytest.mark.once]

ROUNDS = 200
BATCH = 10


@pytest.fixture
def quiet_outages() -> Iterator[None]:
    """The races below cut hundreds of sessions: keep the outage log lines out of the output."""
    logger = logging.getLogger("zeroloss")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _seed() -> int:
    seed = int(os.environ.get("ZEROLOSS_FAULTS_SEED") or random.SystemRandom().randrange(1, 1_000_000))
    print(f"fault suite seed {seed} (replay: ZEROLOSS_FAULTS_SEED={seed})")
    return seed


# -- unknown commit outcomes --------------------------------------------------------------


class Race:
    """A worker thread and a cutter: each round the thread runs ``prepare`` (never cut), then
    ``act`` on its own connection while this (main) thread cuts that connection after a random
    delay, one of two ways:

    - ``terminate``: ``pg_terminate_backend`` of its session (the server ends it);
    - ``network``: ``shutdown()`` of the client's socket (the network drops it). The server may
      then commit a statement whose result never reaches the client: a commit whose outcome
      the client does not know, which a terminated backend almost never produces.

    ``cut`` counts the rounds whose connection was gone afterwards (cut during ``act`` or just
    after it), by way.
    """

    def __init__(self, seed: int, ways: tuple[str, ...] = ("terminate", "network")) -> None:
        self.rng = random.Random(seed)
        self.ways = ways
        self.barrier = threading.Barrier(2, timeout=120)
        self.pid = 0
        self.fd = -1
        self.cut: Counter[str] = Counter()
        #: Set when the worker thread failed: the cutter's gaps end, the race is over.
        self.failed = threading.Event()
        self.error: BaseException | None = None

    @staticmethod
    def backend() -> tuple[int, int]:
        """This thread's session: (backend pid, client socket fd)."""

        def ask() -> tuple[int, int]:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid = int(cursor.fetchone()[0])
            return pid, int(connection.connection.pgconn.socket)

        return _retry_outage(ask)

    def run(
        self, rounds: int, prepare: Callable[[], Any], act: Callable[[Any], None], delay_max: float
    ) -> None:
        ways = [self.rng.choice(self.ways) for _ in range(rounds)]

        def thread_main() -> None:
            try:
                for n in range(rounds):
                    state = prepare()
                    self.pid, self.fd = self.backend()
                    self.barrier.wait()
                    act(state)
                    if self.backend()[0] != self.pid:
                        self.cut[ways[n]] += 1
                    self.barrier.wait()
            except BaseException as exc:
                self.error = exc
                self.failed.set()
                self.barrier.abort()
            finally:
                connections.close_all()

        thread = threading.Thread(target=thread_main, name="race-worker")
        thread.start()
        try:
            for n in range(rounds):
                self.barrier.wait()
                pause(
                    self.failed, self.rng.uniform(0, delay_max)
                )  # the fault schedule: a cut at a random moment
                cut(ways[n], self.pid, self.fd)
                self.barrier.wait()
        except threading.BrokenBarrierError:
            pass
        finally:
            thread.join(timeout=120)
        if self.error is not None:
            raise self.error
        assert not thread.is_alive()


def cut(way: str, pid: int, fd: int) -> None:
    """Cut a session: terminate its backend, or shut its client socket down (a network drop)."""
    if way == "terminate":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    else:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)


T = TypeVar("T")


def _retry_outage(work: Callable[[], T], timeout: float = 30) -> T:
    """Run ``work``; on a connection-level error, drop the connection and run it again (the
    shared server may also refuse a connection for a moment: too many clients)."""
    failures: list[Exception] = []

    def attempt() -> tuple[T] | None:
        try:
            return (work(),)
        except Exception as exc:
            if not is_outage(exc):
                raise
            close_connection("default")
            failures.append(exc)
            return None

    done = wait_until(attempt, timeout)
    if done is None:
        raise AssertionError(f"still failing after {timeout}s: {failures[-1]!r}") from failures[-1]
    return done[0]


def _calibrate(prepare: Callable[[], Any], act: Callable[[Any], None], n: int = 5) -> float:
    """Median seconds of ``act`` uninterrupted (in a thread of its own, as the race runs it):
    the cuts are spread over about that span."""
    times: list[float] = []

    def measure() -> None:
        try:
            for _ in range(n):
                state = prepare()
                t0 = time.perf_counter()
                act(state)
                times.append(time.perf_counter() - t0)
        finally:
            connections.close_all()

    thread = threading.Thread(target=measure)
    thread.start()
    thread.join(timeout=120)
    assert len(times) == n
    return sorted(times)[n // 2]


def _events(reason: str, prefix: str, actor: str | None = None) -> Counter[str]:
    rows = MessageEvent.objects.filter(reason=reason, message__message_id__startswith=prefix)
    if actor is not None:
        rows = rows.filter(actor=actor)
    return Counter(rows.values_list("message__message_id", flat=True))


def _claim(service: ZeroLossMessageService, queue: str, limit: int = BATCH) -> list[Lease]:
    return _retry_outage(lambda: service.claim(queue, limit=limit))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quiet_outages")
def test_outcome_flush_racing_a_cut_connection():
    """The worker's batch completer flushing acknowledgements (``record_outcomes``; after a lost
    commit, ``record_outcomes`` again and ``own_outcomes``) while its session is terminated or its
    network cut at a random moment, 200 rounds: never acknowledged twice, never lost, and the
    report the worker counts its outcomes from names exactly the acknowledgements that landed."""
    seed = _seed()
    resolved: list[str] = []

    class Service(ZeroLossMessageService):
        def own_outcomes(self, leases: Any) -> dict[str, str]:
            landed = super().own_outcomes(leases)
            resolved.extend(landed)  # acknowledgements whose commit the flush never heard of
            return landed

    service = Service(instance_id="race-acker", ack_timeout=120)
    total = (ROUNDS + 5) * BATCH
    service.persist_messages([(f"ack-{i:05d}", "race.ack", {"i": i}) for i in range(total)])
    reports: list[tuple[list[Lease], CompletionReport]] = []
    race = Race(seed)

    def flush(leases: list[Lease]) -> None:
        keeper = LeaseKeeper(service, interval=60)  # not started: holds, and tells what is lost
        keeper.hold(leases)
        got: list[CompletionReport] = []
        # the completer's retry backoff, kept short: the race is the subject, not the backoff
        completer = Completer(
            service, keeper, on_report=got.append, wait=lambda s: pause(race.failed, min(s, 0.02))
        )
        for lease in leases:
            completer.add(Completion(lease, Verdict.ACKNOWLEDGE))
        completer.flush()
        reports.append((leases, got[0]))

    def prepare() -> list[Lease]:
        return _claim(service, "race.ack")

    delay = 3 * _calibrate(prepare, flush)
    monitor = OutageMonitor.for_alias("default")
    outages_before = monitor.outages
    race.run(ROUNDS, prepare, flush, delay_max=delay)
    flushes_cut = monitor.outages - outages_before

    acked = _events("acknowledged", "ack-")
    ours = _events("acknowledged", "ack-", actor="race-acker")
    assert max(acked.values()) == 1, "a message was acknowledged twice"
    landed_not_reported: list[str] = []
    for leases, got in reports:
        ids = {x.message_id for x in leases}
        truth = {m for m in ids if ours[m] == 1}
        assert truth == ids, f"lost: {sorted(ids - truth)} were neither acknowledged nor are they held"
        assert set(got.acknowledged) <= truth, f"reported as landed but not: {set(got.acknowledged) - truth}"
        assert verdict_counts(got)["completed"] == len(set(got.acknowledged))
        landed_not_reported += sorted(truth - set(got.acknowledged))
    assert landed_not_reported == [], f"landed but reported lost (lease_lost): {landed_not_reported[:10]}"
    assert (
        Message.objects.filter(message_id__startswith="ack-", status="completed").count()
        == len(reports) * BATCH
    )
    print(
        f"flush rounds {ROUNDS}: connection cut {dict(race.cut)}, {flushes_cut} flushes hit; "
        f"{len(resolved)} acknowledgements had landed although their commit was cut (found by own_outcomes)"
    )
    assert flushes_cut >= 10, f"only {flushes_cut} of {ROUNDS} flushes were cut: the race did not happen"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quiet_outages")
def test_claim_racing_pg_terminate_backend_then_release_unknown_claims():
    """A claim whose session is terminated (``pg_terminate_backend``) at a random moment, 200
    rounds: when it raised, the claimer gives back what it may hold unknowingly
    (``release_unknown_claims``). Afterwards it holds exactly the leases it knows of, and every
    message is completed once with an honest attempt count. (A *network* cut can leave the
    claim running on the server after the client gave up: see the bug test at the end.)"""
    seed = _seed()
    service = ZeroLossMessageService(instance_id="race-claimer", ack_timeout=120)
    total = (ROUNDS + 5) * BATCH
    service.persist_messages([(f"clm-{i:05d}", "race.claim", {"i": i}) for i in range(total)])
    unknown_rounds = 0
    released: list[str] = []
    stray: list[str] = []

    def claim_round(_state: Any = None) -> None:
        nonlocal unknown_rounds
        try:
            leases = service.claim("race.claim", limit=BATCH)
        except Exception as exc:
            if not is_outage(exc):
                raise
            close_connection("default")
            unknown_rounds += 1
            leases = []
            released.extend(_retry_outage(lambda: service.release_unknown_claims([])))
        held = _retry_outage(
            lambda: set(
                Message.objects.filter(status="processing", claimed_by="race-claimer").values_list(
                    "message_id", flat=True
                )
            )
        )
        stray.extend(sorted(held - {x.message_id for x in leases}))
        if leases:
            _retry_outage(
                lambda: service.record_outcomes([Completion(x, Verdict.ACKNOWLEDGE) for x in leases])
            )

    delay = 2 * _calibrate(lambda: None, claim_round)
    race = Race(seed, ways=("terminate",))
    race.run(ROUNDS, lambda: None, claim_round, delay_max=delay)

    assert stray == [], f"claimed but unknown to the claimer after release_unknown_claims: {stray[:10]}"
    while leases := service.claim("race.claim", limit=100):  # the rest, and any the cuts left pending
        service.record_outcomes([Completion(x, Verdict.ACKNOWLEDGE) for x in leases])
    assert Message.objects.filter(message_id__startswith="clm-").exclude(status="completed").count() == 0
    acked = _events("acknowledged", "clm-")
    assert len(acked) == total and set(acked.values()) == {1}
    claimed, given_back = _events("claimed", "clm-"), _events("released", "clm-")
    for message_id, attempts in Message.objects.filter(message_id__startswith="clm-").values_list(
        "message_id", "attempts"
    ):
        assert attempts == claimed[message_id] - given_back[message_id], message_id  # a release is no attempt
    print(
        f"claim rounds {ROUNDS}: cut {dict(race.cut)}, claim raised {unknown_rounds}, "
        f"{len(released)} claimed messages released by release_unknown_claims"
    )
    assert unknown_rounds >= 10, f"only {unknown_rounds} claims were cut: the race did not happen"


@pytest.fixture
def race_effect_table(transactional_db: None) -> Iterator[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS faults_race_effect (id bigserial PRIMARY KEY, message_id text NOT NULL)"
        )
    try:
        yield "faults_race_effect"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS faults_race_effect")


@pytest.mark.usefixtures("quiet_outages")
def test_transactional_batch_racing_a_cut_connection(race_effect_table: str):
    """A transactional batch as the worker runs it (rows locked, one effect row per handler,
    acknowledgements, one commit) cut at a random moment, 200 rounds: an effect exists exactly
    when its acknowledgement does — never one without the other, never twice — and running the
    batch again after an unknown outcome completes the rest and nothing twice."""
    seed = _seed()
    service = ZeroLossMessageService(instance_id="race-tx", ack_timeout=120)
    total = (ROUNDS + 5) * BATCH
    service.persist_messages([(f"tx-{i:05d}", "race.tx", {"i": i}) for i in range(total)])
    false_reports: list[str] = []
    landed_unheard: list[str] = []
    outcome_unknown = 0

    def acked_of(leases: list[Lease]) -> set[str]:
        return set(
            MessageEvent.objects.filter(
                reason="acknowledged", actor="race-tx", message__message_id__in=[x.message_id for x in leases]
            ).values_list("message__message_id", flat=True)
        )

    def batch(leases: list[Lease]) -> CompletionReport:
        with transaction.atomic():
            held = service.lock_held(leases)
            with connection.cursor() as cursor:
                for lease in leases:
                    if lease.message_id in held:
                        cursor.execute(
                            f"INSERT INTO {race_effect_table} (message_id) VALUES (%s)", [lease.message_id]
                        )
            return service.record_outcomes(
                [Completion(x, Verdict.ACKNOWLEDGE) for x in leases if x.message_id in held], locked=True
            )

    def run_batch(leases: list[Lease]) -> None:
        nonlocal outcome_unknown
        try:
            report = batch(leases)
        except Exception as exc:
            if not is_outage(exc):
                raise
            close_connection("default")
            outcome_unknown += 1
            landed_unheard.extend(_retry_outage(lambda: acked_of(leases)))
            # Whatever landed, landed with its effects; the rest is still ours: run it again.
            report = _retry_outage(lambda: batch(leases))
        truth = _retry_outage(lambda: acked_of(leases))
        false_reports.extend(sorted(set(report.acknowledged) - truth))

    def prepare() -> list[Lease]:
        return _claim(service, "race.tx")

    delay = 3 * _calibrate(prepare, run_batch)
    race = Race(seed)
    race.run(ROUNDS, prepare, run_batch, delay_max=delay)

    assert false_reports == []
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT message_id, count(*) FROM {race_effect_table} GROUP BY message_id")
        effects = dict(cursor.fetchall())
    acked = _events("acknowledged", "tx-")
    assert set(acked.values()) == {1}, "a message was acknowledged twice"
    assert set(effects.values()) == {1}, "an effect committed twice"
    assert set(effects) == set(acked), (
        f"effects without acknowledgement: {sorted(set(effects) - set(acked))[:5]}, "
        f"acknowledgements without effect: {sorted(set(acked) - set(effects))[:5]}"
    )
    assert len(acked) == total
    print(
        f"transactional rounds {ROUNDS}: cut {dict(race.cut)}, commit outcome unknown {outcome_unknown}, "
        f"of which {len(set(landed_unheard))} messages' batches had committed"
    )
    assert outcome_unknown >= 10, f"only {outcome_unknown} batches were cut: the race did not happen"


# -- the fault suite (CI profile) ---------------------------------------------------------


@pytest.fixture(scope="module")
def fault_cluster() -> Iterator[FaultCluster]:
    cluster = FaultCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_database_workload_under_faults(fault_cluster: FaultCluster, tmp_path: Path):
    seed = _seed()
    result = run_database(fault_cluster, CI, seed, tmp_path)
    print(report([result], profile=CI, seed=seed))
    findings = result.findings
    assert not result.injector_error
    kinds = Counter(f.kind for f in result.faults)
    assert kinds["sigkill"] >= CI.faults["sigkill"], kinds
    assert kinds["terminate"] >= 1 and kinds["restart-immediate"] >= 1 and kinds["restart-fast"] >= 1, kinds
    assert findings.violations == [], f"logs in {result.run_dir}"
    assert findings.accepted >= CI.messages - findings.given_up
    assert findings.completed == findings.accepted
    assert findings.verify_exit == 0
    # A worker frozen past its lease: the sweep expired its leases, another worker took the
    # messages, and the frozen worker's outcomes were refused and counted when it woke.
    assert any(
        s["expired"] and s["claimed_again_by_another"] and s["late_outcomes_refused"] for s in findings.stops
    ), findings.stops


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workflows_fan_in_exactly_once_under_kills_and_a_restart(fault_cluster: FaultCluster, tmp_path: Path):
    """A group and its transactional callback, and a chain of diamonds, drained by three workers
    SIGKILLed in turn with a PostgreSQL restart halfway: every step completed, the callback's
    effect committed once and only after every member completed (tests/faults/workflows.py)."""
    seed = _seed()
    result = run_workflows(fault_cluster, WF_CI, seed, tmp_path)
    print(workflow_report([result]))
    kinds = Counter(f.kind for f in result.faults)
    assert kinds["sigkill"] >= WF_CI.kills and kinds["restart-immediate"] == 1, kinds
    assert result.violations == [], f"logs in {result.run_dir}"
    assert result.callback_effects == 1 and result.callback_claimed_after_members_s is not None
    assert result.completed == result.expected_steps == WF_CI.members + 1 + 4 * WF_CI.diamonds


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_celery_transport_under_broker_faults(fault_cluster: FaultCluster, tmp_path: Path):
    seed = _seed()
    result = run_celery(fault_cluster, CI, seed, tmp_path)
    print(report([result], profile=CI, seed=seed))
    kinds = Counter(f.kind for f in result.faults)
    assert kinds["flushall"] >= 1 and kinds["broker-restart"] >= 1 and kinds["sigkill"] >= 1, kinds
    assert not result.injector_error
    assert result.findings.violations == [], f"logs in {result.run_dir}"
    assert result.findings.completed == result.findings.accepted > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_recovery_after_restarts_with_default_settings(fault_cluster: FaultCluster, tmp_path: Path):
    """Seconds from PostgreSQL accepting connections to the first acknowledgement are printed
    (measured, not asserted: see benchmarks); the run must drain and check clean."""
    seed = _seed()
    result = measure_recovery(fault_cluster, CI, seed, tmp_path)
    print(report([result], profile=CI, seed=seed))
    assert [r["mode"] for r in result.recoveries] == ["immediate", "fast"]
    assert all(r["to_first_ack_s"] is not None for r in result.recoveries), result.recoveries
    assert result.findings.violations == [], f"logs in {result.run_dir}"


# -- partitions and dead hosts (issue 24) -------------------------------------------------

_ECHO_SERVER = """
import signal, socket, sys
s = socket.create_server((sys.argv[1], 7000))
print("listening", flush=True)
conn, _ = s.accept()
while data := conn.recv(100):
    conn.sendall(data)
print("peer closed", flush=True)
signal.pause()  # until the test kills it
"""
_CLIENT = """
import socket, sys
conn = socket.create_connection((sys.argv[1], 7000), timeout=5)
for line in sys.stdin:
    command, seconds = line.split()
    conn.settimeout(float(seconds))
    try:
        if command == "echo":
            conn.sendall(b"x")
            print("echoed" if conn.recv(1) == b"x" else "closed", flush=True)
        elif command == "wait":  # the answer to an earlier echo, once the link is back
            print("echoed" if conn.recv(1) == b"x" else "closed", flush=True)
        else:
            socket.create_connection((sys.argv[1], 7000), timeout=float(seconds)).close()
            print("connected", flush=True)
    except OSError as exc:
        print(type(exc).__name__, exc.errno, flush=True)
"""


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line a child prints, waited for at most ``timeout`` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"the child printed nothing in {timeout}s")
    return proc.stdout.readline().strip()


def test_a_cut_link_drops_silently_heals_and_a_dead_host_leaves_nothing_behind():
    """What the partition scenarios rely on (tests/infra/netns.py): a client in a worker namespace
    talks to a server in the database namespace over the veth pair; after ``cut()`` its data
    gets no answer and no error (silence, not a reset) and a new connection finds no route;
    after ``heal()`` the same connection answers again; ``kill_host`` leaves no process and no
    namespace (with the link up the server hears the FIN: the dead-host scenario cuts first),
    and ``destroy`` kills and removes the rest. The root namespace has none of the addresses."""
    lab = NetnsLab(tag="t")
    procs: list[subprocess.Popen[str]] = []
    try:
        link = lab.add_worker_host()
        assert (
            SUBNET_PREFIX not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        )
        server = subprocess.Popen(
            [*lab.exec_prefix(lab.db_ns), sys.executable, "-c", _ECHO_SERVER, link.db_address],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(server)
        assert _read_line(server, 30) == "listening"
        client = subprocess.Popen(
            [*lab.exec_prefix(link.worker_ns), sys.executable, "-c", _CLIENT, link.db_address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(client)

        def ask(command: str, seconds: float) -> str:
            assert client.stdin is not None
            client.stdin.write(f"{command} {seconds}\n")
            client.stdin.flush()
            return _read_line(client, seconds + 30)

        assert ask("echo", 5) == "echoed"
        link.cut()
        assert ask("echo", 2) == "TimeoutError None"  # silence: no reset, no error
        assert ask("connect", 2).split()[0] == "OSError"  # ENETUNREACH: the route went with the link
        link.heal()
        assert ask("wait", 20) == "echoed"  # the resent byte got through on the same connection
        worker_ns = link.worker_ns
        killed = lab.kill_host(worker_ns)
        assert client.pid in killed and client.wait(timeout=10) == -signal.SIGKILL
        assert _read_line(server, 10) == "peer closed"  # the link was up: its FIN arrived
        assert worker_ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        lab.destroy()
        for proc in procs:
            proc.wait(timeout=10)
    assert lab.prefix not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert server.returncode == -signal.SIGKILL  # destroy() killed what ran in the database namespace


@pytest.fixture(scope="module")
def partition_results(tmp_path_factory: pytest.TempPathFactory) -> list[NetResult]:
    """The six scenarios of tests/faults/partitions.py at once (about 80 s)."""
    results = run_partitions(CI, 0, tmp_path_factory.mktemp("partitions"))
    print(partition_report(results))
    return results


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("handler", ["plain", "plain-flush", "transactional"])
@pytest.mark.parametrize("fault", ["partition", "host-death"])
def test_a_cut_off_workers_messages_run_elsewhere_within_the_lease_plus_15s(
    partition_results: list[NetResult], fault: str, handler: str
):
    """A worker holding messages is cut off by the network (its link taken down: packets
    silently lost) for longer than ACK_TIMEOUT + 15 s, or its host dies while cut off (its FIN
    never arrives), with default settings — cut while a handler runs, inside a plain handler's
    outcome flush (its transaction open), or inside a transactional batch: the healthy worker
    beside PostgreSQL runs every held message within ACK_TIMEOUT + 15 s of the cut, each counts
    one attempt for the cut-off run, none is lost, no effect commits twice, and after a heal
    the cut-off worker drains new messages on its own."""
    result = next(r for r in partition_results if (r.fault, r.handler) == (fault, handler))
    assert result.misses() == [], f"logs in {result.run_dir}; the table is in the setup's captured output"


# -- storage faults (issue 51) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def storage_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, StorageRun]:
    """PostgreSQL's data filesystem, its pg_wal's, then SQLite's, full for 6 s; pg_wal's fsyncs
    stalled 5 s each for 6 s, then once for 8 s (about 300 s in all at load 9). The soak (``make
    chaos``) runs the same five, longer."""
    results = run_scenarios(list(CI_STORAGE), CI, _seed(), tmp_path_factory.mktemp("storage"))
    print(storage_report(results))
    return {r.scenario: r for r in results}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("scenario", ["disk-full", "wal-full", "sqlite-full"])
def test_a_full_disk_loses_nothing_is_reported_and_processing_resumes_within_5s(
    storage_results: dict[str, StorageRun], scenario: str
):
    """The ledger's filesystem (a loop-mounted ext4: PostgreSQL's data directory, or SQLite's
    file, or pg_wal's) is kept full for 6 s under a producer sending in transactions, two workers (plain
    and transactional handlers, each running the sweep and the scheduler) and a
    ``zeroloss_sweep --loop``, then freed: no accepted message is lost, no effect commits twice,
    every refused ``send()`` raised a documented error (``StorageFull`` when the disk refused
    the write inside it) within 5 s, every re-run has
    its reason in the audit trail, no process exits, the health report and ``zeroloss_status``
    report the storage fault during it and not after (a PANICking pg_wal's server as unreachable
    while it is down), each worker logs it once at its start and once at its end (once per crash
    of the server), and acknowledgements and accepted sends resume within 5 s of the
    space being freed."""
    run = storage_results[scenario]
    assert run.findings.violations == [], (
        f"logs in {run.run_dir}; the table is in the setup's captured output"
    )
    assert run.problems == [], f"logs in {run.run_dir}"
    assert run.findings.refused_sends > 0, "the disk never refused a send: the fault did not happen"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("scenario", ["fsync-stalls", "fsync-stall"])
def test_stalled_fsyncs_lose_nothing_and_processing_resumes_within_5s(
    storage_results: dict[str, StorageRun], scenario: str
):
    """pg_wal on a FUSE passthrough (tests/faults/stallfs.py) whose every fsync takes 5 s more
    for 6 s (past ACK_TIMEOUT, 2 s here), or every fsync waiting out one 8 s stall (the soak:
    60 s and 30 s): every commit waits,
    renewals and the sweep's included. No accepted message is lost, no effect commits twice,
    every re-run has its reason in the audit trail, no process exits, acknowledgements and
    accepted sends resume within 5 s of the stall's end; send() waits out the stall (it
    returns, it is not refused) and no longer than its documented bound; the health report and
    ``zeroloss_status`` report it from 2 s into it, and not after."""
    run = storage_results[scenario]
    assert run.findings.violations == [], (
        f"logs in {run.run_dir}; the table is in the setup's captured output"
    )
    assert run.problems == [], f"logs in {run.run_dir}"
    assert run.max_send_s >= 4.0, (
        f"no send() waited for a stalled fsync ({run.max_send_s}s): no stall happened"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sqlite_on_a_disk_that_refuses_writes_then_stalls_is_told_and_reported(tmp_path: Path):
    """SQLite's file on the FUSE passthrough (tests/faults/stallfs.py): while it refuses every
    write with ENOSPC, ``send()`` raises ``StorageFull`` within 5 s and the health report and
    ``zeroloss_status`` report a storage fault; the same id is stored once the disk takes writes
    again; while every fsync takes 3 s more, both report ``storage stalled`` and ``send()``
    returns once its commit's fsync does; after it, neither reports anything."""
    problems = sqlite_on_failing_disk(tmp_path)
    assert problems == [], f"logs in {tmp_path}"


# -- an outage seen by an idle worker, and claims whose commit an outage hid ---------------------


@pytest.mark.slow
def test_an_idle_worker_reports_the_outage_until_it_ends(fault_cluster: FaultCluster, tmp_path: Path):
    """zeroloss/core/outage.py promises one log line when an outage starts and one when it ends,
    and the worker's health file says ``degraded`` meanwhile. An idle worker's lease keeper
    tick does no database work, "succeeds", and ``OutageMonitor.attempt`` then calls
    ``recovered()``: during one outage the worker logs "reachable again" every keeper tick
    and the next failed claim logs a new "unreachable since", and its health file reads
    ``ok`` / ``reachable`` although the database is down."""
    url = fault_cluster.create_database("zl_faults_outage_log")
    pool = WorkerPool("zeroloss", 1, child_env(url, tmp_path), tmp_path)
    try:
        pool.start()
        # the keeper ticks while idle (nothing held), the worker healthy: those ticks are the subject
        hold_for(2, lambda: _assert_healthy(pool), interval=0.25)
        fault_cluster.stop_server("fast")
        health: list[str] = []
        down_until = time.monotonic() + 10

        def sample_health() -> None:
            if time.monotonic() > down_until - 8:  # after the worker noticed (its claims poll every 0.5 s)
                health.append(_health_status(pool))

        hold_for(10, sample_health, interval=0.25)  # the health file through the whole outage
        fault_cluster.start_server()
        wait_until(lambda: "reachable again" in pool.procs[0].log(), 30, interval=0.2)
        pool.shutdown()
    finally:
        pool.kill_all()
        if not fault_cluster.is_running():
            fault_cluster.start_server()
    log = pool.procs[0].log(tail=1_000_000)
    lines = [line for line in log.splitlines() if "reachable" in line]
    outages = sum("unreachable since" in line for line in lines)
    recoveries = sum("reachable again" in line for line in lines)
    statuses = Counter(health)
    assert (outages, recoveries, set(statuses)) == (1, 1, {"degraded"}), (
        f"one outage of 10 s was logged as {outages} outages and {recoveries} recoveries, and the health "
        f"file said {dict(statuses)} while the database was down:\n" + "\n".join(lines)
    )


@pytest.mark.slow
def test_a_started_transactional_claim_is_never_released_as_unstarted_after_an_outage(
    fault_cluster: FaultCluster, tmp_path: Path
):
    """zeroloss/worker/loop.py: when a transactional batch dies with its connection, the claim
    thread drops its leases from the keeper; if its next claim then fails too (the database
    is still down), ``release_unknown_claims`` gives back every lease the thread holds "but
    does not know" — the dropped ones included. A message whose handler already ran is then
    recorded ``released`` ("released unstarted", detail "the claim's commit outcome was
    lost"), its attempt uncounted: the audit trail says it never started, and a handler that
    loses its connection every time would never spend its attempts. Here the handler (1 s)
    is running when PostgreSQL goes down for 4 s (``-m fast``); ACK_TIMEOUT is 30 s so the
    lease cannot expire first."""
    url = fault_cluster.create_database("zl_faults_released_started")
    env = child_env(url, tmp_path, ZEROLOSS_ACK_TIMEOUT="30")
    pool = WorkerPool("zeroloss", 1, env, tmp_path)
    sender = None
    try:
        pool.start()
        args = {"seed": 1, "prefix": "m", "count": 1, "rate": 1.0, "queues": ["faults.tx"]}
        args.update(max_attempts=100, sleep_ms=1000, out=str(tmp_path / "sends.log"))
        sender = producer(env, tmp_path, args)
        assert wait_until(lambda: read_runs(tmp_path), 60, interval=0.02), "the handler never started"
        fault_cluster.restart("fast", down_for=4.0, dbname="zl_faults_released_started")

        def completed() -> bool:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT status FROM zeroloss_message WHERE message_id = 'm-000000'"
                ).fetchone()
            return bool(row and row[0] == "completed")

        wait_until(completed, 60, interval=0.2)
        pool.shutdown()
    finally:
        pool.kill_all()
        if sender is not None:
            sender.terminate(timeout=10)
    runs = read_runs(tmp_path)
    with psycopg.connect(url, autocommit=True) as conn:
        events = conn.execute(
            "SELECT e.reason, e.attempt, e.actor, e.detail FROM zeroloss_messageevent e JOIN zeroloss_message m "
            "ON m.id = e.message_id WHERE m.message_id = 'm-000000' ORDER BY e.id"
        ).fetchall()
        attempts = conn.execute(
            "SELECT attempts FROM zeroloss_message WHERE message_id = 'm-000000'"
        ).fetchone()
    trail = "\n".join(
        f"  {reason} (attempt {attempt}) by {actor}: {detail}" for reason, attempt, actor, detail in events
    )
    released = [e for e in events if e[0] == "released"]
    assert not released, (
        f"the handler started {len(runs)} times (attempts {[r.attempt for r in runs]}), the message ends with "
        f"attempts={attempts[0] if attempts else None}, and its first claim was released as unstarted:\n{trail}"
    )


def _assert_healthy(pool: WorkerPool) -> None:
    assert _health_status(pool) == "ok", pool.procs[0].log()


def _health_status(pool: WorkerPool) -> str:
    import json

    health = pool.generations[-1].health
    assert health is not None
    try:
        return str(json.loads(health.read_text())["status"])
    except (OSError, ValueError, KeyError):
        return "unreadable"


@pytest.mark.django_db(transaction=True)
def test_release_unknown_claims_waits_for_a_claim_the_server_still_runs_after_a_network_cut():
    """zeroloss/worker/loop.py: a claim that raised "may have committed", so the claim thread
    calls ``release_unknown_claims`` at once. After a *network* cut (not a terminated backend)
    the server has not noticed the client is gone: the claim is still running there and
    commits after the release ran. Its message is then held by the claim thread's instance
    under a lease nobody knows: it waits for ACK_TIMEOUT, and the sweep counts the attempt
    (``lease_expired``) although no handler ever saw it. The slow claim is a trigger sleeping
    1 s (a loaded server); the cut is a ``shutdown()`` of the client's socket."""
    service = ZeroLossMessageService(instance_id="bug-claimer", ack_timeout=120)
    service.persist_message("slow-1", "race.bug", {})
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION faults_slow_claim() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER faults_slow_claim BEFORE UPDATE ON zeroloss_message FOR EACH ROW "
            "WHEN (OLD.status = 'pending' AND NEW.status = 'processing' AND NEW.queue_name = 'race.bug') "
            "EXECUTE FUNCTION faults_slow_claim()"
        )
    try:
        session: list[tuple[int, int]] = []
        outcome: dict[str, Any] = {}

        def claimer() -> None:
            try:
                session.append(Race.backend())
                try:
                    outcome["leases"] = service.claim("race.bug", limit=1)
                except Exception as exc:
                    if not is_outage(exc):
                        raise
                    close_connection("default")
                    outcome["released"] = _retry_outage(lambda: service.release_unknown_claims([]))
            finally:
                connections.close_all()

        thread = threading.Thread(target=claimer)
        thread.start()
        assert wait_until(lambda: session, 10, interval=0.01), "the claimer never connected"

        def in_the_trigger() -> bool:  # the claim is running on the server, in the trigger's sleep
            with connection.cursor() as cursor:
                cursor.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [session[0][0]])
                row = cursor.fetchone()
            return bool(row and row[0] == "PgSleep")

        assert wait_until(in_the_trigger, 10, interval=0.01), "the claim never reached the trigger's sleep"
        cut("network", *session[0])
        thread.join(timeout=30)
        # Wait until the orphaned session has finished (committed, then failed to answer).

        def orphan_gone() -> bool:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [session[0][0]])
                return bool(cursor.fetchone()[0] == 0)

        wait_until(orphan_gone, 30)
        assert "leases" not in outcome, "the cut did not make the claim raise"
        row = Message.objects.get(message_id="slow-1")
        assert (row.status, row.claimed_by) != ("processing", "bug-claimer"), (
            f"slow-1 is held by bug-claimer until {row.lease_expires_at} (attempt {row.attempts}), a lease "
            f"the claimer does not know; release_unknown_claims released {outcome.get('released')} before "
            "the orphaned claim committed"
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS faults_slow_claim ON zeroloss_message")
            cursor.execute("DROP FUNCTION IF EXISTS faults_slow_claim()")
