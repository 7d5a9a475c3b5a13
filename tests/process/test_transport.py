"""Celery as transport, the database as record: real Redis broker, real Celery and
``zeroloss_worker`` processes, killed with SIGKILL where the test says so."""

from __future__ import annotations

import collections
import io
import time

import pytest
from django.core.management import call_command
from django.db import connection, transaction

import zeroloss
from project.demo.models import HandledRecord
from tests.support import expire_leases
from tests.support.celery import REDIS_URL, use_broker
from tests.support.processes import celery_beat, celery_worker, db_worker
from tests.support.waiting import wait_for
from zeroloss.exceptions import UnknownQueue
from zeroloss.integrations.celery.tasks import beat_schedule_entry, deliver_message
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def handled_counts(queue: str) -> collections.Counter[str]:
    return collections.Counter(
        HandledRecord.objects.filter(queue_name=queue).values_list("message_id", flat=True)
    )


def all_completed(n: int) -> bool:
    return Message.objects.filter(status=Status.COMPLETED).count() >= n


def test_only_committed_sends_are_handled_each_exactly_once(broker, procs):
    procs.append(celery_worker(REDIS_URL))
    for batch in range(10):
        try:
            with transaction.atomic():
                for i in range(100):
                    zeroloss.send("demo.record_tx", {"batch": batch, "i": i}, message_id=f"b{batch}-{i}")
                if batch == 3:
                    raise RuntimeError("the business transaction failed")
        except RuntimeError:
            pass
    assert Message.objects.count() == 900
    assert wait_until(lambda: all_completed(900), timeout=120), procs[0].text[-3000:]
    counts = handled_counts("demo.record_tx")
    assert len(counts) == 900 and set(counts.values()) == {1}
    assert not any(mid.startswith("b3-") for mid in counts)
    assert MessageEvent.objects.filter(reason="acknowledged").count() == 900


def test_duplicate_delivery_runs_handler_once(broker, procs):
    message = zeroloss.send("demo.record", {"sleep": 0.3}, message_id="dup-1")
    deliver_message.apply_async(args=(message.message_id,))
    deliver_message.apply_async(args=(message.message_id,))
    procs.append(celery_worker(REDIS_URL, concurrency=3))
    assert wait_until(lambda: all_completed(1), timeout=30)
    # the duplicates arrive and are absorbed: every delivery's task has finished
    wait_for(lambda: procs[0].text[-3000:], lambda: procs[0].text.count("succeeded") >= 3, 30)
    assert handled_counts("demo.record") == {"dup-1": 1}
    assert MessageEvent.objects.filter(reason="claimed").count() == 1
    assert procs[0].text.count("succeeded") >= 3  # all three deliveries ran; two were absorbed


def test_sigkilled_celery_worker_loses_nothing(broker, procs, settings):
    env = {"ZEROLOSS_SWEEP_INTERVAL": "0.5", "ZEROLOSS_REDISPATCH_AFTER": "2"}
    settings.ZEROLOSS = {**settings.ZEROLOSS, "REDISPATCH_AFTER": 2.0}
    first = celery_worker(REDIS_URL, concurrency=2, **env)
    procs.append(first)
    # The last 100 take 0.25 s each (~12 s on two processes), so the kill after the first 20 lands
    # while some run even when this process is slow to see them done (a loaded machine once
    # let 0.02 s handlers finish all 120 before it looked).
    for i in range(120):
        zeroloss.send("demo.record_tx", {"i": i, "sleep": 0.02 if i < 20 else 0.25}, message_id=f"k{i}")
    assert wait_until(lambda: Message.objects.filter(status=Status.COMPLETED).count() >= 20, timeout=60)
    first.sigkill_group()
    in_flight = set(Message.objects.filter(status=Status.PROCESSING).values_list("message_id", flat=True))
    assert Message.objects.exclude(status=Status.COMPLETED).exists(), (
        "the kill came too late to test anything"
    )
    expire_leases(in_flight)  # the dead worker's leases run out (the database clock decides)
    procs.append(celery_worker(REDIS_URL, concurrency=2, name="w2", **env))
    from zeroloss.integrations.celery.tasks import sweep

    def recovered() -> bool:
        sweep.apply()  # the beat task's body, run here so the test controls the clock
        return all_completed(120)

    assert wait_until(recovered, timeout=120, interval=0.5), procs[-1].text[-3000:]
    counts = handled_counts("demo.record_tx")
    assert len(counts) == 120 and set(counts.values()) == {1}
    expired = collections.Counter(
        MessageEvent.objects.filter(reason="lease_expired").values_list("message__message_id", flat=True)
    )
    assert set(expired) == in_flight
    assert set(expired.values()) <= {1}
    assert Message.objects.filter(status=Status.COMPLETED).count() == 120


