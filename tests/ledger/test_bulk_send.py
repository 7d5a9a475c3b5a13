"""Large batches (``send_many``, ``persist_messages``): above ``Engine.stage_from`` PostgreSQL stages
them with COPY; SQLite keeps its batch statement. Same semantics either way, checked on both."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import zeroloss
from zeroloss.exceptions import InvalidMessage, InvalidPayload, MessageConflict, PayloadTooLarge
from zeroloss.ledger.base import engine_for
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.validation import canonical_json, payload_checksum

pytestmark = pytest.mark.django_db(transaction=True)

#: A batch just above PostgreSQL's COPY threshold (``Engine.stage_from``, 1000); SQLite has no
#: threshold (one batch statement at any size), so a smaller batch exercises the same path there.
N = 1200 if connection.vendor == "postgresql" else 300
QUEUE = "demo.record"


def ids(prefix: str = "m", n: int = N) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def persisted_count() -> int:
    return MessageEvent.objects.filter(reason="persisted").count()


def test_the_batch_is_above_the_threshold_on_postgresql():
    stage_from = engine_for(connection).stage_from
    assert stage_from == (1000 if connection.vendor == "postgresql" else 0)
    assert stage_from < N


def test_every_message_is_stored_in_order_with_its_audit_row_and_checksum():
    # Text that COPY's format escapes (backslash, and JSON's own escapes), non-ASCII, and
    # integral floats the canonical form turns into integers.
    payloads = [{"n": i, "s": 'a\\b\t"c"\n\u00e9\U0001f600', "f": 2.0, "x": i / 4} for i in range(N)]
    message_ids = [f"m\\{i}" for i in range(N)]
    returned = zeroloss.send_many(QUEUE, payloads, message_ids=message_ids)
    rows = {m.message_id: m for m in Message.objects.order_by("pk")}
    assert list(rows) == message_ids  # ids in the batch's order
    assert persisted_count() == N
    assert MessageEvent.objects.filter(reason="persisted", from_status="", to_status="pending").count() == N
    service = ZeroLossMessageService()
    for message, payload in zip(returned, payloads, strict=True):
        stored = rows[message.message_id]
        encoded = canonical_json(payload)
        assert stored.payload == message.payload == {**payload, "f": 2}
        assert stored.checksum == message.checksum == payload_checksum(encoded)
        assert (stored.pk, stored.queue_name, stored.status, stored.attempts, stored.max_attempts) == (
            message.pk,
            QUEUE,
            Status.PENDING,
            0,
            message.max_attempts,
        )
        assert stored.created_at == message.created_at == stored.available_at == message.available_at
    assert service.verify_message_integrity(message_ids[234]).valid
    assert all(fields(m) == fields(rows[m.message_id]) for m in returned)
    leases = service.claim(QUEUE, limit=3)
    assert [lease.message_id for lease in leases] == message_ids[:3]


def fields(message: Message) -> dict[str, object]:
    return {f.attname: getattr(message, f.attname) for f in Message._meta.concrete_fields}


def test_returned_messages_are_the_stored_rows_with_every_option():
    service = ZeroLossMessageService()
    items = [(mid, QUEUE, {"n": i}) for i, mid in enumerate(ids())]
    returned = service.persist_messages(items, max_attempts=3, priority=7, dispatched=True, actor="bulk-test")
    stored = {m.message_id: m for m in Message.objects.all()}
    assert all(fields(m) == fields(stored[m.message_id]) for m in returned)
    assert {(m.max_attempts, m.priority, m.dispatched_at == m.created_at) for m in returned} == {(3, 7, True)}
    actors = set(MessageEvent.objects.values_list("actor", flat=True))
    assert actors == {"bulk-test"}


@pytest.mark.postgres_only
def test_postgresql_copies_a_new_batch_and_stages_one_holding_stored_ids():
    with CaptureQueriesContext(connection) as queries:
        zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids())
    sql = [q["sql"] for q in queries.captured_queries]
    assert any("string_agg(nextval(" in s for s in sql)  # ids for the COPY
    assert not any("zeroloss_staged" in s or "INSERT INTO" in s for s in sql)
    with CaptureQueriesContext(connection) as queries:
        zeroloss.send_many(QUEUE, [{"n": i} for i in range(N - 1, 2 * N)], message_ids=ids(n=2 * N)[N - 1 :])
    sql = [q["sql"] for q in queries.captured_queries]
    assert any(s.startswith("ROLLBACK TO SAVEPOINT") for s in sql)  # its first id is stored: COPY undone
    assert any(s.startswith("CREATE TEMPORARY TABLE zeroloss_staged") for s in sql)
    assert "DROP TABLE zeroloss_staged" in sql
    assert Message.objects.count() == 2 * N and persisted_count() == 2 * N


def test_a_second_send_of_the_same_batch_returns_the_stored_rows_and_writes_nothing():
    first = zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids())
    events = MessageEvent.objects.count()
    again = zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids())
    assert [m.pk for m in again] == [m.pk for m in first]
    assert [m.payload for m in again] == [{"n": i} for i in range(N)]
    assert Message.objects.count() == N
    assert MessageEvent.objects.count() == events == N


def test_a_batch_of_new_and_already_stored_messages_stores_only_the_new():
    old = zeroloss.send_many(QUEUE, [{"n": i} for i in range(0, N, 2)], message_ids=ids()[::2])
    both = zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids())
    assert [m.pk for m in both[::2]] == [m.pk for m in old]
    assert Message.objects.count() == N and persisted_count() == N
    assert [m.message_id for m in both] == ids()
    fresh = {m.message_id: m.pk for m in Message.objects.filter(message_id__in=ids()[1::2])}
    assert [m.pk for m in both[1::2]] == [fresh[mid] for mid in ids()[1::2]]


@pytest.mark.parametrize(
    ("stored_queue", "stored_data", "why"),
    [(QUEUE, {"n": -1}, "a different payload"), ("demo.other", {"n": 234}, "queue 'demo.other'")],
)
def test_a_conflicting_item_is_named_and_nothing_of_the_batch_is_stored(stored_queue, stored_data, why):
    ZeroLossMessageService().persist_message("m234", stored_queue, stored_data)
    with pytest.raises(MessageConflict, match=f"'m234' already exists with {why}"):
        zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids())
    assert list(Message.objects.values_list("message_id", flat=True)) == ["m234"]
    assert persisted_count() == 1


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ({"x": float("nan")}, InvalidPayload, "not JSON-serialisable"),
        ({"x": "a\x00b"}, InvalidPayload, "NUL"),
        ({1: "a", "1": "b"}, InvalidPayload, "two keys"),
    ],
)
def test_an_invalid_payload_is_named_by_position_and_nothing_is_stored(bad, error, match):
    payloads: list[object] = [{"n": i} for i in range(N)]
    late = N - 100
    payloads[late] = bad
    with pytest.raises(
        error, match=rf"item {late} \('m{late}'\): .*{match}.*Nothing of the batch was stored"
    ):
        zeroloss.send_many(QUEUE, payloads, message_ids=ids())
    assert not Message.objects.exists() and not MessageEvent.objects.exists()


def test_invalid_items_and_options_raise_what_small_batches_raise():
    service = ZeroLossMessageService()
    items: list[object] = [(mid, QUEUE, {}) for mid in ids()]
    for k, item, error, match in [
        (7, ("", QUEUE, {}), InvalidMessage, r"item 7 \(''\): message_id must be a non-empty string"),
        (8, ("m8", "no spaces", {}), InvalidMessage, r"item 8 \('m8'\): queue_name 'no spaces' may only"),
        (9, ("m9", 5, {}), InvalidMessage, r"item 9 \('m9'\): queue_name must be a non-empty string"),
        (10, "m10", InvalidMessage, r"item 10 must be a \(message_id, queue_name, data\[, headers\]\) tuple"),
    ]:
        bad = list(items)
        bad[k] = item
        with pytest.raises(error, match=match):
            service.persist_messages(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match="'m3' appears twice"):
        service.persist_messages([*items, ("m3", QUEUE, {})])  # type: ignore[list-item]
    with pytest.raises(InvalidMessage, match=r"item 0 \('m0'\): max_attempts must be an integer"):
        service.persist_messages(items, max_attempts=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match=r"item 0 \('m0'\): priority must be an integer"):
        service.persist_messages(items, priority=101)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match="An ordered message cannot be delayed"):
        service.persist_messages(items, ordering_key="k", delay=5)  # type: ignore[arg-type]
    small = ZeroLossMessageService(max_payload_bytes=100)
    last = N - 1
    big = [(mid, QUEUE, {"s": "é" * (60 if mid == f"m{last}" else 10)}) for mid in ids()]
    with pytest.raises(
        PayloadTooLarge, match=rf"item {last} \('m{last}'\): Payload of message 'm{last}' is 128 bytes"
    ):
        small.persist_messages(big)
    assert not Message.objects.exists() and not MessageEvent.objects.exists()


def test_a_bad_item_met_after_chunks_were_streamed_aborts_the_copy_and_stores_nothing(monkeypatch):
    """COPY streams each chunk while the next is prepared: a bad item in a later chunk must
    abort what the server already received, and leave the caller's transaction usable."""
    from zeroloss.ledger import bulk

    monkeypatch.setattr(bulk, "_COPY_CHUNK", 300)
    service = ZeroLossMessageService()
    items: list[Any] = [(mid, QUEUE, {"n": i}) for i, mid in enumerate(ids())]
    service.persist_message("m5", QUEUE, {"n": 5})  # a resend in the first chunk, too
    with transaction.atomic():
        bad, late = list(items), N - 50  # in the last chunk
        bad[late] = (f"m{late}", QUEUE, {"x": float("nan")})
        with pytest.raises(
            InvalidPayload, match=rf"item {late} \('m{late}'\): .*Nothing of the batch was stored"
        ):
            service.persist_messages(bad)
        with pytest.raises(InvalidPayload, match=rf"item {late - 1} \('m{late}'\)"):  # m5 left out
            service.persist_messages([x for x in bad if x[0] != "m5"])
        with pytest.raises(InvalidMessage, match="'m3' appears twice"):
            service.persist_messages([*items, ("m3", QUEUE, {"n": 3})])
        with pytest.raises(InvalidMessage, match="'m3' appears twice"):
            service.persist_messages([x for x in items if x[0] != "m5"] + [("m3", QUEUE, {"n": 3})])
        assert Message.objects.count() == 1 and persisted_count() == 1
        stored = service.persist_messages(items)  # the same transaction goes on
    assert [m.message_id for m in stored] == ids()
    assert Message.objects.count() == N and persisted_count() == N


