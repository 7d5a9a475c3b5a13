"""Schedules: ticks and DST (an injected clock), catch-up, overlap, bad input, the command."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import CommandError

from zeroloss import checks
from zeroloss.models import Message
from zeroloss.schedules.models import Schedule, ScheduleState
from zeroloss.schedules.scheduler import ON_TIME_WINDOW, Scheduler
from zeroloss.schedules.spec import ScheduleError, parse_schedule, tick_message_id
from zeroloss.schedules.ticks import latest_ticks, next_ticks

UTC = dt.UTC


def at(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


class Clock:
    """The injected clock: the scheduler reads it instead of the database's."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def schedules(settings, **entries):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "SCHEDULES": entries}


def tick_ids(name: str) -> list[str]:
    return sorted(
        Message.objects.filter(message_id__startswith=f"{name}@").values_list("message_id", flat=True)
    )


# -- ticks ------------------------------------------------------------------------------------


def test_every_ticks_at_multiples_of_the_interval_since_the_epoch():
    spec = parse_schedule("hb", {"queue": "demo.record", "every": 30}, check_targets=False)
    assert next_ticks(spec, at(2026, 12, 2, 10, 0, 7), 3) == [
        at(2026, 12, 2, 10, 0, 30),
        at(2026, 12, 2, 10, 1, 0),
        at(2026, 12, 2, 10, 1, 30),
    ]
    assert latest_ticks(spec, at(2026, 12, 2, 10, 0, 0), at(2026, 12, 2, 10, 1, 0), 10) == [
        at(2026, 12, 2, 10, 0, 30),
        at(2026, 12, 2, 10, 1, 0),
    ]
    assert tick_message_id("hb", at(2026, 12, 2, 2, 0)) == "hb@2026-12-02T02:00:00+00:00"


@pytest.mark.parametrize(
    ("day", "expected_utc"),
    [
        # Spring forward (02:00 CET -> 03:00 CEST): 02:30 does not exist; fires once, at 03:00 CEST.
        ((2026, 3, 29), at(2026, 3, 29, 1, 0)),
        # Fall back (03:00 CEST -> 02:00 CET): 02:30 happens twice; fires once, the first (CEST).
        ((2026, 10, 25), at(2026, 10, 25, 0, 30)),
    ],
)
def test_a_daily_0230_in_berlin_runs_once_on_dst_days(day, expected_utc):
    spec = parse_schedule(
        "nightly",
        {"queue": "demo.record", "cron": "30 2 * * *", "timezone": "Europe/Berlin"},
        check_targets=False,
    )
    year, month, date = day
    midnight_before = dt.datetime(year, month, date, tzinfo=spec.tz) - dt.timedelta(hours=1)
    end_of_day = dt.datetime(year, month, date, 23, 59, tzinfo=spec.tz)
    assert latest_ticks(spec, midnight_before, end_of_day, 10) == [expected_utc]
    # Each neighbouring day once too: three days, three ticks.
    assert (
        len(latest_ticks(spec, midnight_before - dt.timedelta(days=1), end_of_day + dt.timedelta(days=1), 10))
        == 3
    )


def test_dst_days_through_the_scheduler_with_an_injected_clock(settings, db):
    schedules(settings, nightly={"queue": "demo.record", "cron": "30 2 * * *", "timezone": "Europe/Berlin"})
    expected = {
        # 03:00 CEST: the skipped 02:30, then 02:30 CEST.
        at(2026, 3, 28, 12): ["2026-03-29T01:00:00", "2026-03-30T00:30:00", "2026-03-31T00:30:00"],
        # The first 02:30 (CEST), not the second (CET); then 02:30 CET.
        at(2026, 10, 24, 12): ["2026-10-25T00:30:00", "2026-10-26T01:30:00", "2026-10-27T01:30:00"],
    }
    for start, ticks in expected.items():
        ScheduleState.objects.all().delete()  # a new schedule each time: no catch-up across runs
        Message.objects.all().delete()
        clock = Clock(start)
        scheduler = Scheduler(clock=clock)
        scheduler.run_once()
        for _ in range(3 * 24 * 4):  # three days in 15-minute rounds
            clock.advance(900)
            scheduler.run_once()
        assert tick_ids("nightly") == [f"nightly@{t}+00:00" for t in ticks]


