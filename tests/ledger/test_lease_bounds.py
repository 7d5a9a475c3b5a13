"""Every lock bounded by its lease (issue 24): nothing a worker holds outlives its lease.

Each test reproduces one of the defects found from outside on 0.2.0 and failed on that code.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import OperationalError, connection, connections

import zeroloss
from tests.support import expire_leases, finish, run_worker
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until
from zeroloss.ledger.types import Completion, CompletionReport, Verdict
from zeroloss.runtime.processing import Delivery
from zeroloss.runtime.worker.completer import Completer
from zeroloss.runtime.worker.keeper import Batch, LeaseKeeper
from zeroloss.runtime.worker.sessions import harden_sessions, keepalive_values
from zeroloss.runtime.worker.transactional import ENDED_TRANSACTION

pytestmark = pytest.mark.django_db(transaction=True)

MSG = Message._meta.db_table


def register(queue: str, func: Any, **kwargs: Any) -> None:
    zeroloss.handler(queue, **kwargs)(func)


def reasons(message_id: str) -> list[str]:
    return list(MessageEvent.objects.for_message(message_id).values_list("reason", flat=True))


class _Other:
    """A second session of the test database, on its own connection (another 'process')."""

    def __init__(self) -> None:
        import psycopg

        params = connection.get_connection_params()
        self.conn = psycopg.connect(
            dbname=params["dbname"],
            host=params.get("host"),
            port=params.get("port"),
            user=params.get("user"),
            autocommit=True,
        )

    def run(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(sql, params)
        return cur.fetchall() if cur.description else []

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def other() -> Iterator[_Other]:
    session = _Other()
    try:
        yield session
    finally:
        session.close()


@pytest.mark.postgres_only
def test_a_hung_transactional_handler_costs_its_own_message_one_attempt_and_no_other(settings, other):
    """Defect 1: the batch's rows were locked for as long as the handler hung; HANDLER_TIMEOUT
    did nothing for transactional handlers; an operator's requeue waited on the row lock."""
    settings.ZEROLOSS = {**settings.ZEROLOSS, "HANDLER_TIMEOUT": 2.0}
    hung = threading.Event()
    release = threading.Event()

    def handle(delivery: Delivery) -> None:
        Group.objects.create(name=delivery.message_id)
        if delivery.message_id == "t01" and delivery.attempt == 1:
            hung.set()
            release.wait(60)

    register("lb.hang", handle, transactional=True)
    service = ZeroLossMessageService()
    service.persist_messages([(f"t{i:02d}", "lb.hang", {}) for i in range(30)])
    first, first_thread = run_worker("lb.hang", batch_size=30, instance_id="first")
    second = second_thread = None
    try:
        assert hung.wait(30), first.stats
        # Nothing is row-locked while the handler hangs: another session locks its row at once.
        assert other.run(f"SELECT message_id FROM {MSG} WHERE message_id = 't01' FOR UPDATE NOWAIT") == [
            ("t01",)
        ]
        second, second_thread = run_worker("lb.hang", batch_size=30, instance_id="second")
        assert wait_until(
            lambda: Message.objects.filter(status=Status.COMPLETED).count() == 30, timeout=60
        ), list(Message.objects.exclude(status=Status.COMPLETED).values_list("message_id", "status"))
    finally:
        release.set()
        if second is not None and second_thread is not None:
            finish(second, second_thread)
        finish(first, first_thread)
    # Every effect once: t00's first run was rolled back with the ended transaction.
    names = list(Group.objects.values_list("name", flat=True))
    assert sorted(names) == [f"t{i:02d}" for i in range(30)]
    hung_one = Message.objects.get(message_id="t01")
    assert hung_one.attempts == 2  # the hung run cost one attempt
    assert "released" in reasons("t00")  # ran in the ended transaction: given back, at no cost
    assert Message.objects.get(message_id="t00").attempts == 1
    assert set(Message.objects.exclude(message_id="t01").values_list("attempts", flat=True)) == {1}
    assert first.stats.crashed is False and second is not None and second.stats.crashed is False


