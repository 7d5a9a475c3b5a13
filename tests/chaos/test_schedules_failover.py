"""Exactly one message per tick across an automatic failover (pg_auto_failover), for real.

Two ``zeroloss_worker`` processes (each one a scheduler) schedule a 2 s interval with
``catch_up="all"`` through libpq's multi-host DSN (``target_session_attrs=read-write``,
``tests/infra/hacluster.py``, as ``tests/chaos/test_failover.py`` uses it). Replication is asynchronous and
the standby is frozen for the last ticks before the primary's node dies: ticks committed on
the old primary, with the schedule's state row that says they were sent, never reach the
standby. After the promotion the new primary's state row is behind, so catch-up sends those
ticks again under the same ids, once: every tick of the window is on the new primary once,
each handled once, none missing. (With ``catch_up="latest"`` a failover may skip every tick
it covered but the most recent one, lost ones included; with ``"none"`` those found due more
than ON_TIME_WINDOW late: see docs/schedules.md.)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.infra.hacluster import HaCluster
from tests.support.cli import manage
from tests.support.failover import FILLER_MB, wait_reachable, worker, zeroloss_env
from tests.support.processes import Proc
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.postgres_only, pytest.mark.once]

EVERY = 2
SETTINGS = {
    "SCHEDULE_INTERVAL": 0.5,
    "SCHEDULES": {"tick": {"queue": "demo.record_tx", "every": EVERY, "catch_up": "all"}},
}


def ticks(conn: psycopg.Connection[Any]) -> dict[dt.datetime, tuple[dt.datetime, str, int]]:
    """tick -> (created_at, status, handler effects) of every tick message on this server."""
    rows = conn.execute(
        "SELECT m.message_id, m.created_at, m.status, (SELECT count(*) FROM demo_handledrecord h "
        "WHERE h.message_id = m.message_id) FROM zeroloss_message m WHERE m.message_id LIKE 'tick@%%'"
    ).fetchall()
    return {dt.datetime.fromisoformat(r[0].split("@", 1)[1]): (r[1], str(r[2]), int(r[3])) for r in rows}


def clock(conn: psycopg.Connection[Any]) -> dt.datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def cluster() -> Iterator[HaCluster]:
    ha = HaCluster(dbname="zl_sched_failover")
    try:
        seconds = ha.start()
        print(f"\nHA cluster (monitor + primary + standby) started in {seconds:.1f}s")
        yield ha
    finally:
        ha.stop()


def test_every_tick_once_across_a_failover_that_lost_the_last_ticks(cluster: HaCluster) -> None:
    cluster.set_synchronous(False)
    with cluster.monitor_connect() as conn:
        # A lagging standby is not promoted when more than this much WAL behind (default 16 MiB).
        conn.execute("ALTER SYSTEM SET pgautofailover.promote_wal_log_threshold = '1073741824'")
        conn.execute("SELECT pg_reload_conf()")
    env = zeroloss_env(cluster.django_database(), SETTINGS)
    migrated = manage(env, "migrate", "--noinput", "-v", "0", timeout=180)
    assert migrated.returncode == 0, migrated.stderr
    _host, old_port = cluster.primary()
    _host, standby_port = cluster.standby()
    workers: list[Proc] = []
    try:
        workers = [worker(env) for _ in range(2)]
        for w in workers:
            w.wait_for("zeroloss_worker: queues", 60)
        with cluster.connect(old_port) as old:
            old.execute("CREATE TABLE wal_filler (id serial PRIMARY KEY, pad text NOT NULL)")
            start = clock(old)
            wait_reachable("3 ticks sent on the first primary", 30, lambda: len(ticks(old)) >= 3)
            # Barrier: every tick so far has been replayed by the standby.
            (lsn,) = old.execute("SELECT pg_current_wal_lsn()").fetchone() or (None,)

            def replayed() -> bool:
                row = old.execute(
                    "SELECT bool_and(replay_lsn >= %s::pg_lsn) FROM pg_stat_replication", [lsn]
                ).fetchone()
                return bool(row and row[0])

            wait_reachable("the standby replayed the barrier", 30, replayed, interval=0.02)
            replicated = ticks(old)
            with cluster.paused_standby():
                # More WAL than the loopback socket buffers hold: nothing after it reaches the standby.
                old.execute(
                    "INSERT INTO wal_filler (pad) SELECT repeat(md5(g::text), 32) FROM generate_series(1, %s) g",
                    [FILLER_MB * 1024 * 1024 // 1100],
                )
                filled = clock(old)
                wait_reachable(
                    "a tick committed after the filler",
                    10,
                    lambda: any(created > filled for created, _s, _h in ticks(old).values()),
                    interval=0.05,
                )
                on_old = ticks(old)
                _host, killed_port = cluster.kill_primary()
        assert killed_port == old_port
        failover = cluster.wait_for_failover(timeout=90)
        assert cluster.primary()[1] == standby_port
        unreplicated = {t: row for t, row in on_old.items() if row[0] > filled}
        with cluster.connect(standby_port) as new:
            end = clock(new) + dt.timedelta(seconds=3 * EVERY)

            def window_done() -> bool:
                state = ticks(new)
                return (
                    clock(new) > end
                    and all(row[1] == "completed" for t, row in state.items() if t <= end)
                    and max(state) >= end - dt.timedelta(seconds=EVERY)
                )

            expired = False

            def done_or_expired() -> bool:
                nonlocal expired
                if window_done():
                    return True
                if not expired and clock(new) > end:
                    # A tick claimed before the failover may hold a lease whose worker's
                    # acknowledgement died with the old primary: expire it instead of waiting out
                    # ACK_TIMEOUT (demo.record_tx commits its effect with the acknowledgement, so a
                    # fenced-off old attempt leaves nothing behind).
                    new.execute(
                        "UPDATE zeroloss_message SET lease_expires_at = statement_timestamp() - interval '1 second' "
                        "WHERE status = 'processing' AND message_id LIKE 'tick@%%'"
                    )
                    expired = True
                return False

            wait_for(lambda: str([w.text[-2000:] for w in workers]), done_or_expired, 60, interval=0.2)
            final = ticks(new)
            lost_wal = new.execute("SELECT count(*) FROM wal_filler").fetchone()
    finally:
        for w in workers:
            w.stop(9)
    sent = sorted(final)
    step = dt.timedelta(seconds=EVERY)
    # Contiguous from the first tick to the last across the failover: none missing; the unique id
    # admits each tick once.
    assert sent == [sent[0] + n * step for n in range(len(sent))], sent
    assert sent[0] <= start + step and sent[-1] >= end - step, (start, end, sent)
    window = [t for t in sent if t <= end]
    assert {t: final[t][1:] for t in window if final[t][1:] != ("completed", 1)} == {}  # each handled once
    # The replicated ticks survived as they were; the ones the standby never received were lost
    # with the old primary and sent again on the new one (a later created_at), once.
    assert lost_wal is not None and lost_wal[0] < FILLER_MB * 1024 * 1024 // 1100  # the filler was lost
    assert all(final[t][0] == row[0] for t, row in replicated.items())
    assert unreplicated, on_old
    resent = {t for t in unreplicated if final[t][0] > unreplicated[t][0]}
    assert resent == set(unreplicated), (unreplicated, {t: final[t] for t in unreplicated})
    print(
        f"\nscheduler failover: write accepted {failover:.1f}s after the kill; {len(window)} ticks in the "
        f"window ({window[0]:%H:%M:%S}..{window[-1]:%H:%M:%S}), each once, each handled once; "
        f"{len(unreplicated)} tick(s) committed on the old primary but never replicated, sent again on "
        f"the new one: {[f'{t:%H:%M:%S}' for t in sorted(unreplicated)]}"
    )
