"""The partitioned ledger (issue 31, docs/scaling.md): what ``migrate`` creates on PostgreSQL,
the unique ids and ordering heads outside the partitions, partitions created ahead by the
sweep, and a purge that detaches and drops whole periods while keeping the conservation check
exact. Periods are moved into the past by the database clock (rows' timestamps), never waited for."""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any

import psycopg
import pytest
from django.core.checks import run_checks
from django.db import OperationalError, connection, transaction

import zeroloss
from tests.conftest import database_url
from tests.support.cli import run
from tests.support.processes import db_worker
from tests.support.waiting import wait_for
from zeroloss.core.states import Status
from zeroloss.exceptions import MessageConflict
from zeroloss.ledger import partition_drops, partitions, periods, sweep
from zeroloss.ledger import statements_partitions as sql_partitions
from zeroloss.ledger.base import engine_for
from zeroloss.ledger.models import DroppedPeriod, Message, MessageEvent, MessageKey, OrderingHead, PurgeRecord
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ops.health import health_report

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

QUEUE = "demo.record"
DAY = 86400


def day_start(days_ago: int) -> dt.datetime:
    now = partitions.database_now(connection)
    return partitions.period_start(now, DAY) - dt.timedelta(days=days_ago)


def move_to_day(message_ids: list[str], days_ago: int) -> None:
    """Rewrite the messages' (and their audit rows' and keys') times as if sent at noon
    ``days_ago`` days ago and finished an hour later: their rows move to that day's partitions."""
    sent = day_start(days_ago) + dt.timedelta(hours=12)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE zeroloss_messageevent SET message_created_at = %s, created_at = %s WHERE message_id IN "
            "(SELECT id FROM zeroloss_message WHERE message_id = ANY(%s))",
            [sent, sent, message_ids],
        )
        cursor.execute(
            "UPDATE zeroloss_message SET created_at = %s, updated_at = %s, "
            "completed_at = CASE WHEN completed_at IS NULL THEN NULL ELSE %s END, "
            "dead_at = CASE WHEN dead_at IS NULL THEN NULL ELSE %s END WHERE message_id = ANY(%s)",
            [
                sent,
                sent + dt.timedelta(hours=1),
                sent + dt.timedelta(hours=1),
                sent + dt.timedelta(hours=1),
                message_ids,
            ],
        )
        cursor.execute(
            "UPDATE zeroloss_message_key SET created_at = %s WHERE message_id = ANY(%s)", [sent, message_ids]
        )


def complete(service: ZeroLossMessageService, message_ids: list[str]) -> None:
    for mid in message_ids:
        lease = service.claim_message(mid)
        assert lease is not None
        assert service.acknowledge(mid, lease.token)


def verify() -> dict[str, Any]:
    result = run("zeroloss_verify", "--json")
    assert result.code == 0, result
    report: dict[str, Any] = json.loads(result.out)
    return report


def names(table: str = partitions.MESSAGES) -> list[str]:
    return [p.name for p in partitions.partitions(connection, table)]


def test_migrate_creates_the_partitioned_layout_with_periods_ahead_and_no_default():
    assert partitions.is_partitioned(connection)
    today = day_start(0)
    expected = [f"zeroloss_message_p{(today + dt.timedelta(days=d)):%Y%m%d}" for d in range(-1, 4)]
    # Yesterday's (empty) partition is gone once a purge ran in this database before this test.
    found = names()
    assert found[: len(expected)] == expected or found[: len(expected) - 1] == expected[1:]
    assert [n.replace("messageevent", "message") for n in names(partitions.EVENTS)] == names()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_partitioned_table p WHERE p.partrelid IN "
            "(to_regclass('zeroloss_message'), to_regclass('zeroloss_messageevent')) AND p.partdefid = 0"
        )
        assert cursor.fetchone() == (2,)  # both partitioned, neither with a default partition
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass('zeroloss_message') "
            "AND contype IN ('p', 'u')"
        )
        assert [r[0] for r in cursor.fetchall()] == ["PRIMARY KEY (id, created_at)"]
    assert partitions.coverage(connection) == today + dt.timedelta(days=4)


