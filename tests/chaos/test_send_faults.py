"""send() when PostgreSQL fails around it: after the commit, and when it takes no writes.

- A failure of the ordering key's promotion, which runs after the message committed, is
  logged and left to the sweep's key repair: the sender gets its stored message, never an
  error that would make it retry (and store a second message under a new random id).
- A read-only server (a hot standby, ``default_transaction_read_only``) refuses the send with
  the ``OperationalError`` the docs promise for a database that cannot take it, nothing stored.

Real faults on the real server: the session is terminated from another connection, the
server's own read-only setting refuses the write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection, transaction

import zeroloss
from tests.conftest import database_url
from tests.support.waiting import wait_for
from zeroloss.ledger.base import engine_for
from zeroloss.ledger.models import Message, MessageEvent
from zeroloss.ledger.service import ZeroLossMessageService

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

QUEUE = "demo.record"


def terminate_own_session() -> None:
    """End this process's database session from another connection, and wait until it is gone."""
    pid = connection.connection.info.backend_pid
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_for(
            f"session {pid} gone after pg_terminate_backend",
            lambda: not other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone(),
            10,
            interval=0.01,
        )


@contextmanager
def session_ended_before_promotion() -> Iterator[None]:
    """Outside a transaction the promotion runs right after the autocommitted INSERT: the
    session is ended as the promotion is about to be sent."""

    promotion = engine_for(connection).sql["PROMOTE"]

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql == promotion:
            terminate_own_session()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield


def send_in_transaction_then_lose_session(message_id: str) -> Message:
    """Inside the caller's transaction the promotion is an on-commit hook: a hook registered
    before it ends the session after the COMMIT, before the promotion runs."""
    with transaction.atomic():
        transaction.on_commit(terminate_own_session)
        return zeroloss.send(QUEUE, {"n": 1}, message_id=message_id, ordering_key="account-7")


def send_many_in_transaction_then_lose_session(message_id: str) -> Message:
    with transaction.atomic():
        transaction.on_commit(terminate_own_session)
        first, _ = zeroloss.send_many(
            QUEUE, [{"n": 1}, {"n": 2}], message_ids=[message_id, "ordered-2"], ordering_key="account-7"
        )
        return first


def send_then_lose_session(message_id: str) -> Message:
    with session_ended_before_promotion():
        return zeroloss.send(QUEUE, {"n": 1}, message_id=message_id, ordering_key="account-7")


@pytest.mark.parametrize(
    "send",
    [
        send_in_transaction_then_lose_session,
        send_then_lose_session,
        send_many_in_transaction_then_lose_session,
    ],
)
def test_a_promotion_lost_after_the_commit_is_logged_and_repaired_by_the_sweep(caplog, send):
    caplog.set_level(logging.WARNING, logger="zeroloss")
    try:
        message = send("ordered-1")
    except BaseException:
        connection.close()  # the session was ended: let the teardown reconnect
        raise
    assert message.message_id == "ordered-1" and message.status == "pending"
    [warning] = [r for r in caplog.records if "ordered-1" in r.getMessage()]
    assert warning.levelno == logging.WARNING and "sweep" in warning.getMessage()
    # The broken connection was closed with the warning: the sender's next query reconnects.
    stored = Message.objects.get(message_id="ordered-1")
    assert stored.available_at is None  # committed, waiting for the promotion that was lost
    assert list(MessageEvent.objects.for_message("ordered-1").values_list("reason", flat=True)) == [
        "persisted"
    ]
    assert not Message.objects.filter(available_at__isnull=False).exists()
    # The sweep's repair leaves a waiting message to its own sender's promotion for a few
    # seconds (REPAIR_AFTER): made that old by the database clock, not by waiting.
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Message._meta.db_table} SET updated_at = updated_at - interval '1 minute'")
    service = ZeroLossMessageService(instance_id="sweeper")
    assert service.sweep().keys_repaired == 1
    lease = service.claim_message("ordered-1")
    assert lease is not None and lease.ordering_key == "account-7"


@contextmanager
def read_only_server() -> Iterator[None]:
    """Every transaction of this session read-only, as on a hot standby or with the server's
    ``default_transaction_read_only = on``."""
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_read_only = on")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET default_transaction_read_only")


def _send() -> None:
    zeroloss.send(QUEUE, {"n": 1}, message_id="ro-1")


def _send_in_transaction() -> None:
    with transaction.atomic():
        zeroloss.send(QUEUE, {"n": 1}, message_id="ro-1")


def _send_ordered() -> None:
    zeroloss.send(QUEUE, {"n": 1}, message_id="ro-1", ordering_key="k")


def _send_many() -> None:
    zeroloss.send_many(QUEUE, [{"n": n} for n in range(3)])


def _send_many_staged() -> None:
    # Past the engine's stage_from: the batch goes through COPY.
    zeroloss.send_many(QUEUE, [{"n": n} for n in range(1500)])


@pytest.mark.parametrize("send", [_send, _send_in_transaction, _send_ordered, _send_many, _send_many_staged])
def test_a_read_only_server_refuses_a_send_with_operational_error(send):
    with read_only_server(), pytest.raises(OperationalError, match="read-only"):
        send()
    assert not Message.objects.exists()
    assert not MessageEvent.objects.exists()


def test_a_read_only_server_refuses_a_claim_with_operational_error():
    """The built-in worker's outage handling (reconnect, back off) knows OperationalError; a
    worker left on a standby after a failover gets it too, and reconnects to the primary."""
    service = ZeroLossMessageService(instance_id="ro-worker")
    service.persist_message("ro-2", QUEUE, {})
    with read_only_server(), pytest.raises(OperationalError, match="read-only"):
        service.claim(QUEUE)
    assert Message.objects.get(message_id="ro-2").status == "pending"
