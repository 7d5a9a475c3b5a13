"""Both PostgreSQL drivers (issue 25, point 5): what zeroloss does with the raw connection works
on psycopg2 as on psycopg 3 — LISTEN, transactional batches, the COPY path, the session and
transaction-state readings. CI runs this file (and the ledger and worker tests) a second time
in an environment that has only psycopg2 (``make test VENV=.venv-pg2 PSYCOPG=2``, .ci/run);
``ZEROLOSS_TEST_PSYCOPG=2`` makes sure that pass really ran on psycopg2."""

from __future__ import annotations

import logging
import os

import pytest
from django.contrib.auth.models import Group
from django.db import DatabaseError, connection, transaction
from django.db.backends.postgresql.psycopg_any import is_psycopg3

from tests.support import register, run_worker
from zeroloss.ledger.base import engine_for
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.runtime.processing import Delivery
from zeroloss.runtime.wakeup import Wakeup

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


def test_the_driver_is_the_one_this_pass_is_for():
    wanted = os.environ.get("ZEROLOSS_TEST_PSYCOPG", "")
    if wanted == "2":
        assert not is_psycopg3, "this pass must run on psycopg2: psycopg 3 is installed beside it"
        import psycopg2

        assert type(connection.connection).__module__.startswith("psycopg2")
        assert psycopg2.__version__
    elif wanted == "3":
        assert is_psycopg3
    connection.ensure_connection()
    assert type(connection.connection).__module__.split(".")[0] == ("psycopg" if is_psycopg3 else "psycopg2")


def test_listen_wakes_idle_workers_without_a_traceback(caplog):
    caplog.set_level(logging.WARNING, logger="zeroloss")
    wakeup = Wakeup("default", ["p2.wake"]).start()
    try:
        assert wakeup.listening.wait(30), "the listener never started"
        wakeup.event.clear()
        ZeroLossMessageService().persist_message("w1", "p2.wake", {})
        assert wakeup.event.wait(30), "no wake-up arrived"
    finally:
        wakeup.stop()
    assert not [r for r in caplog.records if r.name == "zeroloss"]


def test_a_transactional_batch_runs_and_commits_with_its_acknowledgements():
    def book(delivery: Delivery) -> None:
        Group.objects.create(name=delivery.message_id)
        if delivery.payload.get("fail"):
            raise RuntimeError("rolled back alone")

    register("p2.tx", book, transactional=True)
    service = ZeroLossMessageService()
    service.persist_messages([(f"t{i}", "p2.tx", {}) for i in range(5)])
    service.persist_message("bad", "p2.tx", {"fail": True}, max_attempts=1)
    worker, thread = run_worker("p2.tx", burst=True)
    thread.join(60)
    assert not worker.stats.crashed
    assert sorted(Group.objects.values_list("name", flat=True)) == [f"t{i}" for i in range(5)]
    assert dict(Message.objects.values_list("message_id", "status"))["bad"] == Status.DEAD
    assert Message.objects.filter(status=Status.COMPLETED).count() == 5


def test_a_large_batch_goes_through_copy():
    engine = engine_for(connection)
    service = ZeroLossMessageService()
    n = engine.stage_from  # the smallest batch stored through COPY
    stored = service.persist_messages([(f"c{i}", "p2.copy", {"i": i, "tab": "a\tb\n"}) for i in range(n)])
    assert len(stored) == n
    assert Message.objects.filter(queue_name="p2.copy").count() == n
    assert MessageEvent.objects.filter(reason="persisted", message__queue_name="p2.copy").count() == n
    assert Message.objects.get(message_id="c7").payload == {"i": 7, "tab": "a\tb\n"}
    # Some stored already: the staged path (a temporary table filled by COPY).
    again = service.persist_messages([(f"c{i}", "p2.copy", {"i": i, "tab": "a\tb\n"}) for i in range(n + 5)])
    assert len(again) == n + 5
    assert Message.objects.filter(queue_name="p2.copy").count() == n + 5


def test_the_engine_reads_session_and_transaction_state_from_either_driver():
    engine = engine_for(connection)
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert engine.session_of(connection) == cursor.fetchone()[0]
    assert not engine.connection_lost(connection)
    with transaction.atomic():
        assert not engine.transaction_failed(connection)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1/0")
        except DatabaseError:
            pass
        assert engine.transaction_failed(connection)
        transaction.set_rollback(True)
    connection.close()
    assert engine.connection_lost(connection)


def test_psycopg2_prepares_nothing_and_the_system_check_says_so(settings):
    from zeroloss.ops.checks import check_backend

    service = ZeroLossMessageService()
    service.persist_message("s1", "p2.prep", {})
    [lease] = service.claim("p2.prep")
    assert service.acknowledge("s1", lease.token)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        prepared = cursor.fetchone()[0]
    infos = [m for m in check_backend() if m.id == "zeroloss.I050"]
    if is_psycopg3:
        assert prepared > 0 and infos == []
    else:
        assert prepared == 0
        assert len(infos) == 1 and "psycopg2, which cannot prepare statements" in infos[0].msg
        settings.ZEROLOSS = {**settings.ZEROLOSS, "PREPARED_STATEMENTS": False}
        assert [m for m in check_backend() if m.id == "zeroloss.I050"] == []
