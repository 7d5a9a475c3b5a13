"""Automatic failover with pg_auto_failover, for real: zeroloss keeps its promises through it.

A monitor, a primary and a standby (``tests/infra/hacluster.py``); every zeroloss process connects
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

The producer and the workers are ``tests/support/failover.py``'s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.infra.hacluster import HaCluster
from tests.support.cli import manage
from tests.support.failover import (
    FILLER_MB,
    ROOT,
    ledger,
    producer,
    wait_reachable,
    worker,
    zeroloss_env,
)
from tests.support.processes import Proc

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.once]


# -- processes -----------------------------------------------------------------------------


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


def replication_report(env: dict[str, str]) -> dict[str, Any]:
    """From a child on the multi-host DSN: the server it reached, ``replication_status()`` and
    ``zeroloss_nodes discover --json``, with REPLICATION_FACTOR 2 (a factor of 1 measures nothing)."""
    env = {**env, "ZEROLOSS_SETTINGS_JSON": json.dumps({"REPLICATION_FACTOR": 2})}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.failover", "status", "{}"],
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
        self.children: list[Proc] = []

    def start(self, child: Proc) -> Proc:
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


def start_traffic(ha: Setup, stop_file: Path) -> tuple[list[Proc], Proc]:
    workers = [ha.start(worker(ha.env)) for _ in range(2)]
    for w in workers:
        w.wait_for("zeroloss_worker: queues", 60)
    sender = ha.start(producer(ha.env, "m", stop_file))
    return workers, sender


def accepted_count(sender: Proc) -> int:
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
    wait_reachable("50 sends accepted before the kill", 90, lambda: accepted_count(sender) >= 50)

    _host, killed_port = ha.cluster.kill_primary()
    killed_at = time.time()
    assert killed_port == old_port
    failover = ha.cluster.wait_for_failover(timeout=90)
    _host, new_port = ha.cluster.primary()
    assert new_port == standby_port
    accepted_at_failover = accepted_count(sender)
    wait_reachable(
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

        wait_reachable("every accepted message completed on the new primary", 90, drained, interval=0.5)
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
    wait_reachable("100 sends accepted", 90, lambda: accepted_count(sender) >= 100)

    # Barrier: everything accepted before it has been replayed by the standby.
    barrier = time.time()
    with ha.cluster.connect(old_port) as conn:
        (lsn,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or (None,)

        def replayed() -> bool:
            row = conn.execute(
                "SELECT bool_and(replay_lsn >= %s::pg_lsn) FROM pg_stat_replication", [lsn]
            ).fetchone()
            return bool(row and row[0])

        wait_reachable("the standby replayed the barrier", 30, replayed, interval=0.02)

    with ha.cluster.paused_standby():
        paused_at = time.time()
        with ha.cluster.connect(old_port) as conn:
            conn.execute(
                "INSERT INTO wal_filler (pad) SELECT repeat(md5(g::text), 32) FROM generate_series(1, %s) g",
                [FILLER_MB * 1024 * 1024 // 1100],
            )
        lag_from = time.time()
        count_at_lag = accepted_count(sender)
        wait_reachable(
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
    wait_reachable(
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

        wait_reachable("every surviving message completed", 90, drained, interval=0.5)
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
