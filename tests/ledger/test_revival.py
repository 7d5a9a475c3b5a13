"""Reviving a lease that ran out while nobody else took it (statement REVIVE, issue 51).

A claim whose commit takes longer than its lease (an ``fsync`` stall: the lease runs from the
claim's statement) hands its worker leases the database clock has already expired. The worker
revives them — a renewal fenced by the token and the status, not the expiry — and runs them,
instead of leaving them to the sweep with their attempt spent unrun. Leases are expired by
moving their rows into the past; the one test of the worker makes a real claim commit late (a
deferred trigger that waits at its COMMIT, as a stalled ``fsync`` does).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

import zeroloss
from tests.support import expire_leases, finish, run_worker
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until
from zeroloss.runtime.processing import Delivery

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "revival"
MSG = Message._meta.db_table


def reasons(message_id: str) -> list[str]:
    return list(MessageEvent.objects.for_message(message_id).values_list("reason", flat=True))


def row(message_id: str) -> tuple[Any, ...]:
    return Message.objects.filter(message_id=message_id).values_list(
        "status", "attempts", "lease_token", "lease_expires_at"
    )[0]


def claimed(svc: ZeroLossMessageService, message_id: str) -> Any:
    svc.persist_message(message_id, QUEUE, {})
    lease = svc.claim_message(message_id)
    assert lease is not None
    return lease


@pytest.fixture
def svc(db: None) -> ZeroLossMessageService:
    return ZeroLossMessageService(instance_id="revival-worker")


def test_a_lease_that_ran_out_untaken_is_revived_and_its_outcome_recorded(svc):
    lease = claimed(svc, "m")
    expire_leases(["m"])  # as if the claim's commit had taken longer than its lease
    assert not svc.renew_leases([lease]), "the keeper's renewal is fenced by the expiry"
    assert svc.revive_leases([lease]) == {"m"}
    status, attempts, token, expires = row("m")
    assert (status, attempts, token) == ("processing", 1, lease.token)
    assert expires > svc.database_now()  # a whole lease again, from the revival's statement
    assert svc.renew_leases([lease]) == {"m"}  # live: the keeper renews it as any other
    assert svc.acknowledge("m", lease.token)
    assert reasons("m") == ["persisted", "claimed", "acknowledged"]  # one attempt, run once


def test_a_live_lease_is_revived_as_a_renewal(svc):
    lease = claimed(svc, "m")
    assert svc.revive_leases([lease]) == {"m"}
    assert row("m")[:3] == ("processing", 1, lease.token)


def test_no_revival_once_the_sweep_requeued_the_message(svc):
    lease = claimed(svc, "m")
    expire_leases(["m"])
    assert svc.sweep().requeued == ["m"]
    before = row("m")
    assert svc.revive_leases([lease]) == set()
    assert row("m") == before
    assert before[0] == "pending"


def test_no_revival_once_another_worker_claimed_the_message(svc):
    lease = claimed(svc, "m")
    expire_leases(["m"])
    assert svc.sweep().requeued == ["m"]
    other = ZeroLossMessageService(instance_id="another-worker").claim_message("m")
    assert other is not None
    before = row("m")
    assert svc.revive_leases([lease]) == set()
    assert row("m") == before
    assert before[2] == other.token


def test_a_batch_revives_only_the_leases_nobody_else_took(svc):
    kept, swept = claimed(svc, "kept"), claimed(svc, "swept")
    expire_leases(["swept"])
    assert svc.sweep().requeued == ["swept"]
    expire_leases(["kept"])
    assert svc.revive_leases([kept, swept]) == {"kept"}


# -- a revival racing the sweep: the row's lock decides (PostgreSQL) ------------------------


def _in_a_thread(work: Any) -> tuple[threading.Thread, list[Any], list[int]]:
    """Run ``work(service)`` on a connection of its own; its result, and its server pid."""
    done: list[Any] = []
    pid: list[int] = []

    def run() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid.append(cursor.fetchone()[0])
            done.append(work(ZeroLossMessageService(instance_id="revival-worker")))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done, pid


def _waits_for_a_lock(pid: list[int]) -> bool:
    if not pid:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid[0]])
        found = cursor.fetchone()
    return bool(found and found[0] == "Lock")


@pytest.mark.postgres_only
def test_a_sweep_that_took_the_row_first_wins_over_the_revival(svc):
    """The sweep's requeue holds the row (its commit stalled); the revival waits for it, then
    finds the row as the sweep left it: not revived."""
    lease = claimed(svc, "m")
    expire_leases(["m"])
    with transaction.atomic():
        assert svc.sweep().requeued == ["m"]  # not committed: the row stays locked
        thread, revived, pid = _in_a_thread(lambda other: other.revive_leases([lease]))
        assert wait_until(lambda: _waits_for_a_lock(pid), timeout=30), "the revival did not wait for the row"
    thread.join(30)
    assert not thread.is_alive()
    assert revived == [set()]
    assert row("m")[:3] == ("pending", 1, None)


@pytest.mark.postgres_only
def test_a_revival_that_took_the_row_first_leaves_the_sweep_nothing(svc):
    """The revival holds the row (its commit stalled): the sweep skips it (SKIP LOCKED), and
    once the revival commits, finds the lease live."""
    lease = claimed(svc, "m")
    expire_leases(["m"])
    with transaction.atomic():
        assert svc.revive_leases([lease]) == {"m"}  # not committed: the row stays locked
        thread, swept, _ = _in_a_thread(lambda other: other.sweep().requeued)
        thread.join(30)
        assert not thread.is_alive()
        assert swept == [[]]  # skipped, not waited for
    assert svc.sweep().requeued == []  # revived: live
    assert svc.acknowledge("m", lease.token)
    assert reasons("m") == ["persisted", "claimed", "acknowledged"]


# -- the worker: a claim that commits after its leases ran out -------------------------------

SLOW_COMMIT = 1.5  # seconds, longer than the ACK_TIMEOUT below
RAN: list[str] = []


@zeroloss.handler("revival.plain")
def plain(delivery: Delivery) -> None:
    RAN.append(delivery.message_id)


@zeroloss.handler("revival.tx", transactional=True)
def transactional(delivery: Delivery) -> None:
    RAN.append(delivery.message_id)


@pytest.fixture
def claims_commit_late() -> Any:
    """Every claim's COMMIT waits SLOW_COMMIT seconds after its statement set the leases (a
    deferred trigger: it runs at COMMIT, as a stalled fsync holds it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION zl_test_slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF OLD.status = 'pending' AND NEW.status = 'processing' THEN "
            f"PERFORM pg_sleep({SLOW_COMMIT}); END IF; RETURN NULL; END $$"
        )
        cursor.execute(
            f"CREATE CONSTRAINT TRIGGER zl_test_slow_claim AFTER UPDATE ON {MSG} DEFERRABLE INITIALLY "
            "DEFERRED FOR EACH ROW EXECUTE FUNCTION zl_test_slow_claim()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS zl_test_slow_claim ON {MSG}")
            cursor.execute("DROP FUNCTION IF EXISTS zl_test_slow_claim()")