def test_a_failed_release_is_tried_again_and_the_messages_run(settings):
    """Defect 3: the keeper dropped the unstarted messages from its batch before the release
    ran; when that statement failed once they were renewed for ever and never ran."""
    register("lb.release", lambda delivery: None)
    service = ZeroLossMessageService(instance_id="keeper-test")
    service.persist_messages([(f"r{i}", "lb.release", {}) for i in range(4)])
    leases = service.claim("lb.release", limit=4)
    keeper = LeaseKeeper(service, interval=0.5)  # not started: the test ticks it
    batch = Batch(leases)
    keeper.hold(leases, batch)
    assert batch.next() is not None
    batch.running_since -= 10  # its handler has "run" ten seconds: the rest waits behind it

    def fail_once(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    with connection.execute_wrapper(fail_once), pytest.raises(OperationalError):
        keeper.release_stuck_unstarted()
    # Still in hand, and still to be given back.
    assert sorted(x.message_id for x in keeper.held()) == ["r0", "r1", "r2", "r3"]
    assert Message.objects.filter(status=Status.PROCESSING).count() == 4
    assert keeper.release_stuck_unstarted() == 3
    assert sorted(x.message_id for x in keeper.held()) == ["r0"]
    released = Message.objects.filter(message_id__in=["r1", "r2", "r3"])
    assert {(m.status, m.attempts) for m in released} == {(Status.PENDING, 0)}


@pytest.mark.postgres_only
def test_the_keeper_never_waits_for_a_row_lock(other):
    """Defect 4: one message row locked elsewhere stalled every renewal of the process."""
    service = ZeroLossMessageService(instance_id="keeper-lock")
    register("lb.renew", lambda delivery: None)
    service.persist_messages([(f"k{i}", "lb.renew", {}) for i in range(3)])
    leases = service.claim("lb.renew", limit=3)
    keeper = LeaseKeeper(service, interval=60)
    keeper.hold(leases)

    def expiries() -> dict[str, Any]:
        return dict(Message.objects.values_list("message_id", "lease_expires_at"))

    before = expiries()
    other.run("BEGIN")
    other.run(f"SELECT 1 FROM {MSG} WHERE message_id = 'k1' FOR UPDATE")
    try:
        done = threading.Event()

        def renew() -> None:
            try:
                keeper.renew_now()
            finally:
                connections.close_all()
                done.set()

        threading.Thread(target=renew, daemon=True).start()
        assert done.wait(20), "the renewal waited for the row lock"
        after = expiries()
        assert after["k0"] > before["k0"] and after["k2"] > before["k2"]
        assert after["k1"] == before["k1"]  # skipped, not waited for
        assert not keeper.is_lost("k1")  # busy for a moment, not lost
    finally:
        other.run("ROLLBACK")
    keeper.renew_now()
    assert expiries()["k1"] > before["k1"]


@pytest.mark.postgres_only
def test_a_claim_that_waited_for_a_lock_starts_its_lease_when_it_got_the_row(other):
    """Defect 5: the lease was computed from the statement's start, before the wait."""
    service = ZeroLossMessageService(instance_id="late-claim")
    service.persist_message("w1", "lb.wait", {})
    other.run("BEGIN")
    other.run(f"LOCK TABLE {MSG} IN SHARE MODE")  # the claim's UPDATE waits for it
    got: list[Any] = []
    pids: list[int] = []

    def claim() -> None:
        try:
            claimer = ZeroLossMessageService(instance_id="late-claim")
            claimer.connection.ensure_connection()
            pids.append(claimer.connection.connection.info.backend_pid)
            got.extend(claimer.claim("lb.wait"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=claim, daemon=True)
    thread.start()
    try:
        assert wait_until(
            lambda: (
                bool(pids)
                and bool(
                    other.run(
                        "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                        [pids[0]],
                    )
                )
            ),
            timeout=60,
        ), other.run("SELECT pid, state, wait_event_type, left(query, 60) FROM pg_stat_activity")
        [(released_at,)] = other.run("SELECT clock_timestamp()")
    finally:
        other.run("COMMIT")
    thread.join(20)
    [lease] = got
    ttl = service.settings.ACK_TIMEOUT
    assert lease.expires_at.timestamp() >= released_at.timestamp() + ttl
    claimed = MessageEvent.objects.for_message("w1").get(reason="claimed")
    assert claimed.created_at >= released_at


@pytest.mark.parametrize("ending", ["COMMIT", "ROLLBACK"])
def test_a_handler_that_ends_its_batch_transaction_fails_alone(ending):
    """Defect 7: a raw ROLLBACK acknowledged earlier handlers with no effect; a raw COMMIT then
    a later failure wrote earlier effects twice."""

    def handle(delivery: Delivery) -> None:
        Group.objects.create(name=delivery.message_id)
        if delivery.message_id == "e3":
            with connection.cursor() as cursor:
                cursor.execute(ending)
        if delivery.message_id == "e5":
            raise RuntimeError("fails after its write")

    register("lb.ends", handle, transactional=True)
    service = ZeroLossMessageService()
    service.persist_messages([(f"e{i}", "lb.ends", {}) for i in range(8)], max_attempts=1)
    worker, thread = run_worker("lb.ends", burst=True, batch_size=8)
    thread.join(60)
    assert not thread.is_alive()
    status = dict(Message.objects.values_list("message_id", "status"))
    effects = list(Group.objects.values_list("name", flat=True))
    assert len(effects) == len(set(effects))  # no effect twice
    # No acknowledgement without its effect, no effect without its acknowledgement.
    assert sorted(effects) == sorted(m for m, s in status.items() if s == Status.COMPLETED)
    assert status["e3"] == Status.DEAD and status["e5"] == Status.DEAD
    assert all(status[f"e{i}"] == Status.COMPLETED for i in (0, 1, 2, 4, 6, 7))
    culprit = Message.objects.get(message_id="e3")
    assert culprit.last_error.startswith(
        ("zeroloss", "django", "psycopg", "sqlite3")
    ) or culprit.last_error == (ENDED_TRANSACTION)
    assert not worker.stats.crashed


def test_a_handler_that_closes_its_connection_fails_alone(settings):
    """Defect 2: innocent messages of the batch ended dead with "Lease expired" unrun."""

    def handle(delivery: Delivery) -> None:
        Group.objects.create(name=delivery.message_id)
        if delivery.message_id == "c2":
            connection.close()

    register("lb.close", handle, transactional=True)
    service = ZeroLossMessageService()
    service.persist_messages([(f"c{i}", "lb.close", {}) for i in range(5)], max_attempts=1)
    worker, thread = run_worker("lb.close", burst=True, batch_size=5)
    thread.join(60)
    assert not thread.is_alive()
    status = dict(Message.objects.values_list("message_id", "status"))
    assert status == {
        "c0": "completed",
        "c1": "completed",
        "c2": "dead",
        "c3": "completed",
        "c4": "completed",
    }
    assert sorted(Group.objects.values_list("name", flat=True)) == ["c0", "c1", "c3", "c4"]
    assert "Lease expired" not in "".join(Message.objects.values_list("last_error", flat=True))
    assert not worker.stats.crashed


@pytest.mark.postgres_only
def test_an_outage_while_resolving_an_unknown_outcome_is_ridden_out(other):
    """Defect 6: resolving an outcome whose commit was unheard queried the database outside the
    outage handling; the database going away again there ended the worker with exit 1."""
    register("lb.unheard", lambda delivery: None)
    service = ZeroLossMessageService(instance_id="unheard")
    service.persist_message("u1", "lb.unheard", {})
    [lease] = service.claim("lb.unheard")
    keeper = LeaseKeeper(service, interval=60)
    keeper.hold([lease])
    completer = Completer(service, keeper, on_report=lambda report: None, wait=lambda s: None)
    done = Completion(lease, Verdict.ACKNOWLEDGE)
    assert service.record_outcomes([done]).acknowledged == ["u1"]  # the first try landed, unheard

    def server_goes_away(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        other.run("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(server_goes_away):
        report = completer.settle([done], CompletionReport(refused=["u1"]), retried=True)
    assert report.refused == ["u1"]  # unknown here; the ledger has it completed
    assert Message.objects.get(message_id="u1").status == Status.COMPLETED


@pytest.mark.postgres_only
def test_worker_sessions_detect_a_dead_peer_on_both_ends():
    """Dead peers: a worker process's sessions set server keepalives, and libpq's when the
    project set none, from DEAD_PEER_TIMEOUT."""
    settings_dict = connections.settings["default"]
    saved = dict(settings_dict.get("OPTIONS", {}))
    try:
        harden_sessions(["default"], 10.0)
        values = keepalive_values(10.0)
        assert values["idle"] + values["count"] * values["interval"] <= 10
        options = settings_dict["OPTIONS"]
        assert options["keepalives"] == 1 and options["tcp_user_timeout"] == 10_000
        seen: dict[str, str] = {}

        def show() -> None:
            try:
                with connections["default"].cursor() as cursor:
                    for name in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"):
                        cursor.execute(f"SHOW {name}")
                        seen[name] = cursor.fetchone()[0]
                    cursor.execute("SHOW tcp_user_timeout")
                    seen["tcp_user_timeout"] = cursor.fetchone()[0]
            finally:
                connections.close_all()

        thread = threading.Thread(target=show)
        thread.start()
        thread.join(30)
        assert seen == {
            "tcp_keepalives_idle": str(values["idle"]),
            "tcp_keepalives_interval": str(values["interval"]),
            "tcp_keepalives_count": "3",
            "tcp_user_timeout": str(values["user_timeout_ms"]),
        }
    finally:
        settings_dict["OPTIONS"] = saved
        from zeroloss.runtime.worker import sessions

        sessions._hardened.pop("default", None)


@pytest.mark.postgres_only
def test_expired_leases_of_a_transactional_batch_record_nothing():
    """The fence at the end of a transactional batch: a batch whose leases ran out (and were
    swept back by another worker) commits none of its effects."""
    from zeroloss.runtime.handlers import get_handler
    from zeroloss.runtime.worker.transactional import TransactionalBatches

    def sweep_elsewhere() -> None:
        try:
            expire_leases(["x0", "x1"])
            ZeroLossMessageService(instance_id="sweeper").sweep()
        finally:
            connections.close_all()

    def handle(delivery: Delivery) -> None:
        Group.objects.create(name=delivery.message_id)
        if delivery.message_id == "x1":
            thread = threading.Thread(target=sweep_elsewhere)
            thread.start()
            thread.join(30)

    register("lb.expired", handle, transactional=True)
    service = ZeroLossMessageService(instance_id="late")
    service.persist_messages([(f"x{i}", "lb.expired", {}) for i in range(2)])
    leases = service.claim("lb.expired", limit=2)
    keeper = LeaseKeeper(service, interval=60)
    keeper.hold(leases, batch := Batch(leases))
    report = TransactionalBatches(service, keeper, stopping=lambda: False).run(
        get_handler("lb.expired"), batch, lambda s: None
    )
    assert sorted(report.refused) == ["x0", "x1"] and not report.acknowledged
    assert not Group.objects.exists()
    assert set(Message.objects.values_list("status", flat=True)) == {Status.PENDING}


@pytest.mark.postgres_only
def test_a_worker_transaction_left_idle_is_ended_by_the_server(other):
    """A worker frozen whole (its kernel still answers keepalives) between the two statements
    of its record-and-claim transaction: the server ends that transaction by its own bound."""
    service = ZeroLossMessageService()
    pid: list[int] = []

    def frozen_between_statements() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                service.engine.bound_transaction(service.connection, 0.2)
                pid.append(service.connection.connection.info.backend_pid)
                assert wait_until(  # the server ends the session; this thread only looks
                    lambda: not other.run("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid[0]]),
                    timeout=20,
                )
                raise RuntimeError("ended")
        except RuntimeError:
            pass
        finally:
            connections.close_all()

    thread = threading.Thread(target=frozen_between_statements)
    thread.start()
    thread.join(30)
    assert pid and not other.run("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid[0]])


@pytest.mark.sqlite_only
def test_a_claim_that_waited_for_sqlites_write_lock_runs_its_messages(settings: Any) -> None:
    """A claim whose transaction waited longer than ACK_TIMEOUT for SQLite's write lock (behind
    other writers) sets leases that start when its statement runs: its worker runs the messages.
    Measured from before the wait, they looked expired on arrival and were left to the sweep."""
    import sqlite3
    import time

    from django.db.backends.signals import connection_created

    settings.ZEROLOSS = {**settings.ZEROLOSS, "ACK_TIMEOUT": 2.0}
    ids = [f"locked{i}" for i in range(3)]
    ZeroLossMessageService().persist_messages([(mid, "demo.record_tx", {}) for mid in ids])
    begun = threading.Event()

    def seen(sql: str) -> None:
        if "BEGIN" in sql:  # traced as the statement starts: before any wait for the lock
            begun.set()

    def trace(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            connection.connection.set_trace_callback(seen)

    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held as a busy writer would
    connection_created.connect(trace)
    try:
        _worker, thread = run_worker("demo.record_tx", max_messages=3)
        assert begun.wait(30), "the worker never tried to write"
        time.sleep(2.0 + 1.5)  # the claim waits longer than its lease would last
        holder.execute("ROLLBACK")
        thread.join(60)
        assert not thread.is_alive(), "the worker did not finish its 3 messages"
    finally:
        connection_created.disconnect(trace)
        holder.close()
    for mid in ids:
        assert reasons(mid) == ["persisted", "claimed", "acknowledged"], mid
    assert Message.objects.filter(message_id__in=ids, status=Status.COMPLETED, attempts=1).count() == 3