def test_a_resend_days_later_finds_the_first_message_through_the_key_table():
    partitions.create_partitions(connection, day_start(5), day_start(2), DAY)
    first = zeroloss.send(QUEUE, {"n": 1}, message_id="resent")
    move_to_day(["resent"], 3)
    again = zeroloss.send(QUEUE, {"n": 1}, message_id="resent")
    assert again.pk == first.pk and Message.objects.filter(message_id="resent").count() == 1
    stored = Message.objects.get(message_id="resent")
    assert MessageKey.objects.get(message_id="resent").created_at == stored.created_at
    assert list(MessageEvent.objects.for_message("resent").values_list("reason", flat=True)) == ["persisted"]
    # A send absorbed by a deduplication window annotates the first message, in its period too.
    windowed = zeroloss.send(QUEUE, {"n": 2}, message_id="w1", dedup_key="once")
    assert zeroloss.send(QUEUE, {"n": 2}, message_id="w2", dedup_key="once").pk == windowed.pk
    reasons = list(MessageEvent.objects.for_message("w1").values_list("reason", flat=True))
    assert reasons == ["persisted", "duplicate_absorbed"]
    # Every audit row carries its message's created_at: it sits in its message's period.
    for event in MessageEvent.objects.select_related("message"):
        assert event.message_created_at == event.message.created_at, event


def test_the_sweep_creates_the_periods_ahead_once_a_minute():
    last = names()[-1]
    with connection.cursor() as cursor:
        for table in (partitions.MESSAGES, partitions.EVENTS):
            part = last.replace(partitions.MESSAGES, table)
            cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {part}")
            cursor.execute(f"DROP TABLE {part}")
    assert names()[-1] != last
    sweep.PARTITIONS_CHECKED.clear()
    service = ZeroLossMessageService(instance_id="sweeper")
    service.sweep()
    assert names()[-1] == last and names(partitions.EVENTS)[-1] == last.replace("message", "messageevent")
    # Within the minute the sweep does not look again; asked directly, there is nothing to do.
    assert service.ensure_partitions() == []


def test_a_purge_drops_whole_expired_days_and_keeps_the_conservation_check_exact():
    partitions.create_partitions(connection, day_start(12), day_start(7), DAY)
    service = ZeroLossMessageService(instance_id="purger")
    done = [f"done{i}" for i in range(5)]
    for mid in [*done, "live", "late", "dead"]:
        zeroloss.send(QUEUE, {"n": mid}, message_id=mid)
    complete(service, [*done, "late"])
    service.dead_letter_messages(["dead"], reason="poison")
    move_to_day(done, 10)  # a whole day of completed messages: dropped
    move_to_day(["live"], 9)  # still pending: its day is kept
    move_to_day(["dead"], 11)  # a dead letter: kept (DEAD_LETTER_RETENTION is None)
    move_to_day(["late"], 8)
    with connection.cursor() as cursor:  # sent 8 days ago, completed a minute ago: kept
        cursor.execute(
            "UPDATE zeroloss_message SET completed_at = statement_timestamp() WHERE message_id = 'late'"
        )
    before = names()
    assert service.purge_messages(older_than=7 * DAY) == 5
    # The day of completed messages, and the empty day before the dead letter's.
    dropped = [f"zeroloss_message_p{day_start(d):%Y%m%d}" for d in (12, 10)]
    assert [n for n in before if n not in names()] == dropped
    assert not {n.replace("message", "messageevent") for n in dropped} & set(names(partitions.EVENTS))
    assert set(Message.objects.values_list("message_id", flat=True)) == {"live", "late", "dead"}
    assert not MessageKey.objects.filter(message_id__in=done).exists()
    assert list(PurgeRecord.objects.values_list("queue_name", "status", "count", "actor")) == [
        (QUEUE, "completed", 5, "purger")
    ]
    report = verify()
    assert report["status"] == "ok", report
    # A dropped id is forgotten, as a purged one always was: sent again, it is a new message.
    assert zeroloss.send(QUEUE, {"n": "done0"}, message_id="done0").status == "pending"


def test_dead_letters_past_their_own_retention_go_with_their_day(settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "DEAD_LETTER_RETENTION": 3 * DAY}
    partitions.create_partitions(connection, day_start(12), day_start(9), DAY)
    service = ZeroLossMessageService(instance_id="purger")
    zeroloss.send(QUEUE, {"n": 1}, message_id="old-dead")
    zeroloss.send(QUEUE, {"n": 2}, message_id="old-done")
    service.dead_letter_messages(["old-dead"], reason="poison")
    complete(service, ["old-done"])
    move_to_day(["old-dead", "old-done"], 10)
    assert service.purge_messages(older_than=7 * DAY) == 2
    assert sorted(PurgeRecord.objects.values_list("status", "count")) == [("completed", 1), ("dead", 1)]
    assert not Message.objects.exists()
    assert verify()["status"] == "ok"


