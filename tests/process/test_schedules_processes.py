"""Exactly one message per tick with real processes: three workers scheduling a 2 s interval,
their host clocks 30 s apart (libfaketime), one SIGKILLed and restarted."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

import pytest
from django.db import connection

from tests.conftest import child_env
from tests.support import expire_leases
from tests.support.processes import Proc
from tests.support.waiting import wait_for
from zeroloss.ledger.models import Message
from zeroloss.runtime.schedules.state_rows import read_clock

# PostgreSQL only: SQLite is embedded, so its clock is the host's and every process sharing its
# file shares the host; skewed clocks between hosts are a server database's case.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.once, pytest.mark.postgres_only]

EVERY = 2


def db_now() -> dt.datetime:
    return read_clock(connection.alias)[0]


def wait_db_clock(until: dt.datetime, procs: list[Proc]) -> None:
    def reached() -> bool:
        for proc in procs:
            assert proc.popen.poll() is None, proc.text[-3000:]
        return db_now() >= until

    wait_for(f"the database clock at {until}", reached, 60, interval=0.1)


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
    from tests.support.debian import ensure_debian_package

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
        # Every tick of the window handled (later ticks may still be arriving).
        ticks = Message.objects.filter(
            message_id__startswith="tick@", message_id__lte=f"tick@{end.isoformat()}"
        )
        wait_for(
            lambda: str(
                [p.text[-2000:] for p in procs]
                + list(ticks.exclude(status="completed").values("message_id", "status"))
            ),
            lambda: not ticks.exclude(status="completed").exists(),
            30,
            interval=0.1,
        )
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

    from tests.infra.pgcluster import PgCluster

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

        def wait_clock(instant: dt.datetime) -> None:
            def reached() -> bool:
                assert all(p.popen.poll() is None for p in procs)
                return now() >= instant

            wait_for(f"the database clock at {instant}", reached, 60, interval=0.1)

        start = now()
        wait_clock(start + dt.timedelta(seconds=4))
        cluster.restart_primary()  # every session of both workers is cut
        end = now() + dt.timedelta(seconds=6)
        wait_clock(end)
        for proc in procs:  # the restart was an outage they rode out, not a blip they missed
            proc.wait_for("reachable again after", timeout=30)
        wait_for(
            "the ticks of the window completed",
            lambda: (
                not one(
                    "SELECT count(*) FROM zeroloss_message WHERE message_id LIKE 'tick@%%' "
                    "AND status <> 'completed' AND message_id <= %s",
                    [f"tick@{end.isoformat()}"],
                )
            ),
            30,
            interval=0.1,
        )
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


#: One interval schedule per catch-up policy, run together so that one 60 s stop serves all three.
CATCH_UP_SCHEDULES: dict[str, dict[str, Any]] = {
    "cu-latest": {"queue": "demo.record_tx", "every": 10, "catch_up": "latest"},
    "cu-all": {"queue": "demo.record_tx", "every": 10, "catch_up": "all", "max_catch_up": 3},
    "cu-none": {"queue": "demo.record_tx", "every": 20, "catch_up": "none"},
}
CYCLE = 20  # every interval above divides it, and so does the 60 s stop
#: Seconds into a cycle at which the schedulers die, and so (60 s later) come back: more than
#: ON_TIME_WINDOW after cu-none's tick (phase 0), and a worker's start-up (a few seconds) before
#: the next tick of any schedule (phase 20): the ticks due at the restart are fixed.
KILL_PHASE = 10.5


def catch_up_worker(name: str) -> Proc:
    settings = {"SCHEDULE_INTERVAL": 0.5, "SCHEDULES": CATCH_UP_SCHEDULES}
    env = child_env(ZEROLOSS_LOG_LEVEL="INFO", ZEROLOSS_SETTINGS_JSON=json.dumps(settings), PGAPPNAME=name)
    args = [sys.executable, "manage.py", "zeroloss_worker", "--queue", "demo.record_tx", "--no-listen"]
    proc = Proc(args, env)
    proc.wait_for("zeroloss_worker: queues")
    return proc


def tick_times(name: str) -> list[dt.datetime]:
    ids = Message.objects.filter(message_id__startswith=f"{name}@").values_list("message_id", flat=True)
    return sorted(dt.datetime.fromisoformat(i.split("@", 1)[1]) for i in ids)


def multiples(every: int, after: dt.datetime, until: dt.datetime) -> list[dt.datetime]:
    """The ticks of an ``every`` schedule in ``(after, until]``."""
    first = (int(after.timestamp()) // every + 1) * every
    last = int(until.timestamp()) // every * every
    return [dt.datetime.fromtimestamp(t, dt.UTC) for t in range(first, last + 1, every)]


def test_catch_up_policies_after_every_scheduler_stopped_for_60_s(db):
    """Two workers schedule three interval schedules (latest / all with ``max_catch_up`` / none);
    both are SIGKILLed; once the database clock is 60 s further, one worker restarts: its first
    round sends, per policy, exactly the documented ticks of those missed, each once."""
    from zeroloss.runtime.schedules.scheduler import ON_TIME_WINDOW

    procs: list[Proc] = []
    try:
        procs = [catch_up_worker(f"catchup-{n}") for n in range(2)]

        def phase(instant: dt.datetime) -> float:
            return instant.timestamp() % CYCLE

        # Every schedule has sent a tick (its state row exists: catch-up starts from it), then
        # the workers die KILL_PHASE into a cycle.

        def all_sent_so_far(now: dt.datetime) -> bool:
            for name, spec in CATCH_UP_SCHEDULES.items():
                ticks = tick_times(name)
                latest = int(now.timestamp()) // spec["every"] * spec["every"]
                if not ticks or ticks[-1].timestamp() != latest:
                    return False
            return True

        def kill_moment() -> bool:
            assert all(p.popen.poll() is None for p in procs), [p.text[-2000:] for p in procs]
            now = db_now()
            return KILL_PHASE <= phase(now) < KILL_PHASE + 1 and all_sent_so_far(now)

        wait_for(lambda: str([p.text[-2000:] for p in procs]), kill_moment, 2 * CYCLE + 10, interval=0.05)
        for proc in procs:
            proc.sigkill_group()  # returns once their sessions are gone: nothing more can commit
        stopped = db_now()
        before = {name: tick_times(name) for name in CATCH_UP_SCHEDULES}
        # The one long wait of the test: no scheduler runs while the database clock moves 60 s.
        wait_for(
            "the database clock 60 s on", lambda: db_now() >= stopped + dt.timedelta(seconds=60), 75, 0.1
        )
        restarted_at = db_now()
        procs.append(catch_up_worker("catchup-restarted"))

        def caught_up() -> list[Message]:
            return list(
                Message.objects.filter(message_id__startswith="cu-", created_at__gt=stopped).order_by(
                    "created_at"
                )
            )

        wait_for(
            lambda: procs[-1].text[-3000:],
            lambda: (done := caught_up()) and all(m.status == "completed" for m in done),
            30,
            interval=0.1,
        )
        first_round = caught_up()[0].created_at  # the restarted worker's first round
    finally:
        for proc in procs:
            proc.terminate()
    after = {name: tick_times(name) for name in CATCH_UP_SCHEDULES}
    # No scheduler ran from `stopped` to the restarted worker's first round: every tick in
    # between was missed.
    missed = {
        name: multiples(spec["every"], stopped, first_round) for name, spec in CATCH_UP_SCHEDULES.items()
    }
    new = {name: [t for t in after[name] if stopped < t <= first_round] for name in after}
    timeline = {"stopped": stopped, "restarted": restarted_at, "first_round": first_round, "new": new}
    for name in CATCH_UP_SCHEDULES:
        assert [t for t in after[name] if t <= stopped] == before[name]  # the earlier ticks untouched
    # At least a minute of ticks missed (more when the restarted worker's first round came late
    # on a loaded machine: the expectations below follow the ticks actually missed).
    assert [len(missed[n]) >= k for n, k in zip(CATCH_UP_SCHEDULES, [6, 6, 3], strict=True)] == [True] * 3, (
        timeline
    )
    # latest: the most recent missed tick, once; all: the most recent max_catch_up (3) of them,
    # each once; none: not one of the missed ticks found more than ON_TIME_WINDOW late (the
    # newest, if the first round came within the window of it, is on time and sent).
    assert new["cu-latest"] == missed["cu-latest"][-1:], timeline
    assert new["cu-all"] == missed["cu-all"][-3:], timeline
    late = (first_round - missed["cu-none"][-1]).total_seconds() > ON_TIME_WINDOW
    assert new["cu-none"] == ([] if late else missed["cu-none"][-1:]), timeline
    from project.demo.models import HandledRecord

    ids = [f"{name}@{t.isoformat()}" for name, ticks in new.items() for t in ticks]
    handled = list(HandledRecord.objects.filter(message_id__in=ids).values_list("message_id", flat=True))
    assert sorted(handled) == sorted(ids)  # each handled once
    print(
        f"\ncatch-up after a {(restarted_at - stopped).total_seconds():.1f}s stop of every scheduler: "
        f"missed {[len(missed[n]) for n in CATCH_UP_SCHEDULES]} (latest, all, none), "
        f"sent in the first round after it: {ids}"
    )


def test_a_disable_after_an_edit_from_a_host_an_hour_ahead_is_seen_within_one_round(db):
    # One schedule edited by a host whose clock is an hour ahead (libfaketime), then another
    # disabled from this host: the next round of a running scheduler sees both, and the disabled
    # one sends nothing more.
    import subprocess

    from tests.support.debian import ensure_debian_package
    from zeroloss.runtime.schedules.models import Schedule
    from zeroloss.runtime.schedules.scheduler import Scheduler

    ensure_debian_package("faketime", ["faketime"])
    Schedule.objects.create(name="edited", queue="demo.record_tx", cron="0 3 * * *", payload={})
    row = Schedule.objects.create(name="disabled", queue="demo.record_tx", every=1, payload={})
    scheduler = Scheduler()
    scheduler.run_once()
    assert {"edited", "disabled"} <= set(scheduler.specs)
    edit = (
        "from zeroloss.runtime.schedules.models import Schedule; "
        "row = Schedule.objects.get(name='edited'); row.payload = {'edited': True}; row.save()"
    )
    subprocess.run(
        ["faketime", "-f", "+1h", sys.executable, "manage.py", "shell", "-c", edit],
        env=child_env(FAKETIME_DONT_FAKE_MONOTONIC="1"),
        check=True,
        timeout=120,
        capture_output=True,
    )
    edited = Schedule.objects.get(name="edited")
    assert edited.payload == {"edited": True} and edited.updated_at > db_now() + dt.timedelta(minutes=50)
    scheduler.run_once()
    assert scheduler.specs["edited"].payload == {"edited": True}  # the edit itself is seen
    row.enabled = False
    row.save(update_fields=["enabled", "updated_at"])  # the admin's Disable, from a correct clock
    scheduler.run_once()
    assert "disabled" not in scheduler.specs
    before = Message.objects.filter(message_id__startswith="disabled@").count()
    wait_db_clock(db_now() + dt.timedelta(seconds=2.5), [])
    assert scheduler.run_once().sent == []
    assert Message.objects.filter(message_id__startswith="disabled@").count() == before


def test_a_scheduler_frozen_inside_its_round_holds_the_others_back_only_until_ack_timeout(db, settings):
    # A real `zeroloss_schedule --loop` is held inside its round's transaction — its schedule's
    # state row locked, its insert of the tick's message waiting for this session's uncommitted
    # insert of that id — and SIGSTOPped there. This session rolls back: the frozen scheduler's
    # insert completes on the server and its session sits idle in its transaction, the row
    # locked. Another scheduler's round (this process's) waits for the row until the server ends
    # that transaction, ACK_TIMEOUT after it went idle, then sends the ticks, each once.
    import contextlib
    import os
    import signal
    import threading
    import time

    from django.db import transaction

    from zeroloss.conf import get_settings
    from zeroloss.ledger.service import ZeroLossMessageService
    from zeroloss.runtime.schedules.scheduler import Scheduler
    from zeroloss.runtime.schedules.spec import tick_message_id

    entry = {"queue": "demo.record", "every": EVERY, "catch_up": "all"}
    settings.ZEROLOSS = {**settings.ZEROLOSS, "SCHEDULES": {"fz": entry}}
    env = child_env(
        ZEROLOSS_LOG_LEVEL="INFO",
        ZEROLOSS_SETTINGS_JSON=json.dumps({"SCHEDULE_INTERVAL": 0.2, "SCHEDULES": {"fz": entry}}),
        PGAPPNAME="zl-frozen-scheduler",
    )
    frozen = Proc([sys.executable, "manage.py", "zeroloss_schedule", "--loop"], env)
    ack_timeout = get_settings().ACK_TIMEOUT
    try:
        frozen.wait_for("zeroloss_schedule: a round every")
        wait_for("the schedule started", lambda: _started("fz"), 60, interval=0.1)
        # The tick after the next one: far enough ahead for this session's insert to come first.
        now = db_now()
        tick = dt.datetime.fromtimestamp((int(now.timestamp()) // EVERY + 2) * EVERY, tz=dt.UTC)
        blocker = tick_message_id("fz", tick)
        with transaction.atomic():
            ZeroLossMessageService().persist_message(blocker, "demo.record", {})
            wait_for(
                "the scheduler waiting on this session's insert",
                lambda: _waits_on_lock("zl-frozen-scheduler"),
                30,
                interval=0.05,
            )
            os.killpg(frozen.popen.pid, signal.SIGSTOP)
            transaction.set_rollback(True)
        released = time.monotonic()
        done: list[float] = []
        sent: list[str] = []

        def round_() -> None:
            try:
                sent.extend(Scheduler().run_once().sent)
                done.append(time.monotonic() - released)
            finally:
                connection.close()

        runner = threading.Thread(target=round_, daemon=True)
        runner.start()
        runner.join(ack_timeout + 20)
        assert done, f"the other scheduler's round still waits {ack_timeout + 20:g} s after the freeze"
        print(
            f"scheduler frozen in its round: another's round returned {done[0]:.2f} s later (ACK_TIMEOUT {ack_timeout:g} s)"
        )
        assert done[0] < ack_timeout + 3, done
        assert blocker in sent  # the frozen one's insert went with its transaction
        assert Message.objects.filter(message_id=blocker).count() == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(frozen.popen.pid, signal.SIGCONT)
        frozen.terminate()


def _started(name: str) -> bool:
    from zeroloss.runtime.schedules.models import ScheduleState

    return ScheduleState.objects.filter(name=name, last_tick__isnull=False).exists()


def _waits_on_lock(app_name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            [app_name],
        )
        return bool(cursor.fetchone()[0])
