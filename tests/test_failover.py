"""Automatic failover with pg_auto_failover, for real: zeroloss keeps its promises through it.

A monitor, a primary and a standby (``tests/hacluster.py``); every zeroloss process connects
with libpq's multi-host form (``HOST "127.0.0.1,127.0.0.1"``, ``PORT "p1,p2"``,
``target_session_attrs=read-write``), handed over as JSON in ``ZEROLOSS_DATABASE_JSON``
(dj-database-url cannot parse multi-host URLs; see project/settings.py). Two real
``zeroloss_worker`` processes drain a transactional queue (``demo.record_tx``: one
``HandledRecord`` row per run, committed with the acknowledgement) while a producer process
sends with ``zeroloss.send()`` and logs, per message id, every attempt: ``accepted`` (send
returned) or ``refused`` (send raised). A refused send is retried with the same id
(idempotent); when the retry finds the message already stored, the refused attempt had in fact
committed (the connection died during COMMIT): that case is counted (``in_doubt``).

Then the primary's node dies (SIGKILL of its keeper, postmaster and backends) and the monitor
promotes the standby. Synchronous replication (the cluster's default): every accepted message
is on the new primary and completes, each handler effect exactly once. Asynchronous
replication with a lagging standby: the accepted messages the standby never received are
gone, counted.

This module is also the producer: ``python -m tests.test_failover ROLE JSON_ARGS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.hacluster import HaCluster

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.once]

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "demo.record_tx"


# -- processes -----------------------------------------------------------------------------


def zeroloss_env(
    database: dict[str, Any], zeroloss: dict[str, Any] | None = None, **extra: str
) -> dict[str, str]:
    """Environment of a child process whose Django ``default`` database is ``database``.

    ``DJANGO_DEBUG=0``: with DEBUG on, Django logs every query and zeroloss then never
    prepares statements, which would hide what ``PREPARED_STATEMENTS`` does.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEROLOSS_", "DATABASE_URL"))}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="project.settings",
        DJANGO_DEBUG="0",
        ZEROLOSS_DATABASE_JSON=json.dumps(database),
        ZEROLOSS_SETTINGS_JSON=json.dumps(zeroloss or {}),
        ZEROLOSS_LOG_LEVEL="INFO",
    )
    env.update(extra)
    return env


class Child:
    """A process in its own session (so SIGKILL reaches all of it) whose output lines are kept."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args = args
        self.popen = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def records(self) -> list[dict[str, Any]]:
        """The JSON lines printed so far (log lines of the child are skipped)."""
        out = []
        for line in list(self.lines):
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def wait(self, timeout: float) -> int:
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"{self.args[2:4]} still running after {timeout}s:\n{self.text[-3000:]}"
            ) from exc
        self._reader.join(timeout=5)
        return code

    def stop(self, sig: int = 15) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
                self.popen.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.popen.pid, 9)
                self.popen.wait(timeout=10)
        self._reader.join(timeout=5)


def manage(env: dict[str, str], *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def worker(env: dict[str, str], *extra: str) -> Child:
    return Child(
        [sys.executable, "manage.py", "zeroloss_worker", "--queue", QUEUE, "--poll-interval", "0.1", *extra],
        env,
    )


def producer(env: dict[str, str], prefix: str, stop_file: Path, pace: float = 0.01) -> Child:
    args = {"prefix": prefix, "queue": QUEUE, "stop_file": str(stop_file), "pace": pace}
    return Child([sys.executable, "-m", "tests.test_failover", "produce", json.dumps(args)], env)


def wait_until(what: str, timeout: float, check: Any, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except psycopg.Error as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"{what}: not reached in {timeout:.0f}s (last error: {last})")


class Sends:
    """The producer's log, read back: which ids were accepted, when, after how many refusals."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.accepted: dict[str, dict[str, Any]] = {}
        self.refused: dict[str, int] = {}
        for rec in records:
            if rec.get("outcome") == "accepted":
                self.accepted[rec["id"]] = rec
            elif rec.get("outcome") == "refused":
                self.refused[rec["id"]] = self.refused.get(rec["id"], 0) + 1

    @property
    def in_doubt(self) -> list[str]:
        """Refused sends that had committed after all (found stored by their retry)."""
        return sorted(i for i, rec in self.accepted.items() if rec["existed_before"])

    def accepted_between(self, start: float, end: float, port: int) -> set[str]:
        """Ids accepted by the server on ``port`` and logged between ``start`` and ``end``."""
        return {i for i, rec in self.accepted.items() if start <= rec["t"] < end and rec["port"] == port}