def test_it_commits_and_rolls_back_with_the_callers_transaction():
    class Failed(Exception):
        pass

    def request() -> None:
        with transaction.atomic():
            zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)])
            assert Message.objects.count() == N
            raise Failed

    with pytest.raises(Failed):
        request()
    assert not Message.objects.exists() and not MessageEvent.objects.exists()
    with transaction.atomic():  # two batches in one transaction, then a failed third
        zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids("a"))
        zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids("b"))
        with pytest.raises(MessageConflict, match="'a1'"):  # a0 is {"n": 0} both times
            zeroloss.send_many(QUEUE, [{"n": -i} for i in range(N)], message_ids=ids("a"))
        zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids("c"))
    assert Message.objects.count() == 3 * N and persisted_count() == 3 * N


def test_delay_and_ordering_keys_as_in_small_batches():
    service = ZeroLossMessageService()
    later = service.persist_messages([(mid, QUEUE, {}) for mid in ids("d")], delay=3600)
    assert {(m.available_at - m.created_at).total_seconds() for m in later if m.available_at} == {3600}
    assert all(m.available_at for m in later)
    stored = Message.objects.get(message_id=f"d{N - 1}")
    assert (stored.available_at, stored.created_at) == (later[-1].available_at, later[-1].created_at)
    assert service.claim(QUEUE) == []
    ordered = service.persist_messages([(mid, "demo.ordered", {}) for mid in ids("o")], ordering_key="k")
    assert all(m.available_at is None for m in ordered)
    head = Message.objects.filter(queue_name="demo.ordered").exclude(available_at=None)
    assert list(head.values_list("message_id", flat=True)) == ["o0"]  # promoted after commit
    waiting = Message.objects.filter(queue_name="demo.ordered", available_at=None).count()
    assert waiting == N - 1