# -- a round --------------------------------------------------------------------------------


def test_a_tick_is_sent_once_by_any_number_of_schedulers(settings, db):
    schedules(settings, hb={"queue": "demo.record", "every": 2, "payload": {"kind": "hb"}})
    clock = Clock(at(2026, 12, 2, 10, 0, 0, 500000))
    many = [Scheduler(clock=clock) for _ in range(3)]
    for _ in range(5):
        for scheduler in many:
            scheduler.run_once()
        clock.advance(1)
    assert tick_ids("hb") == [f"hb@2026-12-02T10:00:0{s}+00:00" for s in (0, 2, 4)]
    message = Message.objects.get(message_id="hb@2026-12-02T10:00:02+00:00")
    assert (message.queue_name, message.payload, message.status) == ("demo.record", {"kind": "hb"}, "pending")
    state = ScheduleState.objects.get(name="hb")
    assert state.last_tick == state.last_sent == at(2026, 12, 2, 10, 0, 4)


def test_a_round_with_nothing_due_is_one_query(settings, db, django_assert_num_queries):
    schedules(settings, hb={"queue": "demo.record", "every": 60})
    clock = Clock(at(2026, 12, 2, 10, 0, 1))
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    clock.advance(1)
    with django_assert_num_queries(1):
        report = scheduler.run_once()
    assert report.due == 0 and report.sent == []


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("latest", ["10:02:00"]),
        ("all", ["10:01:30", "10:02:00"]),  # of the four missed, bounded by max_catch_up=2
        ("none", []),  # 10:02:00 is found 15 s late: more than ON_TIME_WINDOW
    ],
)
def test_catch_up_after_every_scheduler_stopped(settings, db, policy, expected):
    schedules(settings, c={"queue": "demo.record", "every": 30, "catch_up": policy, "max_catch_up": 2})
    clock = Clock(at(2026, 12, 2, 10, 0, 0, 100000))
    Scheduler(clock=clock).run_once()
    assert tick_ids("c") == ["c@2026-12-02T10:00:00+00:00"]
    clock.advance(135)  # every scheduler down for 2 min 15 s
    Scheduler(clock=clock).run_once()
    assert tick_ids("c") == ["c@2026-12-02T10:00:00+00:00", *[f"c@2026-12-02T{t}+00:00" for t in expected]]
    clock.advance(20)  # and on time again from then on, whatever the policy
    Scheduler(clock=clock).run_once()
    assert tick_ids("c")[-1] == "c@2026-12-02T10:02:30+00:00"


def test_catch_up_none_sends_a_tick_found_within_the_on_time_window(settings, db):
    schedules(settings, c={"queue": "demo.record", "every": 60, "catch_up": "none"})
    clock = Clock(at(2026, 12, 2, 10, 0, 30))
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    clock.now = at(2026, 12, 2, 10, 1) + dt.timedelta(seconds=ON_TIME_WINDOW - 1)
    scheduler.run_once()
    assert tick_ids("c") == ["c@2026-12-02T10:01:00+00:00"]


def test_a_new_schedule_does_not_replay_history(settings, db):
    schedules(settings, n={"queue": "demo.record", "cron": "0 3 * * *", "catch_up": "all"})
    Scheduler(clock=Clock(at(2026, 12, 2, 14))).run_once()
    assert tick_ids("n") == []


def test_overlap_skip_waits_for_the_previous_tick(settings, db, service):
    schedules(settings, o={"queue": "demo.record", "every": 10, "overlap": "skip"})
    clock = Clock(at(2026, 12, 2, 10, 0, 0, 1000))
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    lease = service.claim_message("o@2026-12-02T10:00:00+00:00")
    assert lease
    clock.advance(10)
    report = scheduler.run_once()
    assert report.skipped_overlap == ["o@2026-12-02T10:00:10+00:00"]
    clock.advance(10)
    scheduler.run_once()
    assert tick_ids("o") == ["o@2026-12-02T10:00:00+00:00"]  # still processing: skipped again
    assert service.acknowledge(lease.message_id, lease.token)  # the previous tick is done
    clock.advance(10)
    scheduler.run_once()
    assert tick_ids("o") == ["o@2026-12-02T10:00:00+00:00", "o@2026-12-02T10:00:30+00:00"]


