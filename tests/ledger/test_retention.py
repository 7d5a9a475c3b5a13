"""Retention without cron (issue 49, docs/settings.md#retention): ``RETENTION`` and each queue's
own, validated by ``check``; applied by the workers' maintenance one process at a time across
the deployment (a turn by the database clock), audited as a purge; whole periods dropped on a
partitioned ledger, batched deletes elsewhere. Ages are made by moving the rows' timestamps into
the past by the database clock, never waited for."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.checks import run_checks
from django.db import connection

import zeroloss
from tests.conftest import child_env, database_url
from tests.support import backdate
from tests.support.cli import run
from tests.support.processes import Proc, db_worker
from tests.support.waiting import wait_for
from zeroloss.conf import get_settings
from zeroloss.ledger import partitions
from zeroloss.ledger.models import MaintenanceTurn, Message, PurgeRecord
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.runtime import retention

pytestmark = [pytest.mark.django_db(transaction=True)]

HOUR = 3600
QUEUE = "demo.record"
OTHER = "demo.other"
#: Completed and cancelled kept an hour, dead letters two, QUEUE's completed three.
SETTINGS = {
    "RETENTION": {"completed": "1h", "cancelled": 3600, "dead": "2h"},
    "QUEUES": {QUEUE: {"retention": {"completed": "3h"}}},
}


@pytest.fixture
def retained(settings: Any) -> None:
    settings.ZEROLOSS = {**settings.ZEROLOSS, **SETTINGS}
    MaintenanceTurn.objects.all().delete()  # a turn another test's sweep took


def finished(service: ZeroLossMessageService) -> dict[str, tuple[str, str, float | None]]:
    """A message of each kind: ``id: (queue, status it ends in, hours ago it finished)``."""
    plan: dict[str, tuple[str, str, float | None]] = {
        "q-done-2h": (QUEUE, "completed", 2),  # kept: QUEUE keeps completed messages 3 h
        "q-done-4h": (QUEUE, "completed", 4),
        "done-2h": (OTHER, "completed", 2),
        "done-now": (OTHER, "completed", None),
        "dead-1.5h": (OTHER, "dead", 1.5),  # kept: dead letters 2 h
        "dead-3h": (OTHER, "dead", 3),
        "cancelled-2h": (OTHER, "cancelled", 2),
        "pending": (OTHER, "pending", None),
        "processing": (OTHER, "processing", None),
    }
    for mid, (queue, status, _) in plan.items():
        service.persist_message(mid, queue, {"n": mid})
        if status in ("completed", "processing"):
            lease = service.claim_message(mid)
            assert lease is not None
            if status == "completed":
                assert service.acknowledge(mid, lease.token)
        elif status == "dead":
            service.dead_letter_messages([mid], reason="poison")
        elif status == "cancelled":
            zeroloss.cancel(mid)
    for mid, (_, status, hours) in plan.items():
        if hours is not None:
            stamp = {"completed": "completed_at", "dead": "dead_at", "cancelled": "updated_at"}[status]
            assert backdate([mid], stamp, seconds_ago=hours * HOUR) == 1
    return plan


REMOVED = {"q-done-4h", "done-2h", "dead-3h", "cancelled-2h"}


def verify(*, stuck: bool = False) -> None:
    """The conservation check balances, every purged message counted (``stuck``: the lease the
    setup took of ``processing`` may have run out meanwhile, a warning of its own)."""
    result = run("zeroloss_verify", "--json")
    report = json.loads(result.out)
    assert report["conservation"]["balanced"], result.out
    if stuck:
        assert set(report["issue_counts"]) <= {"stuck"}, result.out
    else:
        assert result.code == 0 and report["status"] == "ok", result.out


def test_retention_is_validated_by_check_with_messages_that_say_what_to_fix(settings: Any) -> None:
    cases = {
        "RETENTION": ({"pending": "1d"}, "unknown status 'pending'"),
        "RETENTION ": ({"completed": "1w"}, "a text like 90s, 15m, 2h, 7d"),
        "RETENTION  ": ([7], "must be a dict of status -> duration"),
        "QUEUES": ({"q": {"retention": {"dead": -1}}}, "must be a duration more than 0"),
    }
    for key, (value, says) in cases.items():
        settings.ZEROLOSS = {key.strip(): value}
        errors = [m for m in run_checks() if m.id == "zeroloss.E008"]
        assert len(errors) == 1 and says in errors[0].msg, (key, errors)
    settings.ZEROLOSS = {
        "RETENTION": {"completed": dt.timedelta(days=2), "dead": None},
        "QUEUES": {"q": {"retention": {"cancelled": 60}}},
    }
    assert not [m for m in run_checks() if (m.id or "").startswith("zeroloss.E")]
    cfg = get_settings()
    assert cfg.retention_of() == {"completed": 2 * 86400.0, "cancelled": 7 * 86400.0, "dead": None}
    assert cfg.retention_of("q") == {"completed": 2 * 86400.0, "cancelled": 60.0, "dead": None}
    # The defaults a new project gets; the older settings, when a project set them, still count.
    settings.ZEROLOSS = {}
    assert get_settings().RETENTION == {
        "completed": 7 * 86400.0,
        "cancelled": 7 * 86400.0,
        "dead": 30 * 86400.0,
    }
    settings.ZEROLOSS = {"COMPLETED_RETENTION": 86400, "DEAD_LETTER_RETENTION": None}
    assert get_settings().RETENTION == {"completed": 86400.0, "cancelled": 7 * 86400.0, "dead": None}


def test_a_turn_removes_what_is_past_its_retention_audited_as_a_purge(retained: None) -> None:
    service = ZeroLossMessageService(instance_id="maint")
    plan = finished(service)
    removed = retention.run_turn(service)
    assert removed == {"completed": 2, "cancelled": 1, "dead": 1}
    assert set(Message.objects.values_list("message_id", flat=True)) == set(plan) - REMOVED
    records = sorted(PurgeRecord.objects.values_list("queue_name", "status", "count", "actor"))
    assert records == [
        (OTHER, "cancelled", 1, "retention@maint"),
        (OTHER, "completed", 1, "retention@maint"),
        (OTHER, "dead", 1, "retention@maint"),
        (QUEUE, "completed", 1, "retention@maint"),
    ]
    verify()
    # One turn at a time, at most every RETENTION_EVERY across the deployment.
    assert retention.run_turn(ZeroLossMessageService(instance_id="other")) is None
    turn = MaintenanceTurn.objects.get()
    assert turn.name == "retention" and turn.holder.startswith("maint/")
    assert (
        dt.timedelta(seconds=retention.RETENTION_EVERY - 60)
        < turn.due_at - partitions_now()
        <= dt.timedelta(seconds=retention.RETENTION_EVERY)
    )


def partitions_now() -> dt.datetime:
    return partitions.database_now(connection) if connection.vendor == "postgresql" else _sqlite_now()


def _sqlite_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        return dt.datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=dt.UTC)


def test_a_turn_held_by_a_process_gone_mid_way_is_taken_once_it_runs_out(retained: None) -> None:
    service = ZeroLossMessageService(instance_id="gone")
    assert retention.take_turn(service, "gone/1", hold=60)
    assert not retention.take_turn(service, "next/1")
    MaintenanceTurn.objects.update(due_at=partitions_now() - dt.timedelta(seconds=1))
    assert retention.take_turn(service, "next/1")
    assert MaintenanceTurn.objects.get().holder == "next/1"


@pytest.mark.postgres_only
def test_whole_periods_go_when_every_message_is_past_retention_and_none_holding_one_within(
    retained: None,
) -> None:
    day = partitions.period_start(partitions.database_now(connection), 86400)
    start = day - dt.timedelta(days=12)
    partitions.create_partitions(connection, start, day - dt.timedelta(days=7), 86400)
    service = ZeroLossMessageService(instance_id="maint")
    for mid in ("old-a", "old-b", "old-dead", "old-live", "recent-dead"):
        service.persist_message(mid, OTHER, {"n": mid})
    for mid in ("old-a", "old-b"):
        lease = service.claim_message(mid)
        assert lease is not None and service.acknowledge(mid, lease.token)
    service.dead_letter_messages(["old-dead", "recent-dead"], reason="poison")
    days = {"old-a": 11, "old-b": 11, "old-dead": 10, "old-live": 9, "recent-dead": 8}
    with connection.cursor() as cursor:
        for mid, ago in days.items():
            sent = day - dt.timedelta(days=ago) + dt.timedelta(hours=12)
            done = sent + dt.timedelta(hours=1)
            cursor.execute(
                "UPDATE zeroloss_messageevent SET message_created_at = %s, created_at = %s WHERE message_id = "
                "(SELECT id FROM zeroloss_message WHERE message_id = %s)",
                [sent, sent, mid],
            )
            cursor.execute(
                "UPDATE zeroloss_message SET created_at = %s, updated_at = %s, completed_at = CASE WHEN "
                "completed_at IS NULL THEN NULL ELSE %s END, dead_at = CASE WHEN dead_at IS NULL THEN NULL "
                "ELSE %s END WHERE message_id = %s",
                [sent, done, done, done, mid],
            )
            cursor.execute(
                "UPDATE zeroloss_message_key SET created_at = %s WHERE message_id = %s", [sent, mid]
            )
        # a dead letter of a day dropped whole, but within its retention: its day stays
        cursor.execute(
            "UPDATE zeroloss_message SET dead_at = statement_timestamp() WHERE message_id = 'recent-dead'"
        )
    before = {p.name for p in partitions.partitions(connection)}
    assert retention.run_turn(service) == {"completed": 2, "cancelled": 0, "dead": 1}
    gone = before - {p.name for p in partitions.partitions(connection)}
    named = {f"zeroloss_message_p{day - dt.timedelta(days=d):%Y%m%d}" for d in (12, 11, 10)}
    yesterday = f"zeroloss_message_p{day - dt.timedelta(days=1):%Y%m%d}"  # migrate's, empty
    # the empty day, the completed day, the old dead letter's; not the live ones'. Yesterday's
    # empty period (migrate's) ends at midnight: it goes once midnight is past the retention
    # cut-off, so in the first hours of the day it may still be kept.
    assert gone - {yesterday} == named
    if partitions.database_now(connection) - day > dt.timedelta(hours=3):
        assert gone == named | ({yesterday} & before)
    assert set(Message.objects.values_list("message_id", flat=True)) == {"old-live", "recent-dead"}
    assert sorted(PurgeRecord.objects.values_list("status", "count", "actor")) == [
        ("completed", 2, "retention@maint"),
        ("dead", 1, "retention@maint"),
    ]
    verify()


@pytest.mark.process
def test_workers_apply_retention_one_at_a_time_while_they_work(retained: None) -> None:
    service = ZeroLossMessageService(instance_id="setup")
    plan = finished(service)
    env = {"ZEROLOSS_SETTINGS_JSON": json.dumps(SETTINGS)}
    workers = [db_worker("--queue", QUEUE, "--poll-interval", "0.1", **env) for _ in range(2)]
    try:
        for worker in workers:
            worker.wait_for("zeroloss_worker: queues")
        for n in range(5):
            zeroloss.send(QUEUE, {"n": n}, message_id=f"new{n}")
        wait_for(
            lambda: (
                f"retention by the workers: left {sorted(Message.objects.values_list('message_id', flat=True))}"
            ),
            lambda: not Message.objects.filter(message_id__in=REMOVED).exists(),
            90,
        )
        wait_for(
            "the new messages processed",
            lambda: Message.objects.filter(message_id__startswith="new", status="completed").count() == 5,
            90,
        )
    finally:
        codes = [worker.terminate() for worker in workers]
    assert codes == [0, 0], [worker.text[-3000:] for worker in workers]
    assert set(Message.objects.values_list("message_id", flat=True)) == (set(plan) - REMOVED) | {
        f"new{n}" for n in range(5)
    }
    actors = set(PurgeRecord.objects.values_list("actor", flat=True))
    assert len(actors) == 1 and actors.pop().startswith("retention@"), actors  # one turn, one process
    assert sum(PurgeRecord.objects.values_list("count", flat=True)) == len(REMOVED)
    verify(stuck=True)


@pytest.fixture
def unpartitioned_ledger(transactional_db: None) -> Iterator[str]:
    """A private PostgreSQL ledger 0.2 created and ``migrate`` upgraded: unpartitioned."""
    assert connection.vendor == "postgresql"  # 0.2's unpartitioned layout (postgres_only)
    name = f"{connection.settings_dict['NAME']}_retention"
    server = database_url().rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{server}/{name}"
    try:
        from tests.support.cli import manage

        env = child_env(DATABASE_URL=url)
        first = manage(env, "migrate", "zeroloss", "0009", "-v", "0", timeout=180)
        assert first.returncode == 0, first.stderr
        # a row: migrate leaves a populated table as it is (unpartitioned)
        seeded = Proc(
            [
                *_python(),
                "manage.py",
                "shell",
                "-c",
                "import zeroloss; zeroloss.send('demo.record', {}, message_id='seed')",
            ],
            env,
        )
        assert seeded.wait(120) == 0, seeded.text
        rest = manage(env, "migrate", "-v", "0", timeout=180)
        assert rest.returncode == 0, rest.stderr
        yield url
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.process
@pytest.mark.postgres_only
def test_workers_apply_retention_to_an_unpartitioned_ledger_in_batches(unpartitioned_ledger: str) -> None:
    url = unpartitioned_ledger
    setup = (
        "import zeroloss\n"
        "from zeroloss.ledger.service import ZeroLossMessageService\n"
        "s = ZeroLossMessageService(instance_id='setup')\n"
        "for mid in ('old', 'recent', 'live'):\n"
        "    s.persist_message(mid, 'demo.other', {})\n"
        "for mid in ('old', 'recent'):\n"
        "    lease = s.claim_message(mid); assert s.acknowledge(mid, lease.token)\n"
    )
    env = child_env(DATABASE_URL=url, ZEROLOSS_SETTINGS_JSON=json.dumps(SETTINGS))
    made = Proc([*_python(), "manage.py", "shell", "-c", setup], env)
    assert made.wait(120) == 0, made.text
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'zeroloss_message'::regclass)"
        ).fetchone() == (False,)
        conn.execute(
            "UPDATE zeroloss_message SET completed_at = statement_timestamp() - interval '2 hours' "
            "WHERE message_id = 'old'"
        )
    worker = Proc(
        [*_python(), "manage.py", "zeroloss_worker", "--queue", QUEUE], {**env, "ZEROLOSS_LOG_LEVEL": "INFO"}
    )
    try:
        worker.wait_for("zeroloss_worker: queues")

        def left() -> set[str]:
            with psycopg.connect(url, autocommit=True) as conn:
                return {r[0] for r in conn.execute("SELECT message_id FROM zeroloss_message").fetchall()}

        wait_for(
            lambda: f"retention on the unpartitioned ledger: left {left()}",
            lambda: left() == {"recent", "live", "seed"},
            90,
        )
    finally:
        assert worker.terminate() == 0, worker.text[-3000:]
    with psycopg.connect(url, autocommit=True) as conn:
        records = conn.execute("SELECT status, count, actor FROM zeroloss_purgerecord").fetchall()
    assert len(records) == 1 and records[0][:2] == ("completed", 1) and records[0][2].startswith("retention@")


def _python() -> list[str]:
    import sys

    return [sys.executable]


def test_a_turn_cut_off_by_its_time_leaves_the_rest_to_the_next_turn_due_at_once(
    retained: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = ZeroLossMessageService(instance_id="maint")
    done = [f"d{i}" for i in range(5)]
    for mid in done:
        service.persist_message(mid, OTHER, {"n": mid})
        lease = service.claim_message(mid)
        assert lease is not None and service.acknowledge(mid, lease.token)
    assert backdate(done, "completed_at", seconds_ago=2 * HOUR) == 5
    # A deadline already past: one batch, then the turn ends, due again at once.
    assert service.apply_retention(batch_size=2, deadline=0.0)["completed"] == 2
    monkeypatch.setattr(retention, "RUN_FOR", 0.0)
    first = retention.run_turn(service)
    assert first is not None and first["completed"] >= 1
    second = retention.run_turn(ZeroLossMessageService(instance_id="next"))  # due at once
    assert second is not None
    assert not Message.objects.exists()
    assert sum(PurgeRecord.objects.values_list("count", flat=True)) == 5


@pytest.mark.process
def test_a_one_shot_sweep_runs_the_turn_it_took_before_it_exits(retained: None) -> None:
    service = ZeroLossMessageService(instance_id="setup")
    service.persist_message("old", OTHER, {})
    lease = service.claim_message("old")
    assert lease is not None and service.acknowledge("old", lease.token)
    assert backdate(["old"], "completed_at", seconds_ago=2 * HOUR) == 1
    env = child_env(ZEROLOSS_SETTINGS_JSON=json.dumps(SETTINGS))
    swept = Proc([*_python(), "manage.py", "zeroloss_sweep"], env)
    assert swept.wait(120) == 0, swept.text
    assert not Message.objects.exists()
    assert [r.actor.startswith("retention@") for r in PurgeRecord.objects.all()] == [True]