def test_an_interrupted_drop_is_finished_and_a_changed_period_attached_again():
    partitions.create_partitions(connection, day_start(12), day_start(9), DAY)
    service = ZeroLossMessageService(instance_id="purger")
    for mid in ("a", "b"):
        zeroloss.send(QUEUE, {"n": mid}, message_id=mid)
    complete(service, ["a", "b"])
    move_to_day(["a"], 11)
    move_to_day(["b"], 10)
    first, second = (f"zeroloss_message_p{day_start(d):%Y%m%d}" for d in (11, 10))
    with connection.cursor() as cursor:
        # A drop cut off after its detaches: the first period detached, its audit rows too.
        cursor.execute(f"ALTER TABLE zeroloss_message DETACH PARTITION {first} CONCURRENTLY")
        cursor.execute(
            f"ALTER TABLE zeroloss_messageevent DETACH PARTITION {first.replace('message', 'messageevent')} CONCURRENTLY"
        )
        # The second detached, then changed under it (as a redrive would): it must come back.
        cursor.execute(f"ALTER TABLE zeroloss_message DETACH PARTITION {second} CONCURRENTLY")
        cursor.execute(
            f"UPDATE {second} SET status = 'pending', completed_at = NULL, available_at = created_at"
        )
    assert service.purge_messages(older_than=7 * DAY, status="completed") == 1
    assert first not in names() and second in names()
    assert second.replace("message", "messageevent") in names(partitions.EVENTS)
    assert list(Message.objects.values_list("message_id", "status")) == [("b", "pending")]
    assert list(PurgeRecord.objects.values_list("status", "count")) == [("completed", 1)]


def test_a_period_holding_anything_a_drop_may_not_take_is_found_by_its_probe():
    partitions.create_partitions(connection, day_start(20), day_start(9), DAY)
    service = ZeroLossMessageService(instance_id="purger")
    for mid in ("pending", "processing", "cancelled", "dead", "old-done", "recent-done"):
        zeroloss.send(QUEUE, {"n": mid}, message_id=mid)
    zeroloss.send(QUEUE, {"n": "head"}, message_id="head", ordering_key="k")
    zeroloss.send(QUEUE, {"n": "waiting"}, message_id="waiting", ordering_key="k")
    assert Message.objects.get(message_id="waiting").available_at is None
    assert service.claim_message("processing") is not None
    zeroloss.cancel("cancelled")
    service.dead_letter_messages(["dead"], reason="poison")
    complete(service, ["old-done", "recent-done"])
    days = {"pending": 19, "head": 19, "waiting": 18, "processing": 17, "cancelled": 16, "dead": 15}
    days.update({"old-done": 14, "recent-done": 13})
    for mid, days_ago in days.items():
        move_to_day([mid], days_ago)
    with connection.cursor() as cursor:  # finished a minute ago: within the retention
        cursor.execute(
            "UPDATE zeroloss_message SET updated_at = statement_timestamp(), "
            "completed_at = CASE WHEN status = 'completed' THEN statement_timestamp() END "
            "WHERE message_id IN ('cancelled', 'recent-done')"
        )

    def kept(days_ago: int, dead_before: dt.datetime | None = None) -> bool:
        part = f"zeroloss_message_p{day_start(days_ago):%Y%m%d}"
        return partition_drops._holds_kept(connection, part, day_start(7), dead_before)

    assert [kept(d) for d in (19, 18, 17, 16, 15, 14, 13, 12)] == [True] * 5 + [False, True, False]
    # With a dead letters' retention, an old dead letter no longer keeps its day.
    assert not kept(15, dead_before=day_start(7)) and kept(15, dead_before=day_start(20))


def test_the_drops_probes_name_every_status_the_ledger_writes():
    # A status added to the ledger fails here until HOLDS_KEPT decides about it: till then the
    # census keeps every period holding one (the test below), and no drop takes it.
    assert {str(s) for s in Status} == sql_partitions.PROBED_STATUSES
    for status in sql_partitions.PROBED_STATUSES:
        assert f"status = '{status}'" in sql_partitions.HOLDS_KEPT


