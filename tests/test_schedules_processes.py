"""Exactly one message per tick with real processes: three workers scheduling a 2 s interval,
their host clocks 30 s apart (libfaketime), one SIGKILLed and restarted."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from typing import Any

import pytest
from django.db import connection

from tests.conftest import child_env
from tests.support import expire_leases
from tests.workers import Proc
from zeroloss.models import Message
from zeroloss.schedules.scheduler import _aware, _clock_sql

# PostgreSQL only: SQLite is embedded, so its clock is the host's and every process sharing its
# file shares the host; skewed clocks between hosts are a server database's case.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.once, pytest.mark.postgres_only]

EVERY = 2


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute(_clock_sql(connection.vendor))
        return _aware(cursor.fetchone()[0])


def wait_db_clock(until: dt.datetime, procs: list[Proc]) -> None:
    deadline = time.monotonic() + 60
    while db_now() < until:
        for proc in procs:
            assert proc.popen.poll() is None, proc.text[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)


def skewed_worker(offset: str, name: str) -> Proc:
    settings = {
        "SCHEDULE_INTERVAL": 0.5,
        "SCHEDULES": {"tick": {"queue": "demo.record_tx", "every": EVERY}},
    }
    env = child_env(
        ZEROLOSS_LOG_LEVEL="INFO",
        ZEROLOSS_SETTINGS_JSON=json.dumps(settings),
        PGAPPNAME=name,
        # Only the wall clock is skewed (what a host with a wrong clock has); libfaketime's
        # monotonic clock would also bend the threads' timed waits.
        FAKETIME_DONT_FAKE_MONOTONIC="1",
    )
    args = [sys.executable, "manage.py", "zeroloss_worker", "--queue", "demo.record_tx", "--no-listen"]
    proc = Proc(["faketime", "-f", offset, *args], env)
    proc.wait_for("zeroloss_worker: queues")
    return proc


def test_three_skewed_schedulers_one_killed_send_every_tick_once(db):
    from tests.hacluster import ensure_debian_package

    ensure_debian_package("faketime", ["faketime"])
    procs: list[Proc] = []
    try:
        offsets = ["-30s", "+0s", "+30s"]
        procs = [skewed_worker(off, f"sched-{n}") for n, off in enumerate(offsets)]
        start = db_now()
        wait_db_clock(start + dt.timedelta(seconds=5), procs)
        procs[2].sigkill_group()  # the one 30 s ahead
        expire_leases()  # its message in hand (if any) goes back at once: no waiting out ACK_TIMEOUT
        wait_db_clock(start + dt.timedelta(seconds=7), procs[:2])
        procs[2] = skewed_worker(offsets[2], "sched-2b")
        end = start + dt.timedelta(seconds=13)
        wait_db_clock(end, procs)
        deadline = time.monotonic() + 30
        # Every tick of the window handled (later ticks may still be arriving).
        ticks = Message.objects.filter(
            message_id__startswith="tick@", message_id__lte=f"tick@{end.isoformat()}"
        )
        while ticks.exclude(status="completed").exists():
            assert time.monotonic() < deadline, [p.text[-2000:] for p in procs] + list(
                ticks.exclude(status="completed").values("message_id", "status")
            )
            time.sleep(0.1)
    finally:
        for proc in procs:
            proc.terminate()
    rows = list(
        Message.objects.filter(message_id__startswith="tick@").values("message_id", "created_at", "status")
    )
    sent = sorted(dt.datetime.fromisoformat(r["message_id"].split("@", 1)[1]) for r in rows)
    # Contiguous from the first tick to the last: none missing, none twice (the unique id).
    step = dt.timedelta(seconds=EVERY)
    assert sent == [sent[0] + n * step for n in range(len(sent))], sent
    # Every tick of the window: from the start (within one tick) to the end (minus the round's lateness).
    assert sent[0] <= start + step and sent[-1] >= end - step, (start, end, sent)
    # None early: the host 30 s ahead sent nothing before its tick, by the database's clock.
    for row in rows:
        tick = dt.datetime.fromisoformat(row["message_id"].split("@", 1)[1])
        assert row["created_at"] >= tick, row
    from project.demo.models import HandledRecord

    handled = sorted(
        HandledRecord.objects.filter(message_id__startswith="tick@").values_list("message_id", flat=True)
    )
    completed = sorted(r["message_id"] for r in rows if r["status"] == "completed")
    assert handled == completed  # each handled once
    assert {r["message_id"] for r in rows if r["message_id"] <= f"tick@{end.isoformat()}"} <= set(completed)


def test_every_tick_once_across_a_database_restart(tmp_path):
    """Two workers schedule a 2 s interval (``catch_up="all"``) on a private PostgreSQL server
    that is restarted mid-window: they ride out the outage, then send the ticks it covered."""
    import subprocess

    from tests.pgcluster import PgCluster

    cluster = PgCluster(dbname="zl_sched_restart")
    procs: list[Proc] = []
    try:
        cluster.start()
        settings = {
            "SCHEDULE_INTERVAL": 0.5,
            "SCHEDULES": {"tick": {"queue": "demo.record_tx", "every": EVERY, "catch_up": "all"}},
        }
        env = child_env(
            DATABASE_URL=cluster.url(), ZEROLOSS_LOG_LEVEL="INFO", ZEROLOSS_SETTINGS_JSON=json.dumps(settings)
        )
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert migrate.returncode == 0, migrate.stderr
        args = [sys.executable, "manage.py", "zeroloss_worker", "--queue", "demo.record_tx", "--no-listen"]
        procs = [Proc(args, {**env, "PGAPPNAME": f"restart-{n}"}) for n in range(2)]
        for proc in procs:
            proc.wait_for("zeroloss_worker: queues")

        def one(sql: str, params: list[Any] | None = None) -> Any:
            with cluster.connect() as conn:
                row = conn.execute(sql, params).fetchone()
                assert row is not None
                return row[0]

        def now() -> dt.datetime:
            return one("SELECT clock_timestamp()")

        def wait_until(instant: dt.datetime) -> None:
            deadline = time.monotonic() + 60
            while now() < instant:
                assert time.monotonic() < deadline and all(p.popen.poll() is None for p in procs)
                time.sleep(0.1)

        start = now()
        wait_until(start + dt.timedelta(seconds=4))
        cluster.restart_primary()  # every session of both workers is cut
        end = now() + dt.timedelta(seconds=6)
        wait_until(end)
        for proc in procs:  # the restart was an outage they rode out, not a blip they missed
            proc.wait_for("reachable again after", timeout=30)
        deadline = time.monotonic() + 30
        while one(
            "SELECT count(*) FROM zeroloss_message WHERE message_id LIKE 'tick@%%' AND status <> 'completed' "
            "AND message_id <= %s",
            [f"tick@{end.isoformat()}"],
        ):
            assert time.monotonic() < deadline, "ticks of the window not completed in 30 s"
            time.sleep(0.1)
    finally:
        for proc in procs:
            proc.terminate()
    try:
        with cluster.connect() as conn:
            sent = sorted(
                dt.datetime.fromisoformat(r[0].split("@", 1)[1])
                for r in conn.execute(
                    "SELECT message_id FROM zeroloss_message WHERE message_id LIKE 'tick@%%'"
                )
            )
            handled = conn.execute(
                "SELECT count(*), count(DISTINCT message_id) FROM demo_handledrecord WHERE message_id LIKE 'tick@%%' "
                "AND message_id <= %s",
                [f"tick@{end.isoformat()}"],
            ).fetchone()
    finally:
        cluster.stop()
    step = dt.timedelta(seconds=EVERY)
    assert sent == [sent[0] + n * step for n in range(len(sent))], sent  # none missing across the restart
    assert sent[0] <= start + step and sent[-1] >= end - step, (start, end, sent)
    in_window = len([t for t in sent if t <= end])
    assert handled == (in_window, in_window)  # each completed tick handled once
