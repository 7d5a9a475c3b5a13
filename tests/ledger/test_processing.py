"""The worker's processing path, in-process (real threads, real database): batched outcomes,
transactional batches, handlers that misbehave, leases lost while a handler runs."""

from __future__ import annotations

import sys
import threading

import pytest
from django.contrib.auth.models import Group
from django.db import DatabaseError, IntegrityError, connection, transaction

from tests.support import expire_leases, finish, register, run_worker
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until
from zeroloss.ledger.types import Completion, Verdict
from zeroloss.runtime.handlers import get_handler
from zeroloss.runtime.processing import LEFT_TRANSACTION_FAILED, Delivery, describe_error
from zeroloss.runtime.worker.keeper import Batch, LeaseKeeper
from zeroloss.runtime.worker.transactional import CAREFUL_BATCHES, TransactionalBatches

pytestmark = pytest.mark.django_db(transaction=True)


def reasons(message_id: str) -> list[str]:
    return list(MessageEvent.objects.for_message(message_id).values_list("reason", flat=True))


class TestOutcomes:
    def test_a_batch_is_acknowledged_with_one_statement_and_results_are_stored(self):
        def double(delivery: Delivery) -> int:
            return delivery.payload["n"] * 2

        register("p.double", double, store_result=True)
        service = ZeroLossMessageService()
        service.persist_messages([(f"d{i}", "p.double", {"n": i}) for i in range(40)])
        worker, thread = run_worker("p.double", burst=True)
        thread.join(60)
        assert worker.stats.outcomes["completed"] == 40
        assert dict(Message.objects.values_list("message_id", "result"))["d7"] == 14
        assert Message.objects.exclude(status=Status.COMPLETED).count() == 0
        # Batched: the 40 acknowledgements share far fewer timestamps than there are messages.
        stamps = set(MessageEvent.objects.filter(reason="acknowledged").values_list("created_at", flat=True))
        assert len(stamps) < 40

    def test_a_handler_calling_sys_exit_is_a_failed_attempt_not_a_dead_worker(self):
        def exits(delivery: Delivery) -> None:
            if delivery.payload["exit"]:
                sys.exit(3)

        register("p.exit", exits)
        service = ZeroLossMessageService(max_attempts=1)
        service.persist_message("bad", "p.exit", {"exit": True}, max_attempts=1)
        service.persist_messages([(f"ok{i}", "p.exit", {"exit": False}) for i in range(5)])
        worker, thread = run_worker("p.exit", burst=True)
        thread.join(60)
        assert not worker.stats.crashed
        bad = Message.objects.get(message_id="bad")
        assert bad.status == Status.DEAD and bad.last_error.startswith("SystemExit: 3")
        assert Message.objects.filter(status=Status.COMPLETED).count() == 5

    def test_error_texts_with_nul_and_lone_surrogates_are_recorded(self):
        def nasty(delivery: Delivery) -> None:
            raise ValueError("bad\x00byte and \udcff surrogate")

        register("p.nasty", nasty)
        service = ZeroLossMessageService()
        service.persist_message("n1", "p.nasty", {}, max_attempts=1)
        service.persist_message("n2", "p.nasty", {}, max_attempts=1)
        worker, thread = run_worker("p.nasty", burst=True)
        thread.join(60)
        assert not worker.stats.crashed
        errors = dict(Message.objects.values_list("message_id", "last_error"))
        for text in errors.values():
            assert text.startswith("ValueError: bad\\x00byte and \\udcff surrogate")
        assert set(Message.objects.values_list("status", flat=True)) == {"dead"}

    def test_describe_error_names_the_class_path_and_keeps_the_traceback(self):
        try:
            Group.objects.get(name="nobody")
        except Group.DoesNotExist as exc:
            text = describe_error(exc)
        first, _, rest = text.partition("\n")
        assert first.startswith("django.contrib.auth.models.Group.DoesNotExist:") or first.startswith(
            "django.contrib.auth.models.DoesNotExist:"
        )
        assert "Traceback (most recent call last)" in rest