def test_a_status_no_probe_names_is_kept_by_the_census_and_its_day_attached_again():
    # The probes read the partial indexes of the statuses the ledger writes; a status they do
    # not name (one a later version might add) must not cost the period its rows: the census
    # after the detach decides, and the period comes back whole.
    partitions.create_partitions(connection, day_start(12), day_start(9), DAY)
    service = ZeroLossMessageService(instance_id="purger")
    zeroloss.send_many(QUEUE, [{"n": mid} for mid in ("odd", "done")], message_ids=["odd", "done"])
    complete(service, ["done"])
    move_to_day(["odd", "done"], 10)
    part = f"zeroloss_message_p{day_start(10):%Y%m%d}"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE zeroloss_message SET status = 'parked' WHERE message_id = 'odd'")
    assert not partition_drops._holds_kept(connection, part, day_start(7), None)
    # The period stays; its completed message goes the row-by-row way of a kept period.
    assert service.purge_messages(older_than=7 * DAY) == 1
    assert part in names() and part.replace("message", "messageevent") in names(partitions.EVENTS)
    assert list(Message.objects.values_list("message_id", "status")) == [("odd", "parked")]
    assert list(PurgeRecord.objects.values_list("status", "count")) == [("completed", 1)]
    assert not DroppedPeriod.objects.exists()


def test_a_dropped_periods_keys_leave_in_batches_and_a_resend_meanwhile_is_stored_again():
    partitions.create_partitions(connection, day_start(12), day_start(9), DAY)
    service = ZeroLossMessageService(instance_id="purger")
    done = [f"k{i}" for i in range(7)]
    zeroloss.send_many(QUEUE, [{"n": mid} for mid in done], message_ids=done)
    complete(service, done)
    # A batch as large as the bulk path's (COPY) takes: completed here by statement.
    bulk = [f"b{i}" for i in range(engine_for(connection).stage_from)]
    zeroloss.send_many(QUEUE, [{"n": mid} for mid in bulk], message_ids=bulk)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE zeroloss_message SET status = 'completed', completed_at = updated_at WHERE message_id = ANY(%s)",
            [bulk],
        )
    move_to_day([*done, *bulk], 10)
    part = f"zeroloss_message_p{day_start(10):%Y%m%d}"
    dropped = partition_drops.drop_expired(
        connection, completed_before=day_start(7), dead_before=None, record=lambda counts: None
    )
    assert [(d.name, d.total) for d in dropped if d.total] == [(part, 7 + len(bulk))]
    # Gone from every read at once; the detached table stays as the list of keys to delete.
    assert not Message.objects.exists() and part not in names()
    assert list(DroppedPeriod.objects.values_list("table_name", "cleaned_to")) == [(part, 0)]
    assert MessageKey.objects.count() == 7 + len(bulk)
    shown = run("zeroloss_partition", "show", "--json")
    assert shown.code == 0, shown
    assert [(d["name"], d["keys_deleted_to_id"]) for d in json.loads(shown.out)["dropping"]] == [(part, 0)]
    # A resend of a dropped id meanwhile is a new message: one at a time, in a batch and in a
    # bulk batch. Its new key survives the cleanup.
    assert zeroloss.send(QUEUE, {"n": "k0"}, message_id="k0").status == "pending"
    again = zeroloss.send_many(
        QUEUE, [{"n": m} for m in ("k1", "k2", "fresh")], message_ids=["k1", "k2", "fresh"]
    )
    assert [m.status for m in again] == ["pending"] * 3
    resent = zeroloss.send_many(QUEUE, [{"n": mid} for mid in bulk], message_ids=bulk)
    assert {m.status for m in resent} == {"pending"} and Message.objects.count() == 4 + len(bulk)
    with pytest.raises(MessageConflict):  # a stored id still refuses another payload
        zeroloss.send(QUEUE, {"n": "other"}, message_id="k0")
    # Cut off after a batch: the next call goes on from the id the batch reached.
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, message_id FROM {part} ORDER BY id")
        ids = cursor.fetchall()
        first_two = [ids[0][0], ids[1][0]]
        cursor.execute(
            "DELETE FROM zeroloss_message_key WHERE message_id = ANY(%s) AND created_at < %s",
            [[ids[0][1], ids[1][1]], day_start(7)],
        )
        cursor.execute("UPDATE zeroloss_dropped_period SET cleaned_to = %s", [max(first_two)])
    remaining = {mid for _, mid in ids[2:]} - {"k0", "k1", "k2", *bulk}
    with psycopg.connect(database_url()) as other:  # another purger at it: this one leaves it
        other.execute("SELECT 1 FROM zeroloss_dropped_period FOR UPDATE")
        assert partition_drops.delete_dropped_keys(connection, batch=2) == 0
    assert DroppedPeriod.objects.get().cleaned_to == max(first_two)
    assert partition_drops.delete_dropped_keys(connection, batch=2) == len(remaining)
    assert not DroppedPeriod.objects.exists()
    assert json.loads(run("zeroloss_partition", "show", "--json").out)["dropping"] == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [part])
        assert cursor.fetchone() == (None,)
    kept = {"fresh", "k0", "k1", "k2", *bulk}
    assert set(MessageKey.objects.values_list("message_id", flat=True)) == kept
    assert set(Message.objects.values_list("message_id", flat=True)) == kept