def test_a_task_schedule_enqueues_through_the_task_backend(settings, db):
    schedules(settings, t={"task": "tests.task_functions.echo", "every": 60, "args": [1], "kwargs": {"x": 2}})
    Scheduler(clock=Clock(at(2026, 12, 2, 10, 0, 1))).run_once()
    message = Message.objects.get(message_id="t@2026-12-02T10:00:00+00:00")
    assert message.queue_name == "demo.tasks"
    assert message.priority == -5  # the task's own
    assert message.payload["task"] == "tests.task_functions.echo"
    assert (message.payload["args"], message.payload["kwargs"]) == ([1], {"x": 2})


def test_database_schedules_are_picked_up_within_one_round(settings, db):
    schedules(settings)
    clock = Clock(at(2026, 12, 2, 10, 0, 0, 1000))
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    row = Schedule.objects.create(name="dbs", queue="demo.record", every=5, payload={"a": 1})
    clock.advance(5)
    scheduler.run_once()
    assert tick_ids("dbs") == ["dbs@2026-12-02T10:00:05+00:00"]
    row.enabled = False
    row.save()
    clock.advance(5)
    scheduler.run_once()
    assert tick_ids("dbs") == ["dbs@2026-12-02T10:00:05+00:00"]


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "check_id", "field", "text"),
    [
        ({"queue": "demo.record", "cron": "61 * * * *"}, "zeroloss.E053", "cron", "not a valid cron"),
        ({"queue": "demo.record", "cron": "* * *"}, "zeroloss.E053", "cron", "five fields"),
        (
            {"queue": "demo.record", "every": 5, "timezone": "Mars/Olympus"},
            "zeroloss.E055",
            "timezone",
            "IANA",
        ),
        ({"queue": "demo.record", "every": 0}, "zeroloss.E054", "every", "> 0"),
        ({"queue": "demo.record", "every": -1}, "zeroloss.E054", "every", "> 0"),
        ({"queue": "nope.queue", "every": 5}, "zeroloss.E056", "queue", "no @zeroloss.handler"),
        ({"task": "tests.task_functions.missing", "every": 5}, "zeroloss.E057", "task", "cannot be imported"),
        ({"queue": "demo.record", "every": 5, "cron": "* * * * *"}, "zeroloss.E052", "cron", "not both"),
        ({"queue": "demo.record"}, "zeroloss.E052", "*", "got neither"),
        ({"every": 5}, "zeroloss.E056", "*", "got neither"),
        ({"queue": "demo.record", "every": 5, "catch_up": "some"}, "zeroloss.E058", "catch_up", "one of"),
        ({"queue": "demo.record", "every": 5, "overlap": "no"}, "zeroloss.E058", "overlap", "one of"),
        ({"queue": "demo.record", "every": 5, "evry": 5}, "zeroloss.E051", "evry", "unknown key"),
    ],
)
def test_bad_schedules_are_check_errors_naming_the_schedule_and_field(settings, entry, check_id, field, text):
    schedules(settings, bad=entry, good={"queue": "demo.record", "every": 5})
    [message] = checks.check_schedules()
    with pytest.raises(ScheduleError) as raised:
        parse_schedule("bad", entry)
    exc = raised.value
    assert (exc.name, exc.field, exc.check_id) == ("bad", field, check_id)
    assert text in exc.message
    where = "ZEROLOSS['SCHEDULES']['bad']" + ("" if field == "*" else f"[{field!r}]")
    assert message == Error(
        f"{where}: {exc.message}",
        hint="Every key is described in docs/schedules.md.",
        obj="settings.ZEROLOSS",
        id=check_id,
    )
    with pytest.raises(ScheduleError):
        Scheduler()  # nothing half-applied: no scheduler starts on a bad settings schedule


