"""Payload encoding (issue 25, point 7): integral floats stay floats through storage and every
read (the row, a claim, the bulk COPY path) while the checksum stays canonical (numbers hashed by
value, so 1.0 and 1 are one payload); ``JSON_ENCODER`` for values JSON has no type for. Real
PostgreSQL and SQLite."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid

import pytest
from django.core.checks import Error

import zeroloss
from zeroloss.exceptions import InvalidPayload, MessageConflict
from zeroloss.ledger.models import Message
from zeroloss.ledger.validation import canonical_json, payload_checksum
from zeroloss.ops import checks

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "demo.record"
FLOATS = {"one": 1.0, "big": 1e16, "huge": 1e300, "half": 0.5, "tiny": 1e-7, "n": 1, "list": [2.0, 3]}


def types(value):
    if isinstance(value, dict):
        return {k: types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [types(v) for v in value]
    return type(value).__name__


def test_integral_floats_are_read_back_as_floats(service):
    sent = zeroloss.send(QUEUE, FLOATS, message_id="floats")
    assert types(sent.payload) == types(FLOATS)
    stored = Message.objects.get(message_id="floats")
    assert stored.payload == FLOATS and types(stored.payload) == types(FLOATS)
    [lease] = service.claim(QUEUE)
    assert lease.payload == FLOATS and types(lease.payload) == types(FLOATS)


def test_the_checksum_counts_numbers_by_value(service):
    assert payload_checksum(canonical_json({"a": 1.0})) == payload_checksum(canonical_json({"a": 1}))
    assert payload_checksum(canonical_json({"a": 1e16})) == payload_checksum(canonical_json({"a": 10**16}))
    assert payload_checksum(canonical_json({"a": 1.5})) != payload_checksum(canonical_json({"a": 1}))
    first = zeroloss.send(QUEUE, {"a": 1.0}, message_id="same")
    # A resend is the same message: it returns what is stored, 1.0 still a float.
    for resend in ({"a": 1.0}, {"a": 1}):
        again = zeroloss.send(QUEUE, resend, message_id="same")
        assert again.pk == first.pk and types(again.payload) == {"a": "float"}
    with pytest.raises(MessageConflict):
        zeroloss.send(QUEUE, {"a": 1.5}, message_id="same")
    assert service.verify_message_integrity("same").valid


def test_the_bulk_path_keeps_floats_too():
    payloads = [{"i": i, "x": float(i), "big": 1e17} for i in range(1200)]  # COPY on PostgreSQL
    sent = zeroloss.send_many(QUEUE, payloads, message_ids=[f"b{i}" for i in range(1200)])
    assert types(sent[5].payload) == {"i": "int", "x": "float", "big": "float"}
    stored = Message.objects.get(message_id="b7")
    assert stored.payload == {"i": 7, "x": 7.0, "big": 1e17} and types(stored.payload)["x"] == "float"
    assert stored.checksum == payload_checksum(canonical_json({"i": 7, "x": 7, "big": 10**17}))


SPECIAL = {
    "when": dt.datetime(2026, 12, 1, 20, 15, tzinfo=dt.UTC),
    "price": decimal.Decimal("19.90"),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
}


def test_without_an_encoder_datetime_decimal_and_uuid_are_refused():
    for key, value in SPECIAL.items():
        with pytest.raises(InvalidPayload, match="not JSON serializable"):
            zeroloss.send(QUEUE, {key: value})
    assert Message.objects.count() == 0


def test_the_refusal_names_json_encoder_and_the_encoder_for_datetime_decimal_uuid(settings):
    with pytest.raises(InvalidPayload) as refused:
        zeroloss.send(QUEUE, {"when": SPECIAL["when"]})
    assert "ZEROLOSS['JSON_ENCODER']" in str(refused.value)
    assert "django.core.serializers.json.DjangoJSONEncoder" in str(refused.value)
    settings.ZEROLOSS = {"JSON_ENCODER": "django.core.serializers.json.DjangoJSONEncoder"}
    with pytest.raises(InvalidPayload, match=r"JSON_ENCODER'\] does not handle it either"):
        zeroloss.send(QUEUE, {"set": {1, 2}})
    assert Message.objects.count() == 0


def test_json_encoder_encodes_what_json_has_no_type_for(settings):
    settings.ZEROLOSS = {"JSON_ENCODER": "django.core.serializers.json.DjangoJSONEncoder"}
    sent = zeroloss.send(QUEUE, SPECIAL, message_id="special")
    expected = {
        "when": "2026-12-01T20:15:00Z",
        "price": "19.90",
        "id": "12345678-1234-5678-1234-567812345678",
    }
    assert sent.payload == expected
    assert Message.objects.get(message_id="special").payload == expected
    assert zeroloss.send(QUEUE, SPECIAL, message_id="special").pk == sent.pk  # the same message again
    bulk = zeroloss.send_many(QUEUE, [SPECIAL] * 3)
    assert [m.payload for m in bulk] == [expected] * 3
    with pytest.raises(InvalidPayload):
        zeroloss.send(QUEUE, {"set": {1, 2}})  # what the encoder refuses is still refused


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("no.such.Encoder", "'no.such.Encoder' cannot be imported: No module named 'no'"),
        ("json.JSONDecoder", "'json.JSONDecoder' is not a json.JSONEncoder subclass."),
        (
            "DjangoJSONEncoder",
            "must be the dotted path of a json.JSONEncoder subclass, e.g. "
            "\"django.core.serializers.json.DjangoJSONEncoder\", got 'DjangoJSONEncoder'.",
        ),
    ],
)
def test_a_bad_json_encoder_is_check_e005(settings, path, why):
    settings.ZEROLOSS = {"JSON_ENCODER": path}
    assert checks.check_settings() == [
        Error(f"ZEROLOSS['JSON_ENCODER']: {why}", hint=why, obj="settings.ZEROLOSS", id="zeroloss.E005")
    ]


def test_canonical_text_is_unchanged_for_payloads_without_floats():
    assert canonical_json({"b": [1, "x"], "a": None}) == '{"a":null,"b":[1,"x"]}'
    assert json.loads(canonical_json({"big": 1e16})) == {"big": 1e16}
    assert canonical_json({"big": 1e16}) == '{"big":10000000000000000.0}'