def test_a_second_head_of_a_key_is_refused_by_the_head_table_under_concurrent_promotions():
    """The race the message table's unique head index closed before it was partitioned: two
    promotions of one key, each seeing no head, choosing different messages."""
    service = ZeroLossMessageService(instance_id="heads")
    zeroloss.send(QUEUE, {"n": 0}, message_id="k-old", ordering_key="acct")
    service.dead_letter_messages(["k-old"], reason="poison")  # the key has no head now
    zeroloss.send(QUEUE, {"n": 1}, message_id="k-next", ordering_key="acct")
    # What the sender's own promotion did is undone: k-next waits, the key has no head row.
    Message.objects.filter(message_id="k-next").update(available_at=None)
    OrderingHead.objects.all().delete()
    promote = engine_for(connection).sql["PROMOTE"]
    params = engine_for(connection).batch(q=[QUEUE], k=["acct"])
    with psycopg.connect(database_url()) as first, psycopg.connect(database_url(), autocommit=True) as other:
        promoted = first.execute(promote, params).fetchall()
        assert [r[0] for r in promoted] == ["k-next"]  # not committed yet
        # Meanwhile the older message is redriven (it waits behind its key; its own promotion
        # left out), and a second
        # promotion, seeing no committed head, picks it: it must wait for the first, then lose.
        Message.objects.filter(message_id="k-old").update(status="pending", dead_at=None, available_at=None)
        result: list[Any] = []
        waiter = threading.Thread(target=lambda: result.append(other.execute(promote, params).fetchall()))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive()  # blocked on the key's head row
        first.commit()
        waiter.join(10)
        assert not waiter.is_alive()
    assert result == [[]]
    heads = Message.objects.filter(status="pending", available_at__isnull=False, ordering_key="acct")
    assert list(heads.values_list("message_id", flat=True)) == ["k-next"]
    assert list(OrderingHead.objects.values_list("message_pk", flat=True)) == [
        Message.objects.get(message_id="k-next").pk
    ]


# -- partitions that never run out (issue 49) ---------------------------------------------------


def remove_periods(since: dt.datetime, *, forget: bool = True) -> list[str]:
    """Detach and drop every (empty) period ending after ``since``, as if no sweep ever
    created them; ``forget``: this process reads the layout again at its next send."""
    removed = []
    with connection.cursor() as cursor:
        for p in partitions.partitions(connection):
            if p.end > since:
                for table, _ in partitions.TABLES:
                    part = p.name.replace(partitions.MESSAGES, table, 1)
                    cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {part}")
                    cursor.execute(f"DROP TABLE {part}")
                removed.append(p.name)
    if forget:
        periods.forget()
    return removed


def covers_ahead() -> bool:
    """Whether the partitions cover from now to PARTITIONS_AHEAD (3) days ahead, both tables."""
    horizon = partitions.database_now(connection) + dt.timedelta(days=3)
    until = partitions.coverage(connection)
    return (
        until is not None
        and until >= horizon
        and names(partitions.EVENTS)
        == [n.replace(partitions.MESSAGES, partitions.EVENTS, 1) for n in names()]
    )


def test_a_send_creates_its_missing_period_and_the_periods_ahead():
    assert remove_periods(day_start(0))
    assert partitions.coverage(connection) is None  # no partition covers now: a send had nowhere to go
    message = zeroloss.send(QUEUE, {"n": 1}, message_id="first")
    assert message.status == "pending" and Message.objects.get(message_id="first").created_at is not None
    assert covers_ahead()
    assert list(MessageEvent.objects.for_message("first").values_list("reason", flat=True)) == ["persisted"]


def test_a_send_in_a_transaction_that_read_the_ledger_before_finds_the_period_created_meanwhile():
    # The transaction locked the message table before the period existed: its insert must
    # still route to the partition another connection created meanwhile.
    assert remove_periods(day_start(0))
    with transaction.atomic():
        assert Message.objects.count() == 0
        zeroloss.send(QUEUE, {"n": 1}, message_id="in-tx")
        zeroloss.send_many(QUEUE, [{"n": 2}, {"n": 3}], message_ids=["in-tx-2", "in-tx-3"])
    assert sorted(Message.objects.values_list("message_id", flat=True)) == ["in-tx", "in-tx-2", "in-tx-3"]
    assert covers_ahead()


