"""zeroloss.testing (issue 25, point 4): drain() inside Django's TestCase (one transaction, never
committed), TransactionTestCase and pytest-django; the worker command refuses a test's
transaction instead of closing its connection."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test import TestCase, TransactionTestCase

import zeroloss
from tests.support import expire_leases
from tests.support.waiting import suspend
from zeroloss.exceptions import UnknownQueue
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.runtime import handlers
from zeroloss.runtime.processing import Delivery
from zeroloss.testing import drain


def make_group(delivery: Delivery) -> None:
    Group.objects.create(name=delivery.payload["name"])
    if delivery.payload.get("fail"):
        raise RuntimeError("after its write")


async def make_group_async(delivery: Delivery) -> None:
    await suspend()
    await sync_to_async(Group.objects.create)(name=delivery.payload["name"])


def loses_its_lease(delivery: Delivery) -> None:
    expire_leases([delivery.message_id])  # as if it ran past its lease: the outcome is refused


@pytest.fixture(autouse=True)
def _handlers():
    saved = dict(handlers._registry)
    zeroloss.handler("t.plain")(make_group)
    zeroloss.handler("t.tx", transactional=True)(make_group)
    zeroloss.handler("t.async")(make_group_async)
    zeroloss.handler("t.lease")(loses_its_lease)
    yield
    handlers._registry.clear()
    handlers._registry.update(saved)


def committed_messages() -> int:
    """Messages another connection sees: only committed ones."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {Message._meta.db_table}")
            return cursor.fetchone()[0]
    finally:
        other.close()


class DrainInsideATestCase(TestCase):
    def test_sent_messages_run_in_the_tests_transaction_and_nothing_is_committed(self):
        zeroloss.send("t.plain", {"name": "plain"}, message_id="p1")
        zeroloss.send("t.async", {"name": "async"}, message_id="a1")
        result = drain("t.plain", "t.async")
        assert result.outcomes == {"p1": "completed", "a1": "completed"}
        assert result.completed == 2 and len(result) == 2
        # The async handler's ORM call ran on the test's connection, inside its transaction.
        assert set(Group.objects.values_list("name", flat=True)) == {"plain", "async"}
        assert set(Message.objects.values_list("status", flat=True)) == {Status.COMPLETED}
        assert "claimed" in MessageEvent.objects.for_message("p1").values_list("reason", flat=True)
        assert committed_messages() == 0
        assert connection.in_atomic_block and connection.is_usable()

    def test_a_transactional_handler_fails_alone_in_its_savepoint(self):
        zeroloss.send("t.tx", {"name": "kept"}, message_id="ok")
        zeroloss.send("t.tx", {"name": "rolled back", "fail": True}, message_id="bad", max_attempts=1)
        result = drain("t.tx")
        assert result.outcomes == {"ok": "completed", "bad": "dead"}
        assert result["bad"].error.startswith("RuntimeError: after its write")
        assert list(Group.objects.values_list("name", flat=True)) == ["kept"]
        assert Message.objects.get(message_id="bad").status == Status.DEAD

    def test_a_failure_is_returned_with_its_traceback_and_retries_after_its_backoff(self):
        # The backoff's whole bound (1 s), outlasting the drain: with full jitter it may be a few
        # milliseconds, and the drain would rightly run the retry at once (and fail on the
        # handler's own unique name, the test's transaction then broken).
        no_jitter = {**django_settings.ZEROLOSS, "RETRY_BACKOFF": {"BASE": 1.0, "JITTER": False}}
        zeroloss.send("t.plain", {"name": "x", "fail": True}, message_id="f1", max_attempts=3)
        with self.settings(ZEROLOSS=no_jitter):
            result = drain("t.plain")
        assert result.counts == {"failed": 1}  # pending again, after a backoff: not run twice now
        assert "Traceback (most recent call last)" in result.errors["f1"]
        with pytest.raises(AssertionError, match="1 message\\(s\\) failed"):
            result.raise_errors()
        assert Message.objects.get(message_id="f1").status == Status.PENDING

    def test_outcomes_are_fenced_like_a_workers(self):
        zeroloss.send("t.lease", {}, message_id="l1")
        result = drain("t.lease")
        assert result.outcomes == {"l1": "lease_lost"}  # the refused acknowledgement wrote nothing
        assert Message.objects.get(message_id="l1").status == Status.PROCESSING

    def test_an_unknown_queue_is_a_typed_error(self):
        with pytest.raises(UnknownQueue):
            drain("t.nobody")

    def test_the_worker_command_refuses_the_tests_transaction_and_leaves_its_connection_alone(self):
        zeroloss.send("t.plain", {"name": "n"}, message_id="w1")
        with pytest.raises(CommandError, match=r"zeroloss\.testing\.drain") as raised:
            call_command("zeroloss_worker", "--burst", "--queue", "t.plain")
        assert raised.value.returncode == 2
        assert connection.is_usable() and Message.objects.get(message_id="w1").status == Status.PENDING


class DrainInATransactionTestCase(TransactionTestCase):
    def test_drain_commits_as_a_worker_would(self):
        zeroloss.send("t.tx", {"name": "committed"}, message_id="c1")
        assert drain().outcomes == {"c1": "completed"}
        assert committed_messages() == 1
        assert Message.objects.get(message_id="c1").status == Status.COMPLETED
        assert Group.objects.filter(name="committed").exists()


def test_the_pytest_fixture_drains(zeroloss_drain):
    zeroloss.send("t.plain", {"name": "from pytest"}, message_id="py1")
    assert zeroloss_drain("t.plain").completed == 1
    assert Group.objects.filter(name="from pytest").exists()