@pytest.mark.postgres_only
def test_idle_workers_are_woken_once_per_queue_at_commit_and_not_by_a_resend():
    import psycopg

    s = connection.settings_dict
    with psycopg.connect(
        dbname=s["NAME"], user=s["USER"], host=s["HOST"], port=s["PORT"] or 5432, autocommit=True
    ) as listener:
        listener.execute("LISTEN zeroloss_wakeup")
        service = ZeroLossMessageService()
        items: list[tuple[str, str, Any]] = [
            (mid, "demo.a" if i % 3 else "demo.b", {}) for i, mid in enumerate(ids())
        ]
        with transaction.atomic():
            service.persist_messages(items)
            assert list(listener.notifies(timeout=0.2)) == []  # nothing before commit
        heard = sorted(n.payload for n in listener.notifies(timeout=1.0))
        assert heard == ["demo.a", "demo.b"]
        service.persist_messages(items)  # all stored already: nothing became claimable
        assert list(listener.notifies(timeout=0.5)) == []


def test_a_resent_batch_reads_the_stored_rows_in_a_few_queries():
    first = zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids())
    with CaptureQueriesContext(connection) as queries:
        again = zeroloss.send_many(QUEUE, [{"n": i} for i in range(N)], message_ids=ids())
    assert [m.pk for m in again] == [m.pk for m in first]
    assert len(queries.captured_queries) < 20  # not one a message