def test_a_send_after_its_period_was_dropped_behind_this_process_is_stored_again():
    zeroloss.send(QUEUE, {"n": 0}, message_id="seen")  # this process now knows the periods ahead
    Message.objects.all().delete()
    MessageEvent.objects.all().delete()
    MessageKey.objects.all().delete()
    assert remove_periods(day_start(0), forget=False)
    assert zeroloss.send(QUEUE, {"n": 1}, message_id="again").status == "pending"
    assert covers_ahead()


def _held_attach(
    cursor: Any, table: str, part: str, low: dt.datetime, high: dt.datetime, *, of: bool
) -> None:
    if of:  # what the ledger does not do: CREATE ... PARTITION OF locks the parent exclusively
        cursor.execute(f"CREATE TABLE {part} PARTITION OF {table} FOR VALUES FROM (%s) TO (%s)", [low, high])
        return
    cursor.execute(sql_partitions.CREATE_LIKE.format(part=part, table=table))
    cursor.execute(sql_partitions.ATTACH.format(table=table, part=part), [low, high])


@pytest.mark.parametrize("of", [False, True], ids=["attach", "partition-of"])
def test_creating_a_period_stalls_no_send_and_no_claim(of):
    """A period's creation held open at its last statement (uncommitted, its locks held): sends,
    claims and acknowledgements go on beside it. The same test with ``CREATE TABLE ... PARTITION
    OF`` (an ACCESS EXCLUSIVE lock on the parent) stalls them: what the test would catch."""
    service = ZeroLossMessageService(instance_id="beside-ddl")
    zeroloss.send(QUEUE, {"n": 0}, message_id="before")
    low = day_start(-40)
    high = low + dt.timedelta(days=1)
    with psycopg.connect(database_url()) as ddl:
        for table, _ in partitions.TABLES:
            _held_attach(psycopg.ClientCursor(ddl), table, f"{table}_p{low:%Y%m%d}", low, high, of=of)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '3s'")
        try:
            if of:
                with pytest.raises(OperationalError, match="lock timeout"):
                    zeroloss.send(QUEUE, {"n": 1}, message_id="beside")
                return
            zeroloss.send(QUEUE, {"n": 1}, message_id="beside")
            zeroloss.send_many(QUEUE, [{"n": 2}, {"n": 3}], message_ids=["beside-2", "beside-3"])
            leases = service.claim(QUEUE, limit=10)
            assert sorted(lease.message_id for lease in leases) == [
                "before",
                "beside",
                "beside-2",
                "beside-3",
            ]
            for lease in leases:
                assert service.acknowledge(lease.message_id, lease.token)
        finally:
            ddl.rollback()
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")
    assert set(Message.objects.values_list("status", flat=True)) == {"completed"}


@pytest.fixture
def clock_ahead():
    """Move this database's clock forward: ``statement_timestamp()`` and its siblings shadowed
    by functions of the public schema, searched before ``pg_catalog`` by every new connection
    (worker processes and commands too). Put back after the test."""
    name = connection.settings_dict["NAME"]
    functions = (("statement_timestamp", "STABLE"), ("now", "STABLE"), ("clock_timestamp", "VOLATILE"))

    def move(days: int) -> None:
        with connection.cursor() as cursor:
            for function, volatility in functions:
                cursor.execute(
                    f"CREATE OR REPLACE FUNCTION public.{function}() RETURNS timestamptz LANGUAGE sql "
                    f"{volatility} AS $$ SELECT pg_catalog.{function}() + interval '{days} days' $$"
                )
            cursor.execute(f'ALTER DATABASE "{name}" SET search_path = public, pg_catalog')
        connection.close()
        periods.forget()

    yield move
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" RESET search_path')
        for function, _ in functions:
            cursor.execute(f"DROP FUNCTION IF EXISTS public.{function}()")
    connection.close()
    periods.forget()


