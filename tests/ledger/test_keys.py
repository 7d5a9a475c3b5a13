"""Blocked ordering keys: what the ledger reports, and an operator skipping or requeueing a head."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connections

from tests.support import expire_leases, make_available
from tests.support.cli import run
from tests.support.factories import blocked_ledger, clear_cache
from zeroloss.exceptions import InvalidMessage
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import KeyWhy

pytestmark = pytest.mark.django_db(transaction=True)

BLOCKED_KEY_FIELDS = {
    "queue",
    "key",
    "head_message_id",
    "head_status",
    "why",
    "detail",
    "since",
    "blocked_for",
    "behind",
    "attempts",
    "max_attempts",
    "claimed_by",
    "last_error",
    "until",
    "now",
}


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def event(message_id: str) -> MessageEvent:
    last = MessageEvent.objects.for_message(message_id).last()
    assert last is not None
    return last


class TestBlockedKeys:
    def test_lists_processing_and_backoff_heads_with_counts_and_why(self):
        blocked_ledger()
        service = ZeroLossMessageService()
        found = {(k.queue_name, k.ordering_key): k for k in service.blocked_keys()}
        assert set(found) == {("q", "busy"), ("q", "failing"), ("other", "busy")}
        busy = found["q", "busy"]
        assert (busy.message_id, busy.status, busy.why, busy.behind) == (
            "b0",
            "processing",
            KeyWhy.PROCESSING,
            3,
        )
        assert busy.claimed_by == "worker-1"
        assert busy.since == Message.objects.get(message_id="b0").started_at
        assert busy.blocked and "processing by worker-1 (attempt 1/5)" in busy.detail
        failing = found["q", "failing"]
        assert (failing.message_id, failing.status, failing.why, failing.behind) == (
            "f0",
            "pending",
            KeyWhy.RETRY_BACKOFF,
            2,
        )
        f0 = Message.objects.get(message_id="f0")
        assert failing.since == f0.updated_at
        assert failing.until == f0.available_at
        assert failing.last_error == "upstream said 503"
        assert "attempt 1/5 failed" in failing.detail and "upstream said 503" in failing.detail
        assert found["other", "busy"].behind == 1
        # Longest blocked first (f0 failed after b0 and o0 were claimed).
        listed = service.blocked_keys()
        assert listed == sorted(listed, key=lambda k: (k.since, k.queue_name, k.ordering_key))
        assert listed[-1].ordering_key == "failing"

    def test_queue_and_limit(self):
        blocked_ledger()
        service = ZeroLossMessageService()
        assert [(k.queue_name, k.ordering_key) for k in service.blocked_keys("other")] == [("other", "busy")]
        assert len(service.blocked_keys(limit=1)) == 1
        assert service.blocked_keys("nothing-here") == []
        with pytest.raises(InvalidMessage):
            service.blocked_keys("bad queue!")
        with pytest.raises(InvalidMessage):
            service.blocked_keys(limit=0)

    def test_an_expired_lease_and_a_missing_head_are_blocked_too(self):
        blocked_ledger()
        expire_leases(["b0"])
        service = ZeroLossMessageService()
        busy = service.key_head("q", "busy")
        assert busy is not None and busy.why == KeyWhy.LEASE_EXPIRED
        assert "the sweep will requeue it" in busy.detail
        # What a process that died between its commit and its promotion leaves behind.
        ZeroLossMessageService().persist_message("n0", "q", {}, ordering_key="lost")
        Message.objects.filter(message_id="n0").update(available_at=None)
        lost = service.key_head("q", "lost")
        assert lost is not None
        assert (lost.message_id, lost.why, lost.behind) == (None, KeyWhy.NO_HEAD, 1)
        assert ("q", "lost") in {(k.queue_name, k.ordering_key) for k in service.blocked_keys()}

    def test_a_backoff_that_ended_unblocks_the_key(self):
        blocked_ledger()
        make_available(["f0"])
        service = ZeroLossMessageService()
        assert ("q", "failing") not in {(k.queue_name, k.ordering_key) for k in service.blocked_keys()}
        head = service.key_head("q", "failing")
        assert head is not None and (head.why, head.blocked, head.behind) == (KeyWhy.CLAIMABLE, False, 2)

    def test_key_head(self):
        blocked_ledger()
        service = ZeroLossMessageService()
        alone = service.key_head("q", "alone")
        assert alone is not None and (alone.message_id, alone.behind, alone.blocked) == ("a0", 0, False)
        assert service.key_head("q", "never-used") is None
        with pytest.raises(InvalidMessage):
            service.key_head("q", "")

    def test_as_dict_round_trips(self):
        blocked_ledger()
        from zeroloss.ledger.types import KeyHead

        for head in ZeroLossMessageService().blocked_keys():
            assert KeyHead.from_dict(head.as_dict()) == head


class TestSkipAndRequeue:
    def test_skip_dead_letters_the_head_and_the_key_moves_on(self):
        blocked_ledger()
        op = ZeroLossMessageService(instance_id="admin")
        assert op.skip_key_head("q", "busy", reason="poison payload", actor="alice") == "b0"
        b0 = Message.objects.get(message_id="b0")
        assert (b0.status, b0.last_error) == (Status.DEAD, "key skipped: poison payload")
        e = event("b0")
        assert (e.from_status, e.to_status, e.reason, e.actor, e.detail) == (
            "processing",
            "dead",
            "dead_lettered_by_operator",
            "alice",
            "key skipped: poison payload",
        )
        head = op.key_head("q", "busy")
        assert head is not None and (head.message_id, head.why, head.behind) == ("b1", KeyWhy.CLAIMABLE, 2)
        claimed = [x.message_id for x in ZeroLossMessageService(instance_id="w2").claim("q", limit=10)]
        assert "b1" in claimed and "b2" not in claimed

    def test_skip_a_backoff_head(self):
        blocked_ledger()
        op = ZeroLossMessageService()
        assert op.skip_key_head("q", "failing", reason="gave up", actor="bob") == "f0"
        assert (event("f0").from_status, event("f0").actor) == ("pending", "bob")
        head = op.key_head("q", "failing")
        assert head is not None and head.message_id == "f1"

    def test_skip_only_the_head_that_was_shown(self):
        blocked_ledger()
        op = ZeroLossMessageService()
        before = MessageEvent.objects.count()
        assert op.skip_key_head("q", "busy", reason="x", actor="bob", message_id="b1") is None
        assert op.skip_key_head("q", "nobody", reason="x", actor="bob") is None
        assert MessageEvent.objects.count() == before
        assert Message.objects.get(message_id="b0").status == Status.PROCESSING
        with pytest.raises(InvalidMessage, match="reason is required"):
            op.skip_key_head("q", "busy", reason="  ")
        with pytest.raises(InvalidMessage):
            op.skip_key_head("bad queue!", "busy", reason="x")
        with pytest.raises(InvalidMessage):
            op.skip_key_head("q", "busy", reason="x", actor="")
        assert MessageEvent.objects.count() == before

    def test_requeue_a_stuck_head_keeps_it_at_the_head(self):
        blocked_ledger()
        op = ZeroLossMessageService()
        assert op.requeue_key_head("q", "busy", actor="carol") is None  # live lease, no force
        expire_leases(["b0"])
        assert op.requeue_key_head("q", "busy", actor="carol", message_id="b0") == "b0"
        b0 = Message.objects.get(message_id="b0")
        assert (b0.status, b0.attempts) == (Status.PENDING, 0)
        e = event("b0")
        assert (e.reason, e.actor, e.detail) == (
            "requeued_by_operator",
            "carol",
            "ordering key head requeued: expired lease",
        )
        head = op.key_head("q", "busy")
        assert head is not None and (head.message_id, head.why, head.behind) == ("b0", KeyWhy.CLAIMABLE, 3)
        assert ZeroLossMessageService().claim("q", limit=10)[0].message_id in {"b0", "r0"}

    def test_force_requeue_a_live_head_fences_its_worker(self):
        worker = blocked_ledger()
        lease = Message.objects.get(message_id="b0").lease_token
        assert lease is not None
        op = ZeroLossMessageService()
        assert op.requeue_key_head("q", "busy", actor="carol", force=True) == "b0"
        assert event("b0").detail == "ordering key head requeued: live lease revoked"
        assert not worker.acknowledge("b0", lease)

    def test_requeue_leaves_a_backoff_head_alone(self):
        blocked_ledger()
        before = MessageEvent.objects.count()
        assert ZeroLossMessageService().requeue_key_head("q", "failing", actor="carol", force=True) is None
        assert MessageEvent.objects.count() == before


class TestStatus:
    def test_json_lists_blocked_keys(self):
        blocked_ledger()
        result = run("zeroloss_status", "--json", "--no-cache")
        assert result.code == 0, result
        data = json.loads(result.out)
        assert data["blocked_keys_truncated"] is False
        keys = {(k["queue"], k["key"]): k for k in data["blocked_keys"]}
        assert set(keys) == {("q", "busy"), ("q", "failing"), ("other", "busy")}
        assert set(keys["q", "busy"]) == BLOCKED_KEY_FIELDS
        busy, failing = keys["q", "busy"], keys["q", "failing"]
        assert (busy["head_message_id"], busy["head_status"], busy["why"], busy["behind"]) == (
            "b0",
            "processing",
            "processing",
            3,
        )
        assert busy["claimed_by"] == "worker-1" and busy["blocked_for"] >= 0
        assert (failing["head_message_id"], failing["why"], failing["behind"]) == ("f0", "retry_backoff", 2)
        assert failing["last_error"] == "upstream said 503"
        narrowed = json.loads(run("zeroloss_status", "--json", "--queue", "other").out)
        assert [(k["queue"], k["key"]) for k in narrowed["blocked_keys"]] == [("other", "busy")]
        # The cached snapshot carries them too.
        cached = json.loads(run("zeroloss_status", "--json").out)
        assert cached["cached"] is True and cached["blocked_keys"] == data["blocked_keys"]

    def test_at_most_100_in_json_and_10_in_the_table(self):
        worker = ZeroLossMessageService(instance_id="worker-1", ack_timeout=600)
        sends: list[tuple[str, str, Any]] = [(f"m{k}-{i}", "q", {}) for k in range(103) for i in range(2)]
        for start in range(0, len(sends), 2):
            worker.persist_messages(sends[start : start + 2], ordering_key=f"key-{start // 2:03d}")
        assert len(worker.claim("q", limit=200)) == 103
        data = json.loads(run("zeroloss_status", "--json", "--no-cache").out)
        assert (len(data["blocked_keys"]), data["blocked_keys_truncated"]) == (100, True)
        text = run("zeroloss_status", "--no-cache").out
        assert "blocked ordering keys: 100+" in text
        listed = [line for line in text.splitlines() if line.startswith("q ") and "key-" in line]
        assert len(listed) == 10
        assert "... 90+ more" in text

    def test_text_table(self):
        blocked_ledger()
        text = run("zeroloss_status", "--no-cache").out
        assert "blocked ordering keys: 3\n" in text
        header = next(line for line in text.splitlines() if line.startswith("queue  key"))
        assert header.split() == ["queue", "key", "head", "why", "for", "behind", "detail"]
        row = next(line for line in text.splitlines() if line.startswith("q ") and " b0 " in line)
        assert row.split()[:6][:4] == ["q", "busy", "b0", "processing"]
        assert " 3 " in row and "processing by worker-1" in row
        clear_cache()
        ZeroLossMessageService().skip_key_head("q", "busy", reason="x", actor="op")
        ZeroLossMessageService().skip_key_head("q", "failing", reason="x", actor="op")
        ZeroLossMessageService().skip_key_head("other", "busy", reason="x", actor="op")
        assert "blocked ordering keys: 0\n" in run("zeroloss_status", "--no-cache").out


class TestConcurrentOperators:
    def race(self, calls: int, **kwargs: str) -> list[str | None]:
        """``calls`` operators skipping the head of ``q/busy`` at once, each on its own connection."""
        barrier = threading.Barrier(calls)

        def skip(n: int) -> str | None:
            try:
                barrier.wait(timeout=10)
                return ZeroLossMessageService().skip_key_head(
                    "q", "busy", reason=f"operator {n}", actor=f"op-{n}", **kwargs
                )
            finally:
                connections.close_all()

        with ThreadPoolExecutor(calls) as pool:
            return list(pool.map(skip, range(calls), timeout=60))

    def test_one_shown_head_is_skipped_once(self):
        blocked_ledger()
        results = self.race(4, message_id="b0")
        assert sorted(r for r in results if r) == ["b0"] and results.count(None) == 3
        assert MessageEvent.objects.filter(reason="dead_lettered_by_operator").count() == 1
        assert Message.objects.get(message_id="b1").status == Status.PENDING

    def test_skips_without_an_id_never_skip_one_message_twice_or_out_of_order(self):
        blocked_ledger()
        results = self.race(3)
        skipped = sorted(r for r in results if r)
        # Each call skips at most the head it locked: one that waited for a head another call
        # dead-lettered finds no head in its statement and returns None (PostgreSQL); SQLite's
        # write lock runs them one after the other, each skipping the next head.
        assert 1 <= len(skipped) <= 3 and skipped == ["b0", "b1", "b2"][: len(skipped)]
        assert MessageEvent.objects.filter(reason="dead_lettered_by_operator").count() == len(skipped)
        head = ZeroLossMessageService().key_head("q", "busy")
        assert head is not None and head.message_id == f"b{len(skipped)}"