class TestTransactionalBatches:
    def test_effects_commit_with_their_acknowledgements_and_a_failure_rolls_back_only_itself(self):
        def create_group(delivery: Delivery) -> None:
            Group.objects.create(name=delivery.payload["name"])
            if delivery.payload.get("fail"):
                raise RuntimeError("after its write")

        register("p.tx", create_group, transactional=True)
        service = ZeroLossMessageService(max_attempts=1)
        service.persist_messages([(f"g{i}", "p.tx", {"name": f"group-{i}"}) for i in range(10)])
        service.persist_message("gbad", "p.tx", {"name": "group-bad", "fail": True}, max_attempts=1)
        _worker, thread = run_worker("p.tx", burst=True)
        thread.join(60)
        assert sorted(Group.objects.values_list("name", flat=True)) == sorted(f"group-{i}" for i in range(10))
        assert Message.objects.get(message_id="gbad").status == Status.DEAD
        assert Message.objects.filter(status=Status.COMPLETED).count() == 10

    def test_a_failed_handlers_on_commit_callbacks_are_dropped_with_its_writes(self):
        fired: list[str] = []

        def notify_then_maybe_fail(delivery: Delivery) -> None:
            Group.objects.create(name=delivery.message_id)
            transaction.on_commit(lambda: fired.append(delivery.message_id))
            if delivery.payload.get("fail"):
                raise RuntimeError("after registering its callback")

        register("p.txcb", notify_then_maybe_fail, transactional=True)
        service = ZeroLossMessageService(max_attempts=1)
        service.persist_messages([(f"cb{i}", "p.txcb", {"fail": i == 2}) for i in range(5)], max_attempts=1)
        _worker, thread = run_worker("p.txcb", burst=True)
        thread.join(60)
        assert sorted(fired) == ["cb0", "cb1", "cb3", "cb4"]
        assert sorted(Group.objects.values_list("name", flat=True)) == ["cb0", "cb1", "cb3", "cb4"]
        assert Message.objects.get(message_id="cb2").status == Status.DEAD

    def test_a_handler_that_swallows_a_database_error_fails_alone(self):
        def swallow(delivery: Delivery) -> None:
            Group.objects.create(name=delivery.message_id)
            if delivery.payload.get("swallow"):
                try:
                    with transaction.atomic(savepoint=False):
                        Group.objects.create(name=delivery.message_id)  # a duplicate name
                except IntegrityError:
                    pass  # the transaction now needs a rollback the handler never did

        register("p.txswallow", swallow, transactional=True)
        service = ZeroLossMessageService(max_attempts=1)
        service.persist_messages(
            [(f"sw{i}", "p.txswallow", {"swallow": i == 1}) for i in range(4)], max_attempts=1
        )
        worker, thread = run_worker("p.txswallow", burst=True)
        thread.join(60)
        assert not worker.stats.crashed
        assert sorted(Group.objects.values_list("name", flat=True)) == ["sw0", "sw2", "sw3"]
        bad = Message.objects.get(message_id="sw1")
        assert bad.status == Status.DEAD and bad.last_error == LEFT_TRANSACTION_FAILED
        assert Message.objects.filter(status=Status.COMPLETED).count() == 3

    @pytest.mark.postgres_only
    def test_a_handler_that_catches_a_failed_statement_fails_alone(self):
        def catch(delivery: Delivery) -> None:
            Group.objects.create(name=delivery.message_id)
            if delivery.payload.get("catch"):
                try:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT 1/0")
                except DatabaseError:
                    pass  # PostgreSQL now refuses every statement of this transaction

        register("p.txcatch", catch, transactional=True)
        service = ZeroLossMessageService(max_attempts=1)
        service.persist_messages(
            [(f"ct{i}", "p.txcatch", {"catch": i == 0}) for i in range(3)], max_attempts=1
        )
        worker, thread = run_worker("p.txcatch", burst=True)
        thread.join(60)
        assert not worker.stats.crashed
        assert sorted(Group.objects.values_list("name", flat=True)) == ["ct1", "ct2"]
        bad = Message.objects.get(message_id="ct0")
        assert bad.status == Status.DEAD and bad.last_error == LEFT_TRANSACTION_FAILED

    def test_a_failure_reruns_the_batch_with_savepoints_and_the_next_batches_keep_them(self):
        calls: list[str] = []

        def create(delivery: Delivery) -> None:
            calls.append(delivery.message_id)
            Group.objects.create(name=delivery.message_id)
            if delivery.payload.get("fail"):
                raise RuntimeError("fails after its write")

        register("p.txrerun", create, transactional=True)
        service = ZeroLossMessageService(instance_id="txrerun", max_attempts=1)
        service.persist_messages([(f"r{i}", "p.txrerun", {"fail": i == 2}) for i in range(4)], max_attempts=1)
        service.persist_messages([(f"s{i}", "p.txrerun", {"fail": i == 0}) for i in range(3)], max_attempts=1)
        keeper = LeaseKeeper(service, interval=60)  # not started: the leases are long enough
        batches = TransactionalBatches(service, keeper, stopping=lambda: False)
        paces: list[float] = []
        first = service.claim("p.txrerun", limit=4)
        keeper.hold(first, batch := Batch(first))
        report = batches.run(get_handler("p.txrerun"), batch, paces.append)
        # r0 and r1 ran, then r2 failed and rolled the batch back: the rerun used savepoints,
        # did not call r2 again, and ran r0, r1 and r3 once more.
        assert calls == ["r0", "r1", "r2", "r0", "r1", "r3"]
        assert batches.reruns == 1 and batches.careful["p.txrerun"] == CAREFUL_BATCHES
        assert sorted(report.acknowledged) == ["r0", "r1", "r3"] and report.dead_lettered == ["r2"]
        assert len(paces) == 6  # every handler run paces the claims, the rolled-back ones too
        calls.clear()
        second = service.claim("p.txrerun", limit=3)
        keeper.hold(second, batch := Batch(second))
        report = batches.run(get_handler("p.txrerun"), batch, paces.append)
        # The next batch kept its savepoints: s0's failure rolled back only itself, nothing ran twice.
        assert calls == ["s0", "s1", "s2"] and batches.reruns == 1
        assert sorted(report.acknowledged) == ["s1", "s2"] and report.dead_lettered == ["s0"]
        assert batches.careful["p.txrerun"] == CAREFUL_BATCHES - 1
        assert sorted(Group.objects.values_list("name", flat=True)) == ["r0", "r1", "r3", "s1", "s2"]
        assert reasons("r0") == ["persisted", "claimed", "acknowledged"]

    @pytest.mark.postgres_only
    def test_a_connection_lost_inside_a_handler_fails_it_alone_and_gives_back_the_others(self):
        import psycopg

        ran: list[str] = []

        def lose_the_connection(delivery: Delivery) -> None:
            ran.append(delivery.message_id)
            Group.objects.create(name=delivery.message_id)
            if delivery.message_id != "gone1":
                return
            pid = connection.connection.info.backend_pid
            params = connection.get_connection_params()
            with psycopg.connect(
                dbname=params["dbname"],
                host=params.get("host"),
                port=params.get("port"),
                user=params.get("user"),
                autocommit=True,
            ) as other:
                other.execute("SELECT pg_terminate_backend(%s)", [pid])
            Group.objects.create(name="after")  # fails: the server ended this session

        register("p.txgone", lose_the_connection, transactional=True)
        service = ZeroLossMessageService(instance_id="txgone")
        service.persist_messages([(f"gone{i}", "p.txgone", {}) for i in range(3)])
        keeper = LeaseKeeper(service, interval=60)
        batches = TransactionalBatches(service, keeper, stopping=lambda: False)
        leases = service.claim("p.txgone", limit=3)
        keeper.hold(leases, batch := Batch(leases))
        paces: list[float] = []
        report = batches.run(get_handler("p.txgone"), batch, paces.append)
        # Nothing of the transaction landed; the handler that lost it fails alone, paced, and
        # the one that ran before it goes back unstarted (no attempt spent); the rest of the
        # claim is still the batch's, for its next transaction.
        assert ran == ["gone0", "gone1"] and len(paces) == 2
        assert report.retrying == ["gone1"] and report.released == ["gone0"] and batch.has_more
        assert not Group.objects.exists()
        assert reasons("gone0") == ["persisted", "claimed", "released"]
        assert Message.objects.get(message_id="gone0").attempts == 0
        failed = Message.objects.get(message_id="gone1")
        assert failed.status == Status.PENDING and failed.attempts == 1
        assert "connection was lost" in failed.last_error

    def test_a_message_whose_lease_was_lost_before_its_turn_never_runs(self):
        ran: list[str] = []

        def record(delivery: Delivery) -> None:
            ran.append(delivery.message_id)
            Group.objects.create(name=delivery.message_id)

        register("p.txlost", record, transactional=True)
        service = ZeroLossMessageService(instance_id="batch")
        service.persist_messages([("l0", "p.txlost", {}), ("l1", "p.txlost", {})])
        leases = service.claim("p.txlost", limit=2)
        operator = ZeroLossMessageService(instance_id="op")
        assert operator.requeue_messages(["l1"], force=True) == ["l1"]  # revoked before the batch ran
        with transaction.atomic():
            held = service.lock_held(leases)
            assert held == {"l0"}
            report = service.record_outcomes([Completion(leases[0], Verdict.ACKNOWLEDGE)], locked=True)
        assert report.acknowledged == ["l0"]
        assert reasons("l1")[-1] == "requeued_by_operator"