def test_no_sweep_for_a_simulated_week_and_more_sends_go_on_and_nothing_is_lost(clock_ahead):
    service = ZeroLossMessageService(instance_id="after-the-week")
    zeroloss.send_many(QUEUE, [{"n": i} for i in range(3)], message_ids=["old0", "old1", "old2"])
    complete(service, ["old0"])
    before = partitions.database_now(connection)
    covered = partitions.coverage(connection)
    assert covered is not None
    clock_ahead(10)  # beyond the 8 days the periods ahead covered: no sweep ran meanwhile
    now = partitions.database_now(connection)
    assert now - before > dt.timedelta(days=10) - dt.timedelta(minutes=5)
    remove_periods(day_start(0))  # those an earlier test's jump created
    assert partitions.coverage(connection) is None
    sweep.PARTITIONS_CHECKED.clear()
    # Sends succeed: one at a time (autocommit), in a batch, in a transaction.
    assert zeroloss.send(QUEUE, {"n": "a"}, message_id="new0").created_at >= covered
    zeroloss.send_many(QUEUE, [{"n": "b"}, {"n": "c"}], message_ids=["new1", "new2"])
    with transaction.atomic():
        zeroloss.send(QUEUE, {"n": "d"}, message_id="new3")
    assert covers_ahead()
    # Claims continue, old messages and new; nothing lost.
    leases = service.claim(QUEUE, limit=10)
    assert sorted(lease.message_id for lease in leases) == ["new0", "new1", "new2", "new3", "old1", "old2"]
    for lease in leases:
        assert service.acknowledge(lease.message_id, lease.token)
    assert Message.objects.filter(status="completed").count() == 7 == Message.objects.count()
    report = verify()
    assert report["status"] == "ok", report


@pytest.mark.process
def test_a_worker_without_sweep_after_the_clock_moved_a_week_and_more_drains_old_and_new(clock_ahead):
    zeroloss.send_many(QUEUE, [{"n": i} for i in range(3)], message_ids=["before0", "before1", "before2"])
    clock_ahead(10)
    remove_periods(day_start(0))  # those an earlier test's jump created
    assert partitions.coverage(connection) is None
    zeroloss.send_many(QUEUE, [{"n": i} for i in range(3)], message_ids=["after0", "after1", "after2"])
    # a worker process (its connections see the moved clock too), no sweep: claims go on
    worker = db_worker("--queue", QUEUE, "--burst", "--no-sweep")
    assert worker.wait(120) == 0, worker.text[-3000:]
    statuses = dict(Message.objects.values_list("message_id", "status"))
    assert statuses == {
        mid: "completed" for mid in ("before0", "before1", "before2", "after0", "after1", "after2")
    }
    # the worker's own sends (none here) and the test's found their periods: covered ahead
    assert covers_ahead()
    report = verify()
    assert report["status"] == "ok", report


def test_the_check_and_the_health_warn_days_before_the_periods_ahead_run_out(client, settings):
    # Seven ahead: warned three days before they end (half of the default 3 is a day and a half,
    # which today's and tomorrow's partitions leave or not by the time of day).
    settings.ZEROLOSS = {**settings.ZEROLOSS, "PARTITIONS_AHEAD": 7}
    assert remove_periods(day_start(-3))  # today and the next two days left
    covered = partitions.coverage(connection)
    assert covered is not None
    left = covered - partitions.database_now(connection)
    assert dt.timedelta(days=2) < left <= dt.timedelta(days=3)
    warned = [m for m in run_checks(databases=["default"]) if m.id == "zeroloss.W042"]
    assert len(warned) == 1 and "the partitions ahead end at" in warned[0].msg, warned
    report = health_report(use_cache=False)
    assert report.healthy and report.checks["partitions"]["running_out"]
    assert report.warnings == [warned[0].msg.removeprefix("Database 'default': ").removesuffix(".")]
    response = client.get("/zeroloss/health/")
    assert response.status_code == 200 and response.json()["warnings"] == report.warnings
    # A send (or the sweep) creates the periods ahead: the warnings go.
    zeroloss.send(QUEUE, {"n": 1}, message_id="extends")
    assert covers_ahead()
    assert not [m for m in run_checks(databases=["default"]) if m.id == "zeroloss.W042"]
    report = health_report(use_cache=False)
    assert report.warnings == [] and not report.checks["partitions"]["running_out"]


