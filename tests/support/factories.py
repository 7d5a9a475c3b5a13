"""Messages in given states, made through the service as a worker would make them.

Expired leases come from moving the lease into the past (:func:`tests.support.expire_leases`),
never from waiting.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.cache import caches
from django.utils import timezone

from tests.support import expire_leases
from zeroloss.ledger.models import MaintenanceTurn, Message, MessageEvent, PurgeRecord
from zeroloss.ledger.service import ZeroLossMessageService


def ledger_state(using: str = "default") -> tuple[Any, ...]:
    """Every row a command could change, to assert that it changed nothing."""
    return (
        list(Message.objects.using(using).order_by("id").values()),
        list(MessageEvent.objects.using(using).order_by("id").values()),
        list(PurgeRecord.objects.using(using).order_by("id").values()),
    )


def clear_cache() -> None:
    caches["default"].clear()


def retention_not_due(hours: float = 1) -> None:
    """The deployment's retention turn not due for ``hours`` (database clock): a process started
    now opens no retention thread, whose own connection would count among its sessions."""
    MaintenanceTurn.objects.update_or_create(
        name="retention", defaults={"holder": "test", "due_at": timezone.now() + timedelta(hours=hours)}
    )


def make_stuck(ids: list[str], queue: str = "q", *, expired_seconds_ago: float = 60) -> None:
    """Processing messages whose lease expired a minute ago (a worker that died holding them).

    A sweeper already running examines leases that expired since a little before its previous
    sweep (``SWEEP_REWIND``) and older ones only in its sweep from the head: for it, make them
    expire just now (``expired_seconds_ago=1``), as a lease of a worker that dies meanwhile does."""
    worker = ZeroLossMessageService(instance_id="dead-worker")
    worker.persist_messages([(m, queue, {"id": m}) for m in ids])
    for m in ids:
        assert worker.claim_message(m)
    assert expire_leases(ids, seconds_ago=expired_seconds_ago) == len(ids)


def make_dead(ids: list[str], queue: str = "q") -> None:
    """Dead letters: one attempt allowed, and it failed."""
    worker = ZeroLossMessageService(instance_id="failing-worker")
    worker.persist_messages([(m, queue, {"id": m}) for m in ids], max_attempts=1)
    for m in ids:
        lease = worker.claim_message(m)
        assert lease
        assert worker.fail(m, lease.token, "boom")


def make_leased(ids: list[str], queue: str = "q") -> dict[str, Any]:
    """Processing messages under a live (60 s) lease; returns the tokens."""
    worker = ZeroLossMessageService(ack_timeout=60, instance_id="live-worker")
    worker.persist_messages([(m, queue, {"id": m}) for m in ids])
    tokens = {}
    for m in ids:
        lease = worker.claim_message(m)
        assert lease
        tokens[m] = lease.token
    return tokens


def make_completed(ids: list[str], queue: str = "q") -> None:
    worker = ZeroLossMessageService(instance_id="good-worker")
    worker.persist_messages([(m, queue, {"id": m}) for m in ids])
    for m in ids:
        lease = worker.claim_message(m)
        assert lease
        assert worker.acknowledge(m, lease.token)


def statuses(using: str = "default") -> dict[str, str]:
    return dict(Message.objects.using(using).values_list("message_id", "status"))


def blocked_ledger() -> ZeroLossMessageService:
    """Key ``busy``: head b0 processing, 3 behind. Key ``failing``: head f0 backing off after a
    failure, 2 behind. Key ``free``: head claimable, 1 behind (not blocked). Key ``alone``:
    processing, nothing behind (not blocked). ``other`` queue: key ``busy`` processing, 1 behind."""
    # A retry delay far longer than any test: "failing" stays blocked however loaded the host.
    worker = ZeroLossMessageService(
        instance_id="worker-1",
        ack_timeout=600,
        max_attempts=5,
        retry_backoff={"BASE": 3600, "MAX": 3600, "JITTER": False},
    )
    for i in range(4):
        worker.persist_message(f"b{i}", "q", {"i": i}, ordering_key="busy")
    for i in range(3):
        worker.persist_message(f"f{i}", "q", {"i": i}, ordering_key="failing")
    for i in range(2):
        worker.persist_message(f"r{i}", "q", {"i": i}, ordering_key="free")
    worker.persist_message("a0", "q", {}, ordering_key="alone")
    worker.persist_message("o0", "other", {}, ordering_key="busy")
    worker.persist_message("o1", "other", {}, ordering_key="busy")
    assert worker.claim_message("b0")
    assert worker.claim_message("a0")
    assert worker.claim_message("o0")
    lease = worker.claim_message("f0")
    assert lease
    assert worker.fail("f0", lease.token, "upstream said 503")
    return worker


def copy_stored_messages(of: str, prefix: str, *, using: str = "default") -> int:
    """Store a copy of every message whose id starts with ``of``, ``prefix`` before its id, with
    copies of its audit rows: two INSERT ... SELECT statements, so that seeding a large ledger
    costs no encoding, hashing or sending of payloads (the checksums hold: one covers the payload
    only). Returns how many messages were copied."""
    from django.db import connections

    def columns(model: Any) -> list[str]:
        return [
            f.column for f in model._meta.concrete_fields if not f.primary_key and f.column != "message_id"
        ]

    messages, events = Message._meta.db_table, MessageEvent._meta.db_table
    copied, event_columns = columns(Message), columns(MessageEvent)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {messages} (message_id, {', '.join(copied)}) "
            f"SELECT %s || message_id, {', '.join(copied)} FROM {messages} WHERE message_id LIKE %s",
            [prefix, f"{of}%"],
        )
        count = cursor.rowcount
        cursor.execute(
            f"INSERT INTO {events} (message_id, {', '.join(event_columns)}) "
            f"SELECT dup.id, {', '.join(f'e.{c}' for c in event_columns)} FROM {events} e "
            f"JOIN {messages} source ON source.id = e.message_id AND source.message_id LIKE %s "
            f"JOIN {messages} dup ON dup.message_id = %s || source.message_id",
            [f"{of}%", prefix],
        )
    return count