class TestLeases:
    def test_unstarted_messages_are_not_held_behind_a_hung_handler(self, settings):
        # The keeper gives them back after one heartbeat behind h0: a short one, set before it starts.
        settings.ZEROLOSS = {**settings.ZEROLOSS, "HEARTBEAT_INTERVAL": 0.05}
        release = threading.Event()

        def slow(delivery: Delivery) -> None:
            if delivery.payload["hang"]:
                release.wait(30)

        register("p.hang", slow)
        service = ZeroLossMessageService(ack_timeout=3)
        service.persist_message("h0", "p.hang", {"hang": True})
        service.persist_messages([(f"h{i}", "p.hang", {"hang": False}) for i in range(1, 6)])
        worker, thread = run_worker("p.hang", batch_size=6)
        try:
            # A second worker takes the five the first one had claimed behind h0.
            assert wait_until(
                lambda: MessageEvent.objects.filter(reason="released").count() >= 1, timeout=20
            ), worker.stats
            other = ZeroLossMessageService(instance_id="other")
            taken = [x.message_id for x in other.claim("p.hang", limit=10)]
            assert taken and "h0" not in taken
            assert Message.objects.get(message_id="h0").status == Status.PROCESSING  # still in hand
            released = Message.objects.filter(message_id__in=taken)
            assert all(m.attempts == 1 for m in released)  # the release refunded the unused attempt
        finally:
            release.set()
            finish(worker, thread)

    def test_a_stale_worker_cannot_record_an_outcome_and_is_told(self):
        def ok(delivery: Delivery) -> None:
            pass

        register("p.stale", ok)
        service = ZeroLossMessageService(instance_id="stale")
        service.persist_message("s1", "p.stale", {})
        [lease] = service.claim("p.stale")
        expire_leases(["s1"])
        assert ZeroLossMessageService().sweep().requeued == ["s1"]
        report = service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)])
        assert report.refused == ["s1"] and report.acknowledged == []
        assert Message.objects.get().status == Status.PENDING

    def test_delivery_lease_lost_turns_true_when_the_lease_lapses_unrenewed(self):
        seen: list[bool] = []
        started = threading.Event()
        proceed = threading.Event()

        def watch(delivery: Delivery) -> None:
            started.set()
            proceed.wait(30)
            seen.append(delivery.lease_lost)

        register("p.watch", watch)
        ZeroLossMessageService().persist_message("w1", "p.watch", {})
        worker, thread = run_worker("p.watch")
        try:
            assert started.wait(20)
            with worker.keeper._lock:  # what the keeper learns when a renewal is refused
                worker.keeper.lost.add("w1")
            proceed.set()
            assert wait_until(lambda: bool(seen), timeout=20)
            assert seen == [True]
        finally:
            proceed.set()
            finish(worker, thread)


@pytest.mark.postgres_only
def test_a_worker_thread_rides_out_a_terminated_connection():
    def ok(delivery: Delivery) -> None:
        pass

    register("p.term", ok)
    service = ZeroLossMessageService()
    worker, thread = run_worker("p.term")
    try:
        service.persist_message("t0", "p.term", {})
        assert wait_until(lambda: Message.objects.filter(status="completed").count() == 1, timeout=20)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        service.persist_message("t1", "p.term", {})
        assert wait_until(lambda: Message.objects.filter(status="completed").count() == 2, timeout=30)
        assert not worker.stats.crashed and thread.is_alive()
    finally:
        finish(worker, thread)