def test_broker_flush_loses_no_message(broker, procs, settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "REDISPATCH_AFTER": 1.0}
    for i in range(200):
        zeroloss.send("demo.record", {"i": i, "sleep": 0.005}, message_id=f"f{i}")
    procs.append(celery_worker(REDIS_URL, concurrency=2, ZEROLOSS_REDISPATCH_AFTER="1"))
    assert wait_until(lambda: Message.objects.filter(status=Status.COMPLETED).count() >= 10, timeout=60)
    broker.flushdb()  # the broker loses every queued task
    assert Message.objects.exclude(status=Status.COMPLETED).count() > 0
    from zeroloss.integrations.celery.tasks import sweep

    def drained() -> bool:
        sweep.apply()
        return all_completed(200)

    assert wait_until(drained, timeout=90, interval=0.5), procs[0].text[-3000:]
    assert set(handled_counts("demo.record")) == {f"f{i}" for i in range(200)}


def test_send_while_broker_is_down_is_stored_and_dispatched_later(broker, procs):
    use_broker("redis://127.0.0.1:9/0")  # nothing listens there
    started = time.monotonic()
    message = zeroloss.send("demo.record", {"x": 1}, message_id="offline-1")
    assert time.monotonic() - started < 10
    assert Message.objects.get(message_id="offline-1").dispatched_at is None
    use_broker(REDIS_URL)
    procs.append(celery_worker(REDIS_URL))

    def swept_and_done() -> bool:
        call_command("zeroloss_sweep", stdout=io.StringIO())  # the ops command republishes too
        return all_completed(1)

    assert wait_until(swept_and_done, timeout=30, interval=0.5)
    assert handled_counts("demo.record") == {message.message_id: 1}


def test_send_rejects_unknown_queue_and_writes_nothing(broker):
    with pytest.raises(UnknownQueue, match="no-such-queue"):
        zeroloss.send("no-such-queue", {})
    assert Message.objects.count() == 0


def test_beat_runs_the_sweep(broker, procs, tmp_path, settings):
    claimer = ZeroLossMessageService()
    claimer.persist_messages([(f"orphan{i}", "demo.record", {"i": i}) for i in range(5)])
    assert len(claimer.claim("demo.record", limit=5)) == 5  # claimed, then the claimer "dies"
    assert expire_leases([f"orphan{i}" for i in range(5)]) == 5
    procs.append(celery_worker(REDIS_URL, ZEROLOSS_SWEEP_INTERVAL="0.5", ZEROLOSS_REDISPATCH_AFTER="1"))
    beat = celery_beat(REDIS_URL, tmp_path, ZEROLOSS_SWEEP_INTERVAL="0.5", ZEROLOSS_REDISPATCH_AFTER="1")
    procs.append(beat)
    assert wait_until(lambda: all_completed(5), timeout=60), beat.text[-3000:]
    sweeps = MessageEvent.objects.filter(reason="lease_expired")
    assert sweeps.count() == 5 and all(e.actor.startswith("sweep@") for e in sweeps)
    assert "zeroloss.sweep" in beat.text
    assert beat_schedule_entry(3)["zeroloss-sweep"]["schedule"] == 3


def test_db_worker_handles_everything_once_and_survives_sigkill(procs):
    service = ZeroLossMessageService()
    service.persist_messages([(f"d{i}", "demo.record_tx", {"i": i, "sleep": 0.03}) for i in range(150)])
    # A long lease: the dead worker's run out by expire_leases(), never the living one's on a
    # loaded machine (the keeper renews, but a 5 s lease can lapse under a saturated SQLite lock).
    env = {"ZEROLOSS_SWEEP_INTERVAL": "0.3", "ZEROLOSS_ACK_TIMEOUT": "60"}

    def processing() -> set[str]:
        return set(Message.objects.filter(status=Status.PROCESSING).values_list("message_id", flat=True))

    # A kill can land between one batch's commit and the next claim (on SQLite the claim waits
    # for the other thread's batch to release the write lock): then nothing was in flight, and
    # the kill proves nothing. Kill again, later in the drain, until one finds work in hand.
    in_flight: set[str] = set()
    for attempt in range(1, 4):
        first = db_worker("--queue", "demo.record_tx", "--concurrency", "2", "--batch-size", "5", **env)
        procs.append(first)
        assert wait_until(
            lambda n=attempt: (
                Message.objects.filter(status=Status.COMPLETED).count() >= 20 * n and processing()
            ),
            timeout=60,
            interval=0.01,
        ), first.text
        first.sigkill_group()
        in_flight = processing()
        if in_flight:
            break
    assert in_flight, "three kills found no message in flight"
    assert expire_leases(in_flight) == len(in_flight)  # the dead worker's leases run out
    second = db_worker("--queue", "demo.record_tx", "--concurrency", "2", "--burst", **env)
    procs.append(second)
    assert second.popen.wait(timeout=120) == 0, second.text
    counts = handled_counts("demo.record_tx")
    assert len(counts) == 150 and set(counts.values()) == {1}
    expired = collections.Counter(
        MessageEvent.objects.filter(reason="lease_expired").values_list("message__message_id", flat=True)
    )
    assert set(expired) == in_flight and set(expired.values()) == {1}


