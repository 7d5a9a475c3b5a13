"""Schedules: ticks and DST (an injected clock), catch-up, overlap, bad input, the command."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.support.waiting import wait_for
from zeroloss.ledger.models import Message
from zeroloss.ops import checks
from zeroloss.runtime.schedules.models import Schedule, ScheduleState
from zeroloss.runtime.schedules.scheduler import ON_TIME_WINDOW, Scheduler
from zeroloss.runtime.schedules.spec import ScheduleError, parse_schedule, tick_message_id
from zeroloss.runtime.schedules.state_rows import read_clock
from zeroloss.runtime.schedules.ticks import latest_ticks, next_ticks

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


LORD_HOWE_NIGHT = [  # 0 */2 * * * around the 30-minute fall-back (02:00 LHDT -> 01:30 LHST)
    at(2026, 4, 4, 11),  # 22:00 LHDT
    at(2026, 4, 4, 13),  # 00:00 LHDT
    at(2026, 4, 4, 15, 30),  # 02:00 LHST: the wall clock reaches 02:00 once, after the repeat
    at(2026, 4, 4, 17, 30),  # 04:00 LHST
    at(2026, 4, 4, 19, 30),  # 06:00 LHST
]


def test_one_walk_decides_which_ticks_are_due_and_which_are_sent_lord_howe():
    spec = parse_schedule(
        "lh",
        {"queue": "demo.record", "cron": "0 */2 * * *", "timezone": "Australia/Lord_Howe"},
        check_targets=False,
    )
    start, end = at(2026, 4, 4, 10), at(2026, 4, 4, 20)
    assert next_ticks(spec, start, 5) == LORD_HOWE_NIGHT
    assert latest_ticks(spec, start, end, 100) == LORD_HOWE_NIGHT
    # Due one after another: each tick the next of the one before.
    assert [next_ticks(spec, t, 1)[0] for t in LORD_HOWE_NIGHT[:-1]] == LORD_HOWE_NIGHT[1:]


#: Zones with whole-hour, 30-minute (Lord Howe) and 45-minute (Chatham) changes, changes at
#: midnight (Havana), southern ones, Casablanca's Ramadan changes, and two without any.
WALK_ZONES = [
    "UTC",
    "Europe/Berlin",
    "Europe/London",
    "America/New_York",
    "America/Havana",
    "America/St_Johns",
    "America/Santiago",
    "Australia/Adelaide",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Pacific/Auckland",
    "Africa/Casablanca",
    "Asia/Kathmandu",
]
WALK_CRONS = [
    "* * * * *",
    "*/15 * * * *",
    "30 * * * *",
    "0 */2 * * *",
    "0 2 * * *",
    "30 2 * * *",
    "0 0 * * *",
    "15 1,2,3 * * *",
    "0 3 * * 0",
    "0 12 1 * *",
    "*/30 1-3 * * *",
    "45 23 * * *",
    "0 0 1 1 *",
]


def offset_changes(zone: str, year: int) -> list[dt.datetime]:
    """Every change of the zone's UTC offset during ``year`` (to the hour after it)."""
    import zoneinfo

    tz = zoneinfo.ZoneInfo(zone)
    hour = dt.timedelta(hours=1)
    instant, end = at(year, 1, 1), at(year + 1, 1, 1)
    changes = []
    while instant < end:
        if (instant + hour).astimezone(tz).utcoffset() != instant.astimezone(tz).utcoffset():
            changes.append(instant + hour)
        instant += hour
    return changes