@pytest.mark.process
def test_a_drop_while_a_worker_claims_takes_only_finished_backdated_rows_and_claims_go_on():
    """Rows backdated into expired periods, live ones among them (due, scheduled, dead), and a
    purge run while a real worker claims a backlog and its own retention turn drops periods too:
    the period of finished rows goes once (counted once), the one holding live rows stays, no
    live message is lost, each is handled once, and claims go on."""
    partitions.create_partitions(connection, day_start(12), day_start(9), DAY)
    service = ZeroLossMessageService(instance_id="purger")
    finished = [f"fin{i}" for i in range(6)]
    zeroloss.send_many(QUEUE, [{"n": m} for m in finished], message_ids=finished)
    complete(service, finished)
    zeroloss.send_many(QUEUE, [{"n": "due"}, {"n": "dead"}], message_ids=["due", "dead"])
    zeroloss.send(QUEUE, {"n": "later"}, message_id="later", delay=3600)
    service.dead_letter_messages(["dead"], reason="poison")
    move_to_day(finished[:3], 11)  # a period of finished rows only: dropped
    move_to_day([*finished[3:], "due", "later", "dead"], 10)  # live rows among finished: kept
    backlog = [f"new{i}" for i in range(400)]
    zeroloss.send_many(QUEUE, [{"n": m, "sleep": 0.02} for m in backlog], message_ids=backlog)
    kept, gone = (f"zeroloss_message_p{day_start(d):%Y%m%d}" for d in (10, 11))

    def completed() -> int:
        return Message.objects.filter(status=Status.COMPLETED, message_id__startswith="new").count()

    worker = db_worker("--queue", QUEUE)  # its retention turn is due: it drops periods too
    try:
        worker.wait_for("zeroloss_worker: queues", timeout=60)
        wait_for("the worker to complete messages", lambda: completed() > 0, 60)
        service.purge_messages(older_than=7 * DAY)
        # The drops ran while the worker claimed: it had not finished the backlog.
        assert completed() < len(backlog)
        wait_for(
            "the expired finished rows to go",
            lambda: gone not in names() and not Message.objects.filter(message_id__in=finished).exists(),
            60,
        )
        assert kept in names()
        assert service.purge_messages(older_than=7 * DAY) == 0
        wait_for("the worker to drain the backlog", lambda: completed() == len(backlog), 120)
        # Claims go on after the drop.
        zeroloss.send(QUEUE, {"n": "after"}, message_id="after")
        wait_for(
            "a message sent after the drop to complete",
            lambda: Message.objects.filter(message_id="after", status=Status.COMPLETED).exists(),
            60,
        )
    finally:
        worker.terminate()
    statuses = dict(Message.objects.values_list("message_id", "status"))
    assert statuses == {
        **dict.fromkeys([*backlog, "due", "after"], Status.COMPLETED),
        "later": Status.PENDING,
        "dead": Status.DEAD,
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT message_id, count(*) FROM demo_handledrecord GROUP BY message_id")
        handled = dict(cursor.fetchall())
    assert handled == dict.fromkeys([*backlog, "due", "after"], 1)
    # Each finished row counted once, whichever drop or batch took it.
    records = list(PurgeRecord.objects.values_list("status", "count"))
    assert {st for st, _ in records} == {"completed"} and sum(n for _, n in records) == 6, records
    report = verify()
    assert report["status"] == "ok", report


def test_a_drop_while_another_process_drops_takes_nothing_and_the_next_one_does():
    partitions.create_partitions(connection, day_start(12), day_start(9), DAY)
    service = ZeroLossMessageService(instance_id="purger")
    zeroloss.send(QUEUE, {"n": 1}, message_id="old")
    complete(service, ["old"])
    move_to_day(["old"], 10)
    part = f"zeroloss_message_p{day_start(10):%Y%m%d}"
    with psycopg.connect(database_url(), autocommit=True) as other:  # another process's drop
        other.execute("SELECT pg_advisory_lock(%s)", [partition_drops.DROP_LOCK])
        assert (
            partition_drops.drop_expired(
                connection, completed_before=day_start(7), dead_before=None, record=lambda counts: None
            )
            == []
        )
        assert part in names()
        # released here, not when the session's backend exits (that lags the client's close)
        other.execute("SELECT pg_advisory_unlock(%s)", [partition_drops.DROP_LOCK])
    dropped = partition_drops.drop_expired(
        connection, completed_before=day_start(7), dead_before=None, record=lambda counts: None
    )
    assert [d.name for d in dropped if d.total] == [part] and part not in names()
    assert partition_drops.delete_dropped_keys(connection) == 1  # and the detached table with them
    # The lock was released: a drop in another session takes it at once.
    with psycopg.connect(database_url(), autocommit=True) as other:
        assert other.execute("SELECT pg_try_advisory_lock(%s)", [partition_drops.DROP_LOCK]).fetchone() == (
            True,
        )