def ledger(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, int]]:
    """message_id -> (status, handler effects) for every message of the queue."""
    rows = conn.execute(
        "SELECT m.message_id, m.status, (SELECT count(*) FROM demo_handledrecord h "
        "WHERE h.message_id = m.message_id) FROM zeroloss_message m WHERE m.queue_name = %s",
        [QUEUE],
    ).fetchall()
    return {str(r[0]): (str(r[1]), int(r[2])) for r in rows}


def replication_report(env: dict[str, str]) -> dict[str, Any]:
    """From a child on the multi-host DSN: the server it reached, ``replication_status()`` and
    ``zeroloss_nodes discover --json``, with REPLICATION_FACTOR 2 (a factor of 1 measures nothing)."""
    env = {**env, "ZEROLOSS_SETTINGS_JSON": json.dumps({"REPLICATION_FACTOR": 2})}
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_failover", "status", "{}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# -- fixtures ------------------------------------------------------------------------------


class Setup:
    def __init__(self, cluster: HaCluster, tmp: Path) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.database = cluster.django_database()
        self.env = zeroloss_env(self.database)
        self.children: list[Child] = []

    def start(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def primary(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.cluster.dsn_multi(), autocommit=True)


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[Setup]:
    cluster = HaCluster(dbname="zl_ha_failover")
    setup = Setup(cluster, tmp_path)
    try:
        seconds = cluster.start()
        print(f"\nHA cluster (monitor + primary + standby) started in {seconds:.1f}s")
        migrated = manage(setup.env, "migrate", "--noinput", "-v", "0", timeout=180)
        assert migrated.returncode == 0, f"migrate through the multi-host DSN failed: {migrated.stderr}"
        yield setup
    finally:
        for child in setup.children:
            child.stop(9)
        cluster.stop()


def start_traffic(ha: Setup, stop_file: Path) -> tuple[list[Child], Child]:
    workers = [ha.start(worker(ha.env)) for _ in range(2)]
    for w in workers:
        wait_until("worker up", 60, lambda w=w: "zeroloss_worker: queues" in w.text)
    sender = ha.start(producer(ha.env, "m", stop_file))
    return workers, sender


def accepted_count(sender: Child) -> int:
    return len(Sends(sender.records()).accepted)


# -- synchronous replication: nothing accepted is lost ----------------------------------------


def test_failover_with_synchronous_standby_loses_no_accepted_message(ha: Setup) -> None:
    names, rows = ha.cluster.replication()
    assert names.startswith("ANY 1 (") and [r[2] for r in rows] == ["quorum"]
    _host, old_port = ha.cluster.primary()
    _host, standby_port = ha.cluster.standby()
    before = replication_report(ha.env)
    assert (before["port"], before["in_recovery"]) == (old_port, False)
    assert before["nodes"]["replication"]["standbys_streaming"] == 1
    [standby] = [n for n in before["nodes"]["nodes"] if n["role"] == "standby"]
    assert (standby["state"], standby["sync_state"]) == ("streaming", "quorum")
    assert (before["confirmed"], before["confirmed_by"]) == (2, [standby["node_id"]])

    stop_file = ha.tmp / "stop-producer"
    workers, sender = start_traffic(ha, stop_file)
    wait_until("50 sends accepted before the kill", 90, lambda: accepted_count(sender) >= 50)

    _host, killed_port = ha.cluster.kill_primary()
    killed_at = time.time()
    assert killed_port == old_port
    failover = ha.cluster.wait_for_failover(timeout=90)
    _host, new_port = ha.cluster.primary()
    assert new_port == standby_port
    accepted_at_failover = accepted_count(sender)
    wait_until(
        "50 more sends accepted on the new primary",
        60,
        lambda: accepted_count(sender) >= accepted_at_failover + 50,
    )
    stop_file.touch()
    assert sender.wait(60) == 0, sender.text[-3000:]
    sends = Sends(sender.records())
    assert set(sends.refused) <= set(sends.accepted)  # every refused send was retried until accepted

    with ha.primary() as conn:
        assert conn.info.port == new_port

        def drained() -> bool:
            state = ledger(conn)
            return all(state.get(i, ("", 0))[0] == "completed" for i in sends.accepted)

        wait_until("every accepted message completed on the new primary", 90, drained, interval=0.5)
        state = ledger(conn)
        first_ack = conn.execute(
            "SELECT extract(epoch FROM min(created_at)) FROM zeroloss_messageevent "
            "WHERE reason = 'acknowledged' AND created_at > to_timestamp(%s)",
            [killed_at],
        ).fetchone()
        redelivered = conn.execute(
            "SELECT count(*) FROM zeroloss_messageevent WHERE reason IN ('lease_expired', 'released')"
        ).fetchone()
    for w in workers:
        w.stop()
        assert w.popen.returncode == 0, w.text[-3000:]

    # every accepted message is on the new primary, completed, its effect committed exactly once
    missing = sorted(set(sends.accepted) - set(state))
    assert missing == []
    assert {i: s for i, s in state.items() if s != ("completed", 1)} == {}
    assert set(state) == set(sends.accepted)  # and nothing that was never accepted
    assert first_ack is not None and first_ack[0] is not None
    kill_to_ack = float(first_ack[0]) - killed_at
    # the workers rode out the failover on their own and logged it: one line when the outage
    # began and one when it ended. A worker whose connections were all between statements may
    # simply reconnect to the new primary and has nothing to say; one that met the outage may be
    # stopped while it still backs off (the other drained the queue meanwhile), before its next
    # attempt would log the end. So: some worker met it, and some worker logged its end.
    met = [w for w in workers if "unreachable since" in w.text]
    assert met, "no worker noticed the failover: " + " | ".join(w.text[-1500:] for w in workers)
    assert any("reachable again" in w.text for w in met), " | ".join(w.text[-1500:] for w in met)

    after = replication_report(ha.env)
    assert after["nodes"]["replication"]["standbys_streaming"] == 0
    assert after["nodes"]["replication"]["problems"][0] == (
        "Only 0 streaming standby(s); REPLICATION_FACTOR=2 needs 1."
    )
    assert (after["port"], after["in_recovery"], after["confirmed"]) == (new_port, False, 1)
    assert (
        after["detail"] == "no streaming standby is attached to the primary: PostgreSQL holds a single copy"
    )
    names, rows = ha.cluster.replication()
    assert (names, rows) == ("", [])  # the old node has not rejoined: the new primary runs alone

    print(
        f"\nsynchronous failover: probe write accepted {failover:.1f}s after the kill; first "
        f"acknowledgement on the new primary {kill_to_ack:.1f}s after it; {len(sends.accepted)} messages "
        f"accepted, {sum(sends.refused.values())} sends refused ({len(sends.refused)} ids, all retried and "
        f"accepted), {len(sends.in_doubt)} refused sends had committed after all; 0 lost; "
        f"{redelivered[0] if redelivered else '?'} leases expired or released; every effect exactly once"
    )


# -- asynchronous replication: what a lagging standby loses, counted ---------------------------

#: WAL written while the standby is frozen, before the sends that are to be lost: more than the
#: loopback socket buffers (tcp_wmem + tcp_rmem maxima, 4 + 6 MiB by default) can hold, so
#: nothing after it can reach the standby, even once it runs again.
FILLER_MB = 24


def test_failover_with_asynchronous_lagging_standby_loses_what_it_never_received(ha: Setup) -> None:
    ha.cluster.set_synchronous(False)
    with ha.cluster.monitor_connect() as conn:
        # A lagging standby is not promoted when more than this much WAL behind (default 16 MiB):
        # we want the promotion, to count what it costs.
        conn.execute("ALTER SYSTEM SET pgautofailover.promote_wal_log_threshold = '1073741824'")
        conn.execute("SELECT pg_reload_conf()")
    with ha.primary() as conn:
        conn.execute("CREATE TABLE wal_filler (id serial PRIMARY KEY, pad text NOT NULL)")
    _host, old_port = ha.cluster.primary()
    _host, standby_port = ha.cluster.standby()

    stop_file = ha.tmp / "stop-producer"
    workers, sender = start_traffic(ha, stop_file)
    wait_until("100 sends accepted", 90, lambda: accepted_count(sender) >= 100)

    # Barrier: everything accepted before it has been replayed by the standby.
    barrier = time.time()
    with ha.cluster.connect(old_port) as conn:
        (lsn,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or (None,)

        def replayed() -> bool:
            row = conn.execute(
                "SELECT bool_and(replay_lsn >= %s::pg_lsn) FROM pg_stat_replication", [lsn]
            ).fetchone()
            return bool(row and row[0])

        wait_until("the standby replayed the barrier", 30, replayed, interval=0.02)

    with ha.cluster.paused_standby():
        paused_at = time.time()
        with ha.cluster.connect(old_port) as conn:
            conn.execute(
                "INSERT INTO wal_filler (pad) SELECT repeat(md5(g::text), 32) FROM generate_series(1, %s) g",
                [FILLER_MB * 1024 * 1024 // 1100],
            )
        lag_from = time.time()
        count_at_lag = accepted_count(sender)
        wait_until(
            "50 sends accepted while the standby lags",
            30,
            lambda: accepted_count(sender) >= count_at_lag + 50,
        )
        _host, killed_port = ha.cluster.kill_primary()
        killed_at = time.time()
    assert killed_port == old_port
    failover = ha.cluster.wait_for_failover(timeout=90)
    assert ha.cluster.primary()[1] == standby_port
    accepted_at_failover = accepted_count(sender)
    wait_until(
        "50 sends accepted after the failover",
        60,
        lambda: accepted_count(sender) >= accepted_at_failover + 50,
    )
    stop_file.touch()
    assert sender.wait(60) == 0, sender.text[-3000:]
    sends = Sends(sender.records())

    before_barrier = sends.accepted_between(0, barrier, old_port)
    # a reply can reach the producer after the kill: the port says which server accepted it
    while_lagging = sends.accepted_between(lag_from, float("inf"), old_port)
    after_kill = sends.accepted_between(killed_at, float("inf"), standby_port)
    assert {rec["port"] for rec in sends.accepted.values()} == {old_port, standby_port}
    with ha.primary() as conn:

        def drained() -> bool:
            state = ledger(conn)
            return all(state[i][0] == "completed" for i in sends.accepted if i in state)

        wait_until("every surviving message completed", 90, drained, interval=0.5)
        state = ledger(conn)
        lost_wal = conn.execute("SELECT count(*) FROM wal_filler").fetchone()
    for w in workers:
        w.stop()

    lost = set(sends.accepted) - set(state)
    assert before_barrier and while_lagging and after_kill
    assert before_barrier <= set(state)  # replayed before the pause: kept
    assert after_kill <= set(state)  # accepted by the new primary: kept
    assert while_lagging <= lost  # accepted after WAL the standby never received: gone
    assert lost <= set(sends.accepted) - before_barrier - after_kill
    # what survived completes with its effect exactly once; what was lost left no effect behind
    assert {i: s for i, s in state.items() if s != ("completed", 1)} == {}
    assert lost_wal is not None and lost_wal[0] < FILLER_MB * 1024 * 1024 // 1100

    print(
        f"\nasynchronous failover: probe write accepted {failover:.1f}s after the kill; "
        f"{len(sends.accepted)} messages accepted, {len(lost)} of them lost with the old primary "
        f"({len(while_lagging)} accepted after the filler, all lost; the standby was frozen "
        f"{killed_at - paused_at:.1f}s before the kill); "
        f"{len(sends.in_doubt)} refused sends had committed after all"
    )


# -- the child process ---------------------------------------------------------------------


def _emit(**data: Any) -> None:
    print(json.dumps(data, default=str), flush=True)


def _produce(args: dict[str, Any]) -> None:
    """Send until the stop file appears (or ``max`` sends); log every attempt; retry a refused
    id until it is accepted."""
    from django.db import connection

    import zeroloss
    from zeroloss.models import Message
    from zeroloss.outage import close_connection, is_outage

    stop = Path(args.get("stop_file") or "/nonexistent/stop-file")
    most = args.get("max")
    n = 0
    while not stop.exists() and (most is None or n < most):
        n += 1
        message_id = f"{args['prefix']}-{n}"
        attempt = 0
        refused = False
        while True:
            attempt += 1
            try:
                existed = refused and Message.objects.filter(message_id=message_id).exists()
                zeroloss.send(args["queue"], {"n": n}, message_id=message_id)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                close_connection("default")
                refused = True
                _emit(id=message_id, outcome="refused", attempt=attempt, t=time.time(), error=str(exc)[:200])
                time.sleep(0.1)
                continue
            port = connection.connection.info.port if connection.connection is not None else None
            _emit(
                id=message_id,
                outcome="accepted",
                attempt=attempt,
                t=time.time(),
                existed_before=existed,
                port=port,
            )
            break
        time.sleep(args.get("pace", 0.01))
    _emit(done=True, sent=n)


def _status() -> None:
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.db import connection

    from zeroloss.service import ZeroLossMessageService

    out = io.StringIO()
    # exit code 1 (raised by call_command) when the requirement is not met: the JSON says why
    with contextlib.suppress(CommandError):
        call_command("zeroloss_nodes", "discover", "--json", stdout=out)
    status = ZeroLossMessageService().replication_status(record=False)
    with connection.cursor() as cursor:
        cursor.execute("SELECT inet_server_port(), pg_is_in_recovery()")
        port, recovery = cursor.fetchone()
    _emit(
        port=port,
        in_recovery=recovery,
        confirmed=status.confirmed,
        required=status.required,
        confirmed_by=status.confirmed_by,
        detail=status.detail,
        nodes=json.loads(out.getvalue()),
    )


def main() -> None:
    role, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    if role == "produce":
        _produce(args)
    elif role == "status":
        _status()
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