@pytest.mark.postgres_only
@pytest.mark.parametrize("queue", ["revival.plain", "revival.tx"])
def test_a_worker_runs_a_claim_that_committed_after_its_leases_ran_out(settings, claims_commit_late, queue):
    """Before the revival, the worker found the claim's leases expired on arrival and ran
    nothing; each message waited for the sweep, its attempt spent."""
    settings.ZEROLOSS = {**settings.ZEROLOSS, "ACK_TIMEOUT": 1.0}
    RAN.clear()
    ids = [f"late{i}" for i in range(3)]
    ZeroLossMessageService().persist_messages([(mid, queue, {}) for mid in ids])
    worker, thread = run_worker(queue, sweep=False, schedule=False)  # only the revival can help
    try:
        assert wait_until(
            lambda: Message.objects.filter(message_id__in=ids, status=Status.COMPLETED).count() == 3,
            timeout=60,
        ), f"not run: {list(Message.objects.filter(message_id__in=ids).values_list('message_id', 'status'))}"
    finally:
        finish(worker, thread)
    assert sorted(RAN) == ids  # each run once
    for mid in ids:
        assert reasons(mid) == ["persisted", "claimed", "acknowledged"], mid
    assert Message.objects.filter(message_id__in=ids, attempts=1).count() == 3