def due_one_after_another(spec, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The due walk: each tick the next after the one before, as the scheduler finds them due."""
    due = []
    while (tick := next_ticks(spec, start, 1)) and tick[0] <= end:
        due.append(tick[0])
        start = tick[0]
    return due


def test_the_due_walk_and_the_sent_walk_agree_over_a_year_of_13_zones_and_13_crons():
    # Away from a change of offset a zone is a fixed offset and both walks read the same wall
    # clock: they can disagree only around a change. So each of the year's changes in each zone
    # is walked, from 26 h before to 26 h after (a daily tick on either side), both ways, plus
    # one ordinary day per zone.
    day = dt.timedelta(hours=26)
    compared = 0
    mismatches = []
    for zone in WALK_ZONES:
        windows = [(c - day, c + day) for c in offset_changes(zone, 2026)]
        windows.append((at(2026, 6, 10), at(2026, 6, 11, 2)))
        for cron in WALK_CRONS:
            spec = parse_schedule(
                "x", {"queue": "demo.record", "cron": cron, "timezone": zone}, check_targets=False
            )
            for start, end in windows:
                sent = latest_ticks(spec, start, end, 10**6)
                due = due_one_after_another(spec, start, end)
                compared += len(sent)
                if due != sent:
                    mismatches.append((zone, cron, start, sorted(set(due) ^ set(sent))))
    assert not mismatches, mismatches
    assert compared > 90_000  # every window walked (both walks empty would agree too)


def test_the_chatham_changes_neither_cycle_nor_skip_a_tick():
    # 45-minute offsets: the wall clock jumps 02:45 -> 03:45 (spring) and 03:45 -> 02:45 (fall).
    spec = parse_schedule(
        "ch",
        {"queue": "demo.record", "cron": "0 */2 * * *", "timezone": "Pacific/Chatham"},
        check_targets=False,
    )
    spring = latest_ticks(spec, at(2026, 9, 26, 10), at(2026, 9, 26, 16), 100)
    # 00:00 and 02:00 CHAST (+12:45), then 04:00 CHADT (+13:45); cronsim's own walk skips 02:00.
    assert spring == [at(2026, 9, 26, 11, 15), at(2026, 9, 26, 13, 15), at(2026, 9, 26, 14, 15)]
    fall = latest_ticks(spec, at(2026, 4, 4, 10), at(2026, 4, 4, 16), 100)
    # 00:00 and 02:00 CHADT, then 04:00 CHAST; cronsim's own walk back from 04:00 never returns.
    assert fall == [at(2026, 4, 4, 10, 15), at(2026, 4, 4, 12, 15), at(2026, 4, 4, 15, 15)]


@pytest.mark.parametrize("policy", ["latest", "all"])
def test_the_lord_howe_fall_back_tick_is_sent_on_time_through_the_scheduler(settings, db, policy):
    schedules(
        settings,
        lh={
            "queue": "demo.record",
            "cron": "0 */2 * * *",
            "timezone": "Australia/Lord_Howe",
            "catch_up": policy,
        },
    )
    clock = Clock(at(2026, 4, 4, 10))
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    created = {}
    while clock.now < at(2026, 4, 4, 20):
        clock.advance(300)
        for message_id in scheduler.run_once().sent:
            created[message_id] = clock.now
    expected = [tick_message_id("lh", t) for t in LORD_HOWE_NIGHT]
    assert tick_ids("lh") == expected
    # Each within the round after its tick (five minutes), none two hours late.
    for tick in LORD_HOWE_NIGHT:
        assert tick <= created[tick_message_id("lh", tick)] <= tick + dt.timedelta(seconds=300)


# -- a round --------------------------------------------------------------------------------


def test_a_tick_is_sent_once_by_any_number_of_schedulers(settings, db):
    schedules(settings, hb={"queue": "demo.record", "every": 2, "payload": {"kind": "hb"}})
    clock = Clock(at(2026, 12, 2, 9, 59, 59, 500000))  # each starts the schedule here, or sees it started
    many = [Scheduler(clock=clock) for _ in range(3)]
    for _ in range(6):
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
    clock = Clock(at(2026, 12, 2, 9, 59, 59, 900000))
    Scheduler(clock=clock).run_once()  # starts it: nothing before this
    clock.advance(0.2)
    Scheduler(clock=clock).run_once()
    assert tick_ids("c") == ["c@2026-12-02T10:00:00+00:00"]
    clock.advance(134.8)  # every scheduler down for 2 min 15 s
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


def test_a_new_catch_up_all_schedule_sends_no_tick_from_before_it_was_first_seen(settings, db):
    # every: 1 seen at 10:00:00.5: not the ticks of the seconds before (ON_TIME_WINDOW's ten
    # would fit), the first is 10:00:01.
    schedules(settings, n={"queue": "demo.record", "every": 1, "catch_up": "all", "max_catch_up": 100})
    clock = Clock(at(2026, 12, 2, 10, 0, 0, 500000))
    scheduler = Scheduler(clock=clock)
    assert scheduler.run_once().sent == []
    clock.advance(1)
    assert scheduler.run_once().sent == ["n@2026-12-02T10:00:01+00:00"]


def test_overlap_skip_waits_for_the_previous_tick(settings, db, service):
    schedules(settings, o={"queue": "demo.record", "every": 10, "overlap": "skip"})
    clock = Clock(at(2026, 12, 2, 9, 59, 59))
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    clock.advance(1.001)
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
    schedules(
        settings, t={"task": "tests.infra.task_functions.echo", "every": 60, "args": [1], "kwargs": {"x": 2}}
    )
    clock = Clock(at(2026, 12, 2, 9, 59, 59))
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    clock.advance(2)
    scheduler.run_once()
    message = Message.objects.get(message_id="t@2026-12-02T10:00:00+00:00")
    assert message.queue_name == "demo.tasks"
    assert message.priority == -5  # the task's own
    assert message.payload["task"] == "tests.infra.task_functions.echo"
    assert (message.payload["args"], message.payload["kwargs"]) == ([1], {"x": 2})


def db_clock() -> Clock:
    """An injected clock that starts at the database's (schedules saved now start there)."""
    return Clock(read_clock("default")[0])


def start_of(name: str) -> dt.datetime:
    """The schedule's start (its state row's last tick)."""
    last_tick = ScheduleState.objects.get(name=name).last_tick
    assert last_tick is not None
    return last_tick


def backdate_start(name: str, seconds: float) -> None:
    """As if the schedule had last ticked ``seconds`` ago (disabled, or created, that long ago)."""
    ScheduleState.objects.filter(name=name).update(last_tick=start_of(name) - dt.timedelta(seconds=seconds))


def test_database_schedules_are_picked_up_within_one_round(settings, db):
    schedules(settings)
    clock = db_clock()
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    row = Schedule.objects.create(name="dbs", queue="demo.record", every=5, payload={"a": 1})
    clock.advance(5)
    scheduler.run_once()
    [first] = tick_ids("dbs")
    row.enabled = False
    row.save()
    clock.advance(5)
    scheduler.run_once()
    assert tick_ids("dbs") == [first]


def _enable(how: str, row: Schedule) -> None:
    if how == "save":
        row.enabled = True
        row.save()
    elif how == "admin action":  # what the admin's Enable does
        row.enabled = True
        row.save(update_fields=["enabled", "updated_at"])
    elif how == "command":
        run("enable", row.name)
    elif how == "queryset update":  # a shell, a data migration, a command of the project's own
        Schedule.objects.filter(pk=row.pk).update(enabled=True)
    elif how == "re-created":
        Schedule.objects.filter(pk=row.pk).delete()
        assert not ScheduleState.objects.filter(name=row.name).exists()  # deleting deletes its progress
        row.pk = None
        row.enabled = True
        row._state.adding = True
        row.save()


@pytest.mark.parametrize("how", ["save", "admin action", "command", "queryset update", "re-created"])
def test_a_schedule_enabled_again_starts_from_the_next_tick(settings, db, how):
    # catch_up="all", every 1 s, off for 60 s by the database clock: enabling it again replays
    # none of the 60 ticks it missed; its first tick is the next one after the enabling.
    schedules(settings)
    row = Schedule.objects.create(
        name="re", queue="demo.record", every=1, catch_up="all", max_catch_up=1000, payload={}
    )
    clock = db_clock()
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    Schedule.objects.filter(pk=row.pk).update(enabled=False)
    scheduler.run_once()
    backdate_start("re", 60)  # disabled 60 s ago
    Message.objects.all().delete()
    _enable(how, row)
    enabled_at = start_of("re")
    assert enabled_at >= clock.now  # the database clock at the enabling
    clock.now = enabled_at + dt.timedelta(seconds=1.5)
    report = scheduler.run_once()
    sent = [dt.datetime.fromisoformat(m.split("@", 1)[1]) for m in report.sent]
    print(f"enabled again by {how} after 60 s off: {sum(t <= enabled_at for t in sent)} of 60 ticks replayed")
    assert len(sent) <= 2 and all(t > enabled_at for t in sent), (enabled_at, report.sent)


def test_a_nightly_schedule_enabled_again_at_noon_does_not_run_at_noon(settings, db):
    schedules(settings)
    row = Schedule.objects.create(name="nightly", queue="demo.record", cron="0 3 * * *", timezone="UTC")
    Schedule.objects.filter(pk=row.pk).update(enabled=False)
    backdate_start("nightly", 86400)  # its last 03:00 a day before its disabling
    row.refresh_from_db()
    row.enabled = True
    row.save(update_fields=["enabled", "updated_at"])
    assert Scheduler().run_once().sent == []


def test_a_settings_schedule_deployed_disabled_then_enabled_starts_afresh(settings, db):
    entry = {"queue": "demo.record", "every": 1, "catch_up": "all", "max_catch_up": 1000}
    schedules(settings, dep=entry)
    clock = db_clock()
    Scheduler(clock=clock).run_once()
    schedules(settings, dep={**entry, "enabled": False})
    Scheduler(clock=clock).run_once()  # a deploy with the schedule off
    assert ScheduleState.objects.get(name="dep").last_tick is None
    clock.advance(60)
    schedules(settings, dep=entry)  # and on again, 60 s later
    scheduler = Scheduler(clock=clock)
    assert scheduler.run_once().sent == []
    clock.advance(1)
    assert len(scheduler.run_once().sent) == 1


def test_a_created_catch_up_all_schedule_sends_no_tick_from_before_its_creation(settings, db):
    schedules(settings)
    clock = db_clock()
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    Schedule.objects.create(name="new", queue="demo.record", every=1, catch_up="all", max_catch_up=1000)
    created = start_of("new")
    clock.now = created + dt.timedelta(seconds=0.5)
    sent = scheduler.run_once().sent
    assert all(dt.datetime.fromisoformat(m.split("@", 1)[1]) > created for m in sent), (created, sent)


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
        (
            {"task": "tests.infra.task_functions.missing", "every": 5},
            "zeroloss.E057",
            "task",
            "cannot be imported",
        ),
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
        hint="A schedule is a dict with 'cron' (five fields) or 'every' (seconds), and 'queue' (with "
        "'payload') or 'task' (with 'args', 'kwargs'); the message above names the key to fix "
        "(zeroloss documentation: Guides > Periodic messages).",
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


def test_the_command_disables_and_enables_a_database_schedule_as_the_admin_does(settings, db):
    schedules(settings, nightly={"queue": "demo.record", "cron": "0 3 * * *"})
    row = Schedule.objects.create(name="hb", queue="demo.record", every=60, catch_up="all", payload={})
    revision = Schedule.objects.get(pk=row.pk).revision
    assert json.loads(run("disable", "hb", "--json")) == {
        "name": "hb",
        "enabled": False,
        "changed": True,
        "next_tick": None,
    }
    assert Schedule.objects.get(pk=row.pk).revision == revision + 1  # running schedulers see it
    assert json.loads(run("disable", "hb", "--json"))["changed"] is False  # again: nothing written
    assert Schedule.objects.get(pk=row.pk).revision == revision + 1
    backdate_start("hb", 3600)  # off for an hour: 60 ticks missed
    before = read_clock("default")[0]
    enabled = json.loads(run("enable", "hb", "--json"))
    assert enabled["enabled"] is True and enabled["changed"] is True
    assert Schedule.objects.get(pk=row.pk).revision == revision + 2
    start = start_of("hb")
    assert start >= before  # it starts at the database clock of the enabling
    assert dt.datetime.fromisoformat(enabled["next_tick"]) > start
    sent = Scheduler().run_once().sent  # none of the 60 missed ticks, catch_up="all" or not
    assert all(dt.datetime.fromisoformat(m.split("@", 1)[1]) > start for m in sent), sent
    assert "hb: already enabled, next tick" in run("enable", "hb")
    assert run("disable", "hb") == "hb: disabled\n"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("nightly", "schedule 'nightly' is defined in settings: set its 'enabled' in ZEROLOSS['SCHEDULES']"),
        ("nope", "unknown schedule 'nope' (database schedules: hb)"),
    ],
)
def test_the_command_refuses_to_enable_a_settings_or_unknown_schedule_with_exit_code_2(
    settings, db, name, says
):
    schedules(settings, nightly={"queue": "demo.record", "cron": "0 3 * * *"})
    Schedule.objects.create(name="hb", queue="demo.record", every=60, payload={}, enabled=False)
    for action in ("enable", "disable"):
        with pytest.raises(CommandError) as raised:
            run(action, name)
        assert raised.value.returncode == 2 and says in str(raised.value), str(raised.value)
    with pytest.raises(CommandError) as raised:
        run("enable")
    assert raised.value.returncode == 2 and "enable needs a schedule NAME" in str(raised.value)
    assert not Schedule.objects.get(name="hb").enabled  # nothing changed


