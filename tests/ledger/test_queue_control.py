"""Queue control at the ledger (issue 27, part A): pause and resume, concurrency and rate limits
enforced where messages are claimed, on both databases (docs/control.md)."""

from __future__ import annotations

import threading

import pytest
from django.core.checks import Error
from django.db import connection, connections

from tests.support import expire_leases
from zeroloss.conf import QueueSettings, get_settings
from zeroloss.core.rates import Rate, parse_rate
from zeroloss.ledger import control
from zeroloss.ledger.models import Message, QueueControl
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import Completion, Verdict
from zeroloss.ops import checks

pytestmark = pytest.mark.django_db(transaction=True)

CTL = QueueControl._meta.db_table


def send(service: ZeroLossMessageService, queue: str, n: int, prefix: str = "m") -> list[str]:
    ids = [f"{prefix}{i}" for i in range(n)]
    for mid in ids:
        service.persist_message(mid, queue, {})
    return ids


def processing(queue: str) -> int:
    return Message.objects.filter(queue_name=queue, status="processing").count()


def age_bucket(queue: str, seconds: float) -> None:
    """Move the rate bucket's last refill ``seconds`` into the past (the database clock)."""
    if connection.vendor == "postgresql":
        sql = f"UPDATE {CTL} SET refilled_at = refilled_at - %s * interval '1 second' WHERE queue_name = %s"
        params: list[float | str] = [seconds, queue]
    else:
        sql = (
            f"UPDATE {CTL} SET refilled_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', refilled_at, %s) "
            "WHERE queue_name = %s"
        )
        params = [f"{-seconds:+.6f} seconds", queue]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@pytest.fixture(autouse=True)
def _fresh_cache():
    control._CONTROLLED.clear()
    yield
    control._CONTROLLED.clear()


# -- settings -------------------------------------------------------------------------------


def test_limits_in_settings_are_parsed(settings):
    settings.ZEROLOSS = {"QUEUES": {"q": {"concurrency": 2, "rate": "10/s"}, "r": {"rate": "600/m"}}}
    queues = get_settings().QUEUES
    assert queues["q"] == QueueSettings(concurrency=2, rate=Rate(10, 1.0, "10/s"))
    assert queues["r"].rate == Rate(600, 60.0, "600/m") and queues["r"].concurrency is None
    assert parse_rate(" 1000 / h ") == Rate(1000, 3600.0, "1000/h")
    assert checks.check_settings() == []


@pytest.mark.parametrize(
    ("option", "value", "why"),
    [
        ("rate", "10/d", 'must be "N/s", "N/m" or "N/h" (e.g. "10/s"), got \'10/d\'.'),
        ("rate", 10, 'must be "N/s", "N/m" or "N/h" (e.g. "10/s"), got 10.'),
        ("rate", "0/s", "must count from 1 to 2147483647 per period, got '0/s'."),
        ("concurrency", 0, "must be an integer from 1 to 2147483647, got 0."),
        ("concurrency", True, "must be an integer from 1 to 2147483647, got True."),
        ("concurrency", "2", "must be an integer from 1 to 2147483647, got '2'."),
    ],
)
def test_bad_limits_in_settings_are_e007(settings, option, value, why):
    settings.ZEROLOSS = {"QUEUES": {"q": {option: value}}}
    key = f"QUEUES['q'][{option!r}]"
    assert checks.check_settings() == [
        Error(f"ZEROLOSS[{key!r}]: {why}", hint=why, obj="settings.ZEROLOSS", id="zeroloss.E007")
    ]


# -- pause and resume -----------------------------------------------------------------------


def test_a_paused_queue_accepts_sends_and_is_not_claimed_until_resumed():
    service = ZeroLossMessageService()
    service.pause_queue("q", actor="ops")
    ids = send(service, "q", 3)  # accepted while paused
    assert service.claim("q", limit=10) == []
    assert service.claim_message(ids[0]) is None
    assert Message.objects.filter(queue_name="q", status="pending").count() == 3
    row = QueueControl.objects.get(queue_name="q")
    assert row.paused and row.changed_by == "ops"
    service.resume_queue("q", actor="ops2")
    assert len(service.claim("q", limit=10)) == 3
    assert QueueControl.objects.get(queue_name="q").changed_by == "ops2"


def test_pause_leaves_other_queues_and_in_flight_messages_alone():
    service = ZeroLossMessageService()
    send(service, "q", 2)
    send(service, "other", 1, prefix="o")
    (lease,) = service.claim("q", limit=1)
    service.pause_queue("q")
    assert service.claim("q", limit=10) == []
    assert len(service.claim("other", limit=10)) == 1
    # the in-flight one finishes normally
    assert service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)]).acknowledged == [
        lease.message_id
    ]


def test_another_process_sees_a_pause_within_the_refresh():
    service = ZeroLossMessageService()
    send(service, "q", 2)
    assert service.control.is_controlled("q") is False  # read, and cached for REFRESH seconds
    with connection.cursor() as cursor:  # another process's pause: this one's cache is stale
        cursor.execute(
            f"INSERT INTO {CTL} (queue_name, paused, concurrency, rate, tokens, changed_by, changed_at) "
            "VALUES ('q', true, NULL, '', 0, 'elsewhere', CURRENT_TIMESTAMP)"
        )
    at, names, limited = control._CONTROLLED["default"]
    control._CONTROLLED["default"] = (at - control.REFRESH, names, limited)  # the refresh is due
    assert service.claim("q", limit=10) == []


# -- concurrency ----------------------------------------------------------------------------