def test_schedules_that_is_not_a_dict_is_e050(settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "SCHEDULES": ["x"]}
    assert [m.id for m in checks.check_schedules()] == ["zeroloss.E050"]
    settings.ZEROLOSS = {**settings.ZEROLOSS, "SCHEDULES": {"a@b": {"queue": "demo.record", "every": 1}}}
    assert [m.id for m in checks.check_schedules()] == ["zeroloss.E050"]


# -- the command ------------------------------------------------------------------------------


def run(*args):
    import io

    out = io.StringIO()
    call_command("zeroloss_schedule", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_command_lists_previews_and_runs(settings, db):
    schedules(settings, nightly={"queue": "demo.record", "cron": "0 3 * * *", "timezone": "Europe/Berlin"})
    listed = json.loads(run("list", "--json"))
    [row] = listed["schedules"]
    assert (row["name"], row["source"], row["cron"], row["timezone"]) == (
        "nightly",
        "settings",
        "0 3 * * *",
        "Europe/Berlin",
    )
    preview = json.loads(run("preview", "nightly", "--next", "3", "--json"))
    assert len(preview["ticks"]) == 3
    assert all(
        mid.startswith("nightly@") and mid.endswith("T02:00:00+00:00") for mid in preview["message_ids"]
    )
    sent = json.loads(run("run", "nightly", "--json"))["message_id"]
    assert Message.objects.get(message_id=sent).queue_name == "demo.record"
    assert "nightly" in run("list")


def test_the_command_refuses_an_unknown_schedule_with_exit_code_2(settings, db):
    schedules(settings)
    with pytest.raises(CommandError) as raised:
        run("preview", "nope")
    assert raised.value.returncode == 2 and "unknown schedule 'nope'" in str(raised.value)
    with pytest.raises(CommandError) as raised:
        run()
    assert raised.value.returncode == 2


def test_the_celery_beat_task_runs_a_round_on_every_ledger_database(settings, db):
    from zeroloss import tasks
    from zeroloss.schedule import scheduler_beat_entry

    assert scheduler_beat_entry() == {
        "zeroloss-schedule": {
            "task": "zeroloss.schedule",
            "schedule": 1.0,
            "options": {"queue": "zeroloss.sweep"},
        }
    }
    schedules(settings, beat={"queue": "demo.record", "every": 5})
    tasks._schedulers.clear()
    try:
        assert tasks.schedule() == {"sent": 1}  # the current tick: found within the on-time window
        again = tasks.schedule()  # nothing new, unless the next 5 s tick came due meanwhile
    finally:
        tasks._schedulers.clear()
    assert len(tick_ids("beat")) == 1 + again["sent"]


def test_the_worker_command_takes_no_schedule():
    from zeroloss.management.commands.zeroloss_worker import Command

    options = Command().create_parser("manage.py", "zeroloss_worker").parse_args(["--no-schedule"])
    assert options.no_schedule is True


def test_a_tick_the_ledger_refuses_does_not_hold_back_the_others(settings, db, caplog):
    settings.ZEROLOSS = {
        **settings.ZEROLOSS,
        "MAX_PAYLOAD_BYTES": 100,
        "SCHEDULES": {
            "big": {"queue": "demo.record", "every": 5, "payload": {"blob": "x" * 200}},
            "small": {"queue": "demo.record", "every": 5, "payload": {}},
        },
    }
    Scheduler(clock=Clock(at(2026, 12, 2, 10, 0, 0, 1000))).run_once()
    assert tick_ids("small") == ["small@2026-12-02T10:00:00+00:00"]
    assert tick_ids("big") == []
    assert "big@2026-12-02T10:00:00+00:00 refused by the ledger" in caplog.text


def test_the_command_loop_runs_rounds_until_told_to_stop(settings, db):
    schedules(settings, loop={"queue": "demo.record", "every": 5})
    settings.ZEROLOSS = {**settings.ZEROLOSS, "SCHEDULE_INTERVAL": 0.05}  # the rounds, not their pace
    result = json.loads(run("--loop", "--max-rounds", "2", "--json"))
    assert result["rounds"] == 2
    assert result["sent"] == len(tick_ids("loop")) >= 1  # the current tick, found on time