def test_the_celery_beat_task_runs_a_round_on_every_ledger_database(settings, db):
    from zeroloss.integrations.celery import tasks
    from zeroloss.integrations.celery.beat import scheduler_beat_entry

    assert scheduler_beat_entry() == {
        "zeroloss-schedule": {
            "task": "zeroloss.schedule",
            "schedule": 1.0,
            "options": {"queue": "zeroloss.sweep"},
        }
    }
    schedules(settings, beat={"queue": "demo.record", "every": 0.05})
    tasks._schedulers.clear()
    sent = 0
    try:
        assert tasks.schedule() == {"sent": 0}  # starts it: its first tick is the next one
        wait_for("a tick sent by the beat task", lambda: bool(tasks.schedule()["sent"]), 10, interval=0.02)
        sent = len(tick_ids("beat"))
    finally:
        tasks._schedulers.clear()
    assert sent >= 1


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
    clock = Clock(at(2026, 12, 2, 9, 59, 59))
    scheduler = Scheduler(clock=clock)
    scheduler.run_once()
    clock.advance(1.001)
    scheduler.run_once()
    assert tick_ids("small") == ["small@2026-12-02T10:00:00+00:00"]
    assert tick_ids("big") == []
    assert "big@2026-12-02T10:00:00+00:00 refused by the ledger" in caplog.text


def test_the_command_loop_runs_rounds_until_told_to_stop(settings, db):
    schedules(settings, loop={"queue": "demo.record", "every": 0.02})
    settings.ZEROLOSS = {**settings.ZEROLOSS, "SCHEDULE_INTERVAL": 0.05}  # the rounds, not their pace
    result = json.loads(run("--loop", "--max-rounds", "5", "--json"))
    assert result["rounds"] == 5
    # The first round starts the schedule; the next ones send its ticks as they fall due.
    assert result["sent"] == len(tick_ids("loop")) >= 1