def test_a_concurrency_limit_counts_what_is_processing_until_its_outcome():
    service = ZeroLossMessageService()
    send(service, "q", 6)
    service.limit_queue("q", concurrency=2)
    first = service.claim("q", limit=10)
    assert len(first) == 2
    assert service.claim("q", limit=10) == []
    assert service.claim_message("m5") is None
    service.record_outcomes([Completion(first[0], Verdict.ACKNOWLEDGE)])
    assert len(service.claim("q", limit=10)) == 1
    service.record_outcomes([Completion(first[1], Verdict.FAIL, "boom")])  # a failure frees its slot too
    assert processing("q") == 1


def test_a_dead_workers_slots_come_back_with_the_sweep_exactly_once():
    service = ZeroLossMessageService()
    send(service, "q", 5)
    service.limit_queue("q", concurrency=2)
    assert len(service.claim("q", limit=10)) == 2
    expire_leases()  # the holder died: its leases ran out ...
    assert service.claim("q", limit=10) == []  # ... but they count until the sweep
    assert len(service.sweep().requeued) == 2
    assert service.sweep().requeued == []
    assert len(service.claim("q", limit=10)) == 2
    assert service.claim("q", limit=10) == []
    assert processing("q") == 2


def test_limits_from_settings_apply_and_an_override_wins_until_cleared(settings):
    settings.ZEROLOSS = {"QUEUES": {"q": {"concurrency": 1}}}
    service = ZeroLossMessageService()
    send(service, "q", 6)
    assert len(service.claim("q", limit=10)) == 1
    service.limit_queue("q", concurrency=3)
    assert len(service.claim("q", limit=10)) == 2
    service.clear_queue_limits("q")
    assert service.claim("q", limit=10) == []  # 3 in flight, the setting's 1 again
    (state,) = service.queue_states()
    assert state.limits.concurrency == 1 and state.concurrency_override is None
    assert (state.processing, state.pending) == (3, 3)


@pytest.mark.postgres_only  # SQLite's lock is a write (it takes the database's write lock)
def test_a_concurrency_claim_locks_the_row_without_writing_it(settings):
    """The row is created at the queue's first claim (a limit from the settings alone); after
    that a claim locks it (SELECT ... FOR UPDATE): no new row version, no WAL per claim."""
    settings.ZEROLOSS = {"QUEUES": {"q": {"concurrency": 3}}}
    service = ZeroLossMessageService()
    send(service, "q", 6)
    assert not QueueControl.objects.filter(queue_name="q").exists()

    def version() -> str:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT xmin::text FROM {CTL} WHERE queue_name = %s", ["q"])
            return cursor.fetchone()[0]

    assert len(service.claim("q", limit=1)) == 1  # creates the row
    created = version()
    assert len(service.claim("q", limit=1)) == 1
    assert len(service.claim("q", limit=10)) == 1  # the limit still counts: 3 in flight
    assert service.claim("q", limit=10) == []
    assert version() == created


def test_a_redrive_goes_through_the_limit():
    service = ZeroLossMessageService(max_attempts=1)
    send(service, "q", 3)
    (lease,) = service.claim("q", limit=1)
    service.record_outcomes([Completion(lease, Verdict.FAIL, "boom")])
    assert Message.objects.get(message_id=lease.message_id).status == "dead"
    service.limit_queue("q", concurrency=1)
    service.claim("q", limit=1)
    service.redrive_messages([lease.message_id])
    assert service.claim("q", limit=10) == []
    assert processing("q") == 1


@pytest.mark.postgres_only  # SQLite has one writer: its claims cannot race
def test_racing_claimers_never_exceed_the_concurrency_limit():
    service = ZeroLossMessageService()
    send(service, "q", 200)
    service.limit_queue("q", concurrency=3)
    peaks: list[int] = []
    errors: list[BaseException] = []
    go = threading.Barrier(8)

    def claimer(n: int) -> None:
        try:
            mine = ZeroLossMessageService(instance_id=f"c{n}")
            go.wait()
            for _ in range(25):
                leases = mine.claim("q", limit=5)
                peaks.append(processing("q"))
                if leases:
                    mine.record_outcomes([Completion(x, Verdict.ACKNOWLEDGE) for x in leases])
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert max(peaks) <= 3
    assert Message.objects.filter(queue_name="q", status="completed").count() > 0


# -- rate -----------------------------------------------------------------------------------


def test_a_rate_limit_spends_its_bucket_and_refills_by_the_database_clock():
    service = ZeroLossMessageService()
    send(service, "q", 40)
    service.limit_queue("q", rate="100/h")  # a bucket of 10, one token every 36 s
    assert len(service.claim("q", limit=50)) == 10
    assert service.claim("q", limit=50) == []
    age_bucket("q", 72)  # two tokens' worth of time
    assert len(service.claim("q", limit=50)) == 2
    assert service.claim("q", limit=50) == []
    age_bucket("q", 3600)  # an hour: the bucket is full, never fuller
    assert len(service.claim("q", limit=50)) == 10


def test_a_clock_that_steps_back_refills_nothing():
    service = ZeroLossMessageService()
    send(service, "q", 20)
    service.limit_queue("q", rate="100/h")
    assert len(service.claim("q", limit=50)) == 10
    age_bucket("q", -3600)  # the last refill now lies in the future
    assert service.claim("q", limit=50) == []


def test_bad_limit_values_raise_and_change_nothing():
    service = ZeroLossMessageService()
    with pytest.raises(ValueError, match='must be "N/s", "N/m" or "N/h"'):
        service.limit_queue("q", rate="ten per second")
    with pytest.raises(ValueError, match="must be an integer from 1"):
        service.limit_queue("q", concurrency=0)
    assert not QueueControl.objects.exists()
