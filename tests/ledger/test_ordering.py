"""Ordering keys, deduplication windows and priorities in the ledger (both databases)."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import IntegrityError, connection, transaction

import zeroloss
from tests.support import expire_leases, make_available
from zeroloss.exceptions import InvalidMessage
from zeroloss.ledger import partitions
from zeroloss.ledger.models import DedupKey, Message, MessageEvent, OrderingHead, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import CancelOutcome, Completion, Verdict

pytestmark = pytest.mark.django_db(transaction=True)


def heads(queue: str = "q") -> list[str]:
    """Messages of ordering keys that are claimable or processing."""
    return sorted(
        Message.objects.filter(
            queue_name=queue, status__in=["pending", "processing"], available_at__isnull=False
        )
        .exclude(ordering_key="")
        .values_list("message_id", flat=True)
    )


def claim_all(service: ZeroLossMessageService, queue: str = "q") -> list[str]:
    return [lease.message_id for lease in service.claim(queue, limit=100)]


class TestOrderingKeys:
    def test_one_message_per_key_at_a_time_in_persisted_order(self):
        service = ZeroLossMessageService(instance_id="w")
        for i in range(3):
            service.persist_message(f"a{i}", "q", {"i": i}, ordering_key="acct-a")
            service.persist_message(f"b{i}", "q", {"i": i}, ordering_key="acct-b")
        service.persist_message("free", "q", {})
        assert heads() == ["a0", "b0"]
        order: list[str] = []
        while True:
            leases = service.claim("q", limit=100)
            if not leases:
                break
            # Never two messages of one key in hand at once.
            keys = [x.ordering_key for x in leases if x.ordering_key]
            assert len(keys) == len(set(keys))
            order += [x.message_id for x in leases]
            report = service.record_outcomes(Completion(x, Verdict.ACKNOWLEDGE) for x in leases)
            assert sorted(report.acknowledged) == sorted(x.message_id for x in leases)
        assert [m for m in order if m.startswith("a")] == ["a0", "a1", "a2"]
        assert [m for m in order if m.startswith("b")] == ["b0", "b1", "b2"]
        assert "free" in order
        assert Message.objects.exclude(status=Status.COMPLETED).count() == 0

    def test_a_failing_head_blocks_its_key_until_it_goes_dead_then_the_next_proceeds(self):
        service = ZeroLossMessageService(instance_id="w", max_attempts=2)
        service.persist_message("k0", "q", {}, ordering_key="k")
        service.persist_message("k1", "q", {}, ordering_key="k")
        service.persist_message("other", "q", {}, ordering_key="j")
        [k0, other] = sorted(service.claim("q", limit=10), key=lambda x: x.message_id)
        assert (k0.message_id, other.message_id) == ("k0", "other")
        assert service.fail("k0", k0.token, "boom")
        assert claim_all(service) == []  # k0 backs off and still blocks k1
        make_available(["k0"])
        retry = service.claim_message("k0")
        assert retry and retry.attempt == 2
        assert service.fail("k0", retry.token, "boom again")  # attempts spent: dead
        assert Message.objects.get(message_id="k0").status == Status.DEAD
        assert claim_all(service) == ["k1"]  # the key moves on past its dead letter

    def test_an_expired_head_keeps_its_place_after_the_sweep(self):
        service = ZeroLossMessageService(instance_id="w")
        for i in range(3):
            service.persist_message(f"k{i}", "q", {}, ordering_key="k")
        assert claim_all(service) == ["k0"]
        expire_leases(["k0"])
        assert service.sweep().requeued == ["k0"]
        assert heads() == ["k0"]
        assert claim_all(service) == ["k0"]

    def test_dead_lettering_a_head_by_hand_releases_the_next(self):
        service = ZeroLossMessageService(instance_id="op")
        service.persist_message("k0", "q", {}, ordering_key="k")
        service.persist_message("k1", "q", {}, ordering_key="k")
        assert service.dead_letter_messages(["k0"], reason="poison") == ["k0"]
        assert heads() == ["k1"]

    def test_a_redriven_dead_letter_goes_back_behind_the_current_head(self):
        service = ZeroLossMessageService(instance_id="op", max_attempts=1)
        service.persist_message("k0", "q", {}, ordering_key="k")
        service.persist_message("k1", "q", {}, ordering_key="k")
        [k0] = service.claim("q")
        service.fail("k0", k0.token, "dead on first try")
        assert heads() == ["k1"]
        assert service.redrive_messages(["k0"]) == ["k0"]
        assert heads() == ["k1"]  # k1 is the head now; k0 waits for it
        [k1] = service.claim("q")
        assert service.acknowledge("k1", k1.token)
        assert heads() == ["k0"]

    def test_a_key_left_without_head_is_repaired_by_the_sweep(self):
        service = ZeroLossMessageService(instance_id="w")
        service.persist_message("k0", "q", {}, ordering_key="k")
        # What a process that died between its commit and its promotion leaves behind.
        Message.objects.filter(message_id="k0").update(
            available_at=None, updated_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
        )
        assert heads() == []
        assert service.sweep().keys_repaired == 1
        assert heads() == ["k0"]

    def test_the_database_refuses_a_second_head(self):
        service = ZeroLossMessageService()
        service.persist_message("k0", "q", {}, ordering_key="k")
        service.persist_message("k1", "q", {}, ordering_key="k")
        if partitions.is_partitioned(connection):
            # No unique index across partitions: the key's head row refuses a second head.
            k1 = Message.objects.get(message_id="k1")
            with pytest.raises(IntegrityError), transaction.atomic():
                OrderingHead.objects.create(
                    queue_name="q", ordering_key="k", message_pk=k1.pk, since=k1.created_at
                )
            return
        with pytest.raises(IntegrityError), transaction.atomic():
            Message.objects.filter(message_id="k1").update(available_at=dt.datetime.now(dt.UTC))

    def test_ordered_messages_sent_in_one_transaction_keep_their_order(self):
        service = ZeroLossMessageService()
        with transaction.atomic():
            service.persist_messages([(f"t{i}", "q", {}) for i in range(3)], ordering_key="k")
            assert heads() == []  # released only once the transaction commits
        assert heads() == ["t0"]

    def test_an_ordered_message_cannot_be_delayed(self):
        with pytest.raises(InvalidMessage, match="ordered message cannot be delayed"):
            ZeroLossMessageService().persist_message("x", "q", {}, ordering_key="k", delay=5)
        assert not Message.objects.exists()


class TestDedupWindows:
    def test_a_second_send_within_the_window_returns_the_first(self):
        service = ZeroLossMessageService(instance_id="api")
        first = service.persist_message("m1", "q", {"n": 1}, dedup_key="order-7")
        again = service.persist_message("m2", "q", {"n": 2}, dedup_key="order-7")
        assert again.pk == first.pk and again.message_id == "m1"
        assert not Message.objects.filter(message_id="m2").exists()
        absorbed = MessageEvent.objects.filter(reason="duplicate_absorbed").get()
        assert absorbed.message.message_id == "m1" and "m2" in absorbed.detail
        assert absorbed.from_status == absorbed.to_status == "pending"

    def test_after_the_window_a_new_message_is_created(self):
        service = ZeroLossMessageService()
        service.persist_message("m1", "q", {}, dedup_key="k", dedup_window=60)
        DedupKey.objects.update(expires_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        second = service.persist_message("m2", "q", {}, dedup_key="k", dedup_window=60)
        assert second.message_id == "m2"
        assert DedupKey.objects.get().message_id == "m2"

    def test_windows_are_per_queue_and_a_rollback_takes_the_window_with_it(self):
        service = ZeroLossMessageService()

        def failing_request() -> None:
            with transaction.atomic():
                service.persist_message("rolled", "q", {}, dedup_key="k")
                raise RuntimeError("the request failed")

        with pytest.raises(RuntimeError):
            failing_request()
        assert not DedupKey.objects.exists()
        assert service.persist_message("a", "q", {}, dedup_key="k").message_id == "a"
        assert service.persist_message("b", "other", {}, dedup_key="k").message_id == "b"

    def test_a_cancelled_message_holds_its_key_for_the_window_and_a_new_key_sends_anew(self):
        """docs/ordering.md: within the window a send with the key of a cancelled message returns
        that message, still cancelled (nothing new runs); a new key sends anew."""
        service = ZeroLossMessageService(instance_id="api")
        service.persist_message("m1", "q", {"op": "close"}, dedup_key="close-7")
        assert zeroloss.cancel("m1").outcome == CancelOutcome.CANCELLED
        again = service.persist_message("m2", "q", {"op": "close"}, dedup_key="close-7")
        assert (again.message_id, again.status) == ("m1", Status.CANCELLED)
        assert not Message.objects.filter(message_id="m2").exists()
        assert service.claim("q", limit=5) == []
        absorbed = MessageEvent.objects.filter(reason="duplicate_absorbed").get()
        assert absorbed.from_status == absorbed.to_status == "cancelled"
        fresh = service.persist_message("m3", "q", {"op": "close"}, dedup_key="close-7:2")
        assert (fresh.message_id, fresh.status) == ("m3", Status.PENDING)
        assert [m.message_id for m in service.claim("q", limit=5)] == ["m3"]

    def test_the_same_id_resent_is_plain_idempotency(self):
        service = ZeroLossMessageService()
        first = service.persist_message("m1", "q", {"x": 1}, dedup_key="k")
        assert service.persist_message("m1", "q", {"x": 1}, dedup_key="k").pk == first.pk
        assert not MessageEvent.objects.filter(reason="duplicate_absorbed").exists()


class TestPriority:
    def test_higher_priority_is_claimed_first_then_oldest(self):
        service = ZeroLossMessageService()
        service.persist_message("low", "q", {}, priority=-10)
        service.persist_message("old", "q", {})
        service.persist_message("urgent", "q", {}, priority=50)
        service.persist_message("new", "q", {})
        assert [x.message_id for x in service.claim("q", limit=4)] == ["urgent", "old", "new", "low"]

    @pytest.mark.parametrize("bad", [101, -101, 1.5, True, "1"])
    def test_out_of_range_priority_is_refused(self, bad):
        with pytest.raises(InvalidMessage, match="priority"):
            ZeroLossMessageService().persist_message("x", "q", {}, priority=bad)
        assert not Message.objects.exists()


@pytest.mark.postgres_only
def test_claims_use_the_claim_index_even_behind_a_blocked_key():
    service = ZeroLossMessageService()
    service.persist_messages([(f"w{i}", "q", {}) for i in range(2000)], ordering_key="blocked")
    service.claim("q")  # the head is in hand: 1,999 wait behind it
    service.persist_messages([(f"u{i}", "q", {}) for i in range(50)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE zeroloss_message")
        cursor.execute(
            "EXPLAIN (FORMAT TEXT) SELECT id FROM zeroloss_message WHERE status = 'pending' AND queue_name = 'q' "
            "AND available_at <= statement_timestamp() ORDER BY priority DESC, available_at, id LIMIT 10"
        )
        plan = "\n".join(r[0] for r in cursor.fetchall())
    assert "zeroloss_msg_claim_idx" in plan, plan


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_promotion_finds_a_keys_head_through_the_unique_head_index():
    """Regression: the head lookup omitted ``ordering_key <> ''``, the unique head index's own
    condition, so PostgreSQL could not use that index and scanned the queue's pending rows for
    every finished message: ordered drains ran at 450 msg/s (100 keys) instead of 6,800."""
    service = ZeroLossMessageService()
    service.persist_messages([(f"a{i}", "q", {}) for i in range(3)], ordering_key="acct")
    engine = service.engine
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")  # any usable index wins
        rows, _ = engine.execute(
            connection, "EXPLAIN " + engine.sql["PROMOTE"], engine.batch(q=["q"], k=["acct"])
        )
    plan = "\n".join(r[0] for r in rows)
    # The message table's unique head index, or (partitioned) each partition's head index.
    assert re.search(r"zeroloss_ordering_head_uniq|zeroloss_msg_head_idx_p\d+", plan), plan
    # Every statement that looks for a key's head states the index's condition.
    head_lookup = "h.status IN ('pending', 'processing') AND h.available_at IS NOT NULL"
    for text in engine.sql.values():  # PROMOTE_FINISHED too: the promotion inside a move
        if head_lookup in text:
            assert "h.ordering_key <> ''" in text, text
