"""Message headers (issue 25, point 6): stored with the message, handed to its handler, shown
in the admin, never part of the checksum or of the idempotency conflict, validated and
size-limited like payloads (typed errors, nothing stored); the single, batched and COPY paths.
Real PostgreSQL and SQLite, real workers."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.core.checks import Error
from django.test import Client
from django.urls import reverse

import zeroloss
from zeroloss.exceptions import HeadersTooLarge, InvalidHeaders, InvalidMessage
from zeroloss.ledger.models import Message
from zeroloss.ledger.validation import canonical_json, payload_checksum
from zeroloss.ops import checks
from zeroloss.runtime.processing import Delivery
from zeroloss.runtime.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "test.headers"
TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "attempt_budget": 3}
seen: dict[str, dict[str, Any]] = {}


@zeroloss.handler(QUEUE)
def remember_headers(delivery: Delivery) -> None:
    seen[delivery.message_id] = delivery.headers


@zeroloss.handler("test.headers_tx", transactional=True)
def remember_headers_tx(delivery: Delivery) -> None:
    seen[delivery.message_id] = delivery.headers


def run(queue: str, n: int) -> None:
    worker = Worker([queue], poll_interval=0.05, max_messages=n)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the worker did not finish in 60 s"


@pytest.fixture(autouse=True)
def _forget() -> None:
    seen.clear()


@pytest.mark.parametrize("queue", [QUEUE, "test.headers_tx"])
def test_headers_are_stored_and_handed_to_the_handler(queue):
    sent = zeroloss.send(queue, {"n": 1}, message_id="h1", headers=TRACE)
    plain = zeroloss.send(queue, {"n": 2}, message_id="h2")
    assert sent.headers == TRACE and plain.headers is None
    assert Message.objects.get(message_id="h1").headers == TRACE
    assert Message.objects.get(message_id="h2").headers is None
    run(queue, 2)
    assert seen == {"h1": TRACE, "h2": {}}


def test_asend_takes_headers():
    async_to_sync(zeroloss.asend)(QUEUE, {"n": 1}, message_id="a1", headers={"trace": "t"})
    assert Message.objects.get(message_id="a1").headers == {"trace": "t"}


def test_headers_are_not_part_of_the_checksum_nor_of_the_conflict():
    first = zeroloss.send(QUEUE, {"n": 1}, message_id="same", headers={"trace": "first"})
    assert first.checksum == payload_checksum(canonical_json({"n": 1}))
    again = zeroloss.send(QUEUE, {"n": 1}, message_id="same", headers={"trace": "second"})
    assert again.pk == first.pk and again.headers == {"trace": "first"}  # the stored message
    none = zeroloss.send(QUEUE, {"n": 1}, message_id="same")
    assert none.pk == first.pk and none.headers == {"trace": "first"}
    assert Message.objects.get(message_id="same").headers == {"trace": "first"}


def test_send_many_takes_one_dict_for_all_or_one_per_payload():
    shared = zeroloss.send_many(QUEUE, [{"n": 1}, {"n": 2}], message_ids=["s1", "s2"], headers={"batch": "b"})
    assert [m.headers for m in shared] == [{"batch": "b"}] * 2
    each = zeroloss.send_many(
        QUEUE, [{"n": 3}, {"n": 4}, {"n": 5}], message_ids=["e3", "e4", "e5"], headers=[{"i": 3}, None, {}]
    )
    assert [m.headers for m in each] == [{"i": 3}, None, None]
    stored = dict(Message.objects.filter(message_id__startswith="e").values_list("message_id", "headers"))
    assert stored == {"e3": {"i": 3}, "e4": None, "e5": None}
    with pytest.raises(InvalidMessage, match="2 headers for 3 payloads"):
        zeroloss.send_many(QUEUE, [{}, {}, {}], headers=[{}, {}])
    run(QUEUE, 5)
    assert seen == {"s1": {"batch": "b"}, "s2": {"batch": "b"}, "e3": {"i": 3}, "e4": {}, "e5": {}}


def test_large_batches_copy_their_headers_and_a_resent_one_keeps_the_stored():
    ids = [f"c{i}" for i in range(1200)]  # above PostgreSQL's COPY threshold
    headers = [{"i": i} if i % 2 else None for i in range(1200)]
    sent = zeroloss.send_many(QUEUE, [{"n": i} for i in range(1200)], message_ids=ids, headers=headers)
    assert [m.headers for m in sent[:3]] == [None, {"i": 1}, None]
    assert Message.objects.get(message_id="c7").headers == {"i": 7}
    assert Message.objects.get(message_id="c8").headers is None
    # A resend with new ids mixed in (PostgreSQL: the staged path): the stored keep theirs.
    more = [*ids[:10], "new-1"]
    again = zeroloss.send_many(
        QUEUE, [*({"n": i} for i in range(10)), {"n": -1}], message_ids=more, headers={"trace": "again"}
    )
    assert [m.headers for m in again[:2]] == [None, {"i": 1}] and again[-1].headers == {"trace": "again"}
    assert Message.objects.get(message_id="new-1").headers == {"trace": "again"}
    assert Message.objects.get(message_id="c1").headers == {"i": 1}


@pytest.mark.parametrize(
    ("headers", "error", "match"),
    [
        (["trace"], InvalidHeaders, "must be a dict"),
        ("trace=1", InvalidHeaders, "must be a dict"),
        ({1: "x"}, InvalidHeaders, "non-empty strings"),
        ({"": "x"}, InvalidHeaders, "non-empty strings"),
        ({"a\nb": "x"}, InvalidHeaders, "control characters"),
        ({"x" * 256: "x"}, InvalidHeaders, "at most 255"),
        ({"when": dt.datetime(2026, 1, 1)}, InvalidHeaders, "not JSON serializable"),
        ({"nan": float("nan")}, InvalidHeaders, "not JSON"),
        ({"nul": "a\x00b"}, InvalidHeaders, "NUL"),
        ({"big": "x" * 9000}, HeadersTooLarge, "limit is 8192"),
    ],
)
def test_bad_headers_are_refused_and_nothing_is_stored(headers, error, match):
    with pytest.raises(error, match=match):
        zeroloss.send(QUEUE, {"n": 1}, headers=headers)
    with pytest.raises(error, match=match):
        zeroloss.send_many(QUEUE, [{"n": 1}], headers=[headers])
    with pytest.raises(error, match=match):  # the COPY path (PostgreSQL) checks them as the others
        zeroloss.send_many(QUEUE, [{"n": i} for i in range(1200)], headers=[None] * 1199 + [headers])
    assert Message.objects.count() == 0


def test_max_headers_bytes_and_the_json_encoder_apply(settings):
    settings.ZEROLOSS = {
        "MAX_HEADERS_BYTES": 64,
        "JSON_ENCODER": "django.core.serializers.json.DjangoJSONEncoder",
    }
    when = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    sent = zeroloss.send(QUEUE, {}, headers={"sent_at": when})
    assert sent.headers == {"sent_at": "2026-12-01T00:00:00Z"}
    with pytest.raises(HeadersTooLarge, match="limit is 64"):
        zeroloss.send(QUEUE, {}, headers={"trace": "x" * 64})


@pytest.mark.parametrize("value", [0, "8k", 2**31])
def test_a_bad_max_headers_bytes_is_e003(settings, value):
    settings.ZEROLOSS = {"MAX_HEADERS_BYTES": value}
    [error] = checks.check_settings()
    assert isinstance(error, Error) and error.id == "zeroloss.E003" and "MAX_HEADERS_BYTES" in error.msg


def test_the_admin_detail_page_shows_the_headers():
    message = zeroloss.send(QUEUE, {"n": 1}, headers={"trace": "<b>t-1</b>"})
    plain = zeroloss.send(QUEUE, {"n": 2})
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    page = client.get(reverse("admin:zeroloss_message_change", args=[message.pk])).content.decode()
    assert (
        '<pre class="zl-pre zl-headers">{\n  &quot;trace&quot;: &quot;&lt;b&gt;t-1&lt;/b&gt;&quot;\n}</pre>'
        in page
    )
    page = client.get(reverse("admin:zeroloss_message_change", args=[plain.pk])).content.decode()
    assert "zl-headers" not in page and "headers" in page.lower()


def test_the_celery_delivery_path_hands_the_headers_too():
    from zeroloss.runtime.processing import Outcome
    from zeroloss.runtime.worker.transport_runtime import DeliveryRuntime, deliver

    zeroloss.send(QUEUE, {"n": 1}, message_id="celery-1", headers=TRACE)
    zeroloss.send("test.headers_tx", {"n": 2}, message_id="celery-2", headers={"tx": True})
    try:
        assert deliver("celery-1") == Outcome.COMPLETED
        assert deliver("celery-2") == Outcome.COMPLETED
    finally:
        DeliveryRuntime.close_all()  # its threads hold connections of their own
    assert seen == {"celery-1": TRACE, "celery-2": {"tx": True}}
