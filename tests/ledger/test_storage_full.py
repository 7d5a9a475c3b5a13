"""A send the database refuses for lack of space raises :class:`zeroloss.exceptions.StorageFull`.

Never the raw driver error: the typed error says what happened and what to do (free space, retry
with the same message id), is chained from the driver's error, and is still a Django
``OperationalError`` for callers that catch that. Nothing is stored, and the same id is stored
once space is back.

SQLite refuses for real: ``PRAGMA max_page_count`` caps the file at its current size, and a write
that needs a new page fails with SQLITE_FULL, "database or disk is full" — what a full disk
gives. (PostgreSQL's 53100 on a real full disk: the fault suite's loop-mounted filesystem,
tests/faults/storage.py, asserts every refusal there is this error.)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError, connection, transaction

import zeroloss
from tests.infra import task_functions as tf
from zeroloss.core import outage
from zeroloss.exceptions import StorageFull, ZeroLossError
from zeroloss.ledger.models import Message

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "demo.record"
#: More than a page holds, so the INSERT needs new pages (the file is capped, its freelist empty).
BIG = "x" * 40_000


@pytest.fixture
def full_disk() -> Iterator[None]:
    """The SQLite file can grow no more, until the test ends."""
    # SQLite's page cap stands in for a full disk (sqlite_only); PostgreSQL's is the fault suite's.
    assert connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        cursor.execute("VACUUM")  # no free pages left to fill without growing the file
        cursor.execute("PRAGMA max_page_count")
        before = cursor.fetchone()[0]
        cursor.execute("PRAGMA max_page_count = 1")  # capped at the file's current size
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA max_page_count = {int(before)}")


def _send(mid: str) -> None:
    zeroloss.send(QUEUE, {"text": BIG}, message_id=mid)


def _send_in_transaction(mid: str) -> None:
    with transaction.atomic():
        zeroloss.send(QUEUE, {"text": BIG}, message_id=mid)


def _send_many(mid: str) -> None:
    zeroloss.send_many(QUEUE, [{"text": BIG}, {"text": BIG}], message_ids=[mid, f"{mid}-2"])


def _asend(mid: str) -> None:
    async_to_sync(zeroloss.asend)(QUEUE, {"text": BIG}, message_id=mid)


@pytest.mark.sqlite_only
@pytest.mark.parametrize("send", [_send, _send_in_transaction, _send_many, _asend])
def test_a_send_refused_for_lack_of_space_raises_storage_full_and_the_same_id_is_stored_later(
    full_disk: None, send: Callable[[str], Any]
) -> None:
    with pytest.raises(StorageFull) as refused:
        send("m-full")
    error = refused.value
    assert isinstance(error, ZeroLossError) and isinstance(error, OperationalError)
    assert isinstance(error.__cause__, sqlite3.OperationalError)  # the driver's own error
    assert "database or disk is full" in str(error.__cause__)
    text = str(error)
    assert "disk is full" in text and "retry with the same message_id" in text and "free space" in text
    if send is not _send_many:
        assert error.message_id == "m-full" and "'m-full'" in text
    assert error.alias == "default"
    assert not Message.objects.filter(message_id__startswith="m-full").exists()  # nothing stored

    with connection.cursor() as cursor:  # space is back
        cursor.execute("PRAGMA max_page_count = 1073741823")
    send("m-full")
    assert Message.objects.get(message_id="m-full").payload == {"text": BIG}


@pytest.mark.sqlite_only
def test_a_task_enqueued_on_a_full_disk_raises_storage_full(full_disk: None) -> None:
    with pytest.raises(StorageFull, match="disk is full"):
        tf.echo.enqueue(BIG)
    assert not Message.objects.filter(queue_name="demo.tasks").exists()


def test_another_operational_error_is_raised_as_it_was() -> None:
    """Only a refusal for space becomes StorageFull: an outage stays Django's error, unchanged."""
    locked = OperationalError("database is locked")
    outage.refused_for_storage(locked, "m-1", "default")  # returns: the caller re-raises it
    full = OperationalError("database or disk is full")
    full.__cause__ = sqlite3.OperationalError("database or disk is full")
    with pytest.raises(StorageFull) as raised:
        outage.refused_for_storage(full, "m-1", "default")
    assert raised.value.__cause__ is full.__cause__
    assert outage.is_storage_fault(raised.value)  # still ridden out as a storage fault by the loops