def test_two_db_workers_never_run_a_message_twice(procs):
    # Both workers are up and idle before the messages are stored: with messages stored first,
    # the worker that started sooner could drain them all before the other had started.
    workers = [
        db_worker("--queue", "demo.record", "--batch-size", "7", "--poll-interval", "0.2") for _ in range(2)
    ]
    procs.extend(workers)
    for w in workers:
        w.wait_for("zeroloss_worker: queues")
    service = ZeroLossMessageService()
    service.persist_messages([(f"p{i}", "demo.record", {"i": i, "sleep": 0.005}) for i in range(300)])
    assert wait_until(lambda: HandledRecord.objects.count() >= 300, timeout=120), [w.text for w in workers]
    for w in workers:
        assert w.terminate() == 0, w.text
    counts = handled_counts("demo.record")
    assert len(counts) == 300 and set(counts.values()) == {1}
    if connection.vendor == "postgresql":
        # SQLite serialises writers on one lock, so there one worker may drain the queue alone.
        assert len(set(HandledRecord.objects.values_list("worker", flat=True))) == 2


def test_db_worker_sigterm_releases_unstarted_batch(procs):
    service = ZeroLossMessageService()
    service.persist_messages([(f"s{i}", "demo.record", {"i": i, "sleep": 0.2}) for i in range(20)])
    worker = db_worker("--queue", "demo.record", "--batch-size", "10", "--no-sweep")
    procs.append(worker)
    assert wait_until(lambda: HandledRecord.objects.count() >= 1, timeout=30), worker.text
    assert worker.terminate() == 0, worker.text
    assert Message.objects.filter(status=Status.PROCESSING).count() == 0
    released = MessageEvent.objects.filter(reason="released").count()
    assert released >= 1
    pending = Message.objects.filter(status=Status.PENDING)
    assert all(m.attempts == 0 for m in pending)
    assert pending.count() + Message.objects.filter(status=Status.COMPLETED).count() == 20


def test_worker_rejects_unknown_queue():
    proc = db_worker("--queue", "nope")
    assert proc.popen.wait(timeout=30) == 2
    assert "No handler is registered for queue(s) nope" in proc.text


@pytest.mark.postgres_only
def test_idle_db_worker_wakes_on_notify_not_on_poll(procs):
    worker = db_worker("--queue", "demo.record", "--poll-interval", "60", "--no-sweep")
    procs.append(worker)
    service = ZeroLossMessageService()

    def idle_and_listening() -> bool:
        # Its LISTEN session is open, and a claim of it has run and found nothing: from here on
        # it waits up to 60 s between polls. (A claim outside the worker's outcome transaction
        # runs in one of its own, ended by a COMMIT: Leases._planned_claim.)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT bool_or(query LIKE 'LISTEN %%'), bool_or((query LIKE '%%zeroloss_message%%' "
                "OR query = 'COMMIT') AND state = 'idle') FROM pg_stat_activity WHERE "
                "datname = current_database() AND pid <> pg_backend_pid()"
            )
            listening, claimed = cursor.fetchone()
        return bool(listening and claimed)

    worker.wait_for("zeroloss_worker: queues", 60)
    wait_for(lambda: f"the worker idle and listening:\n{worker.text}", idle_and_listening, 60)
    started = time.monotonic()
    service.persist_message("wake-1", "demo.record", {})
    assert wait_until(lambda: all_completed(1), timeout=20), worker.text
    assert time.monotonic() - started < 10  # far below the 60 s poll interval


@pytest.mark.postgres_only
def test_db_worker_rides_out_killed_connections_and_keeps_draining(procs):
    worker = db_worker("--queue", "demo.record", "--poll-interval", "0.1")
    procs.append(worker)
    service = ZeroLossMessageService()
    service.persist_message("before", "demo.record", {})
    assert wait_until(lambda: all_completed(1), timeout=30), worker.text
    for round_ in range(3):  # every session of the worker, three times over
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = ''"
            )
            assert cursor.fetchone()[0] >= 1
        service.persist_message(f"after-{round_}", "demo.record", {})
        assert wait_until(lambda n=round_ + 2: all_completed(n), timeout=30), worker.text
    assert worker.popen.poll() is None, worker.text  # still running: nobody had to restart it
    assert "unreachable since" in worker.text and "reachable again" in worker.text
    assert "Traceback" not in worker.text and "crashed" not in worker.text
    assert worker.terminate() == 0, worker.text
