"""An idle ``zeroloss_worker`` costs the database (almost) nothing, and still wakes at once
(docs/worker.md, "What an idle worker costs").

While its listener LISTENs (PostgreSQL), an idle worker's claim threads sleep until a wake-up or
their queues' earliest ``available_at``; the sweep is one transaction a ``SWEEP_INTERVAL``; the
scheduler reads only when a tick is due or a schedule changed. Counted here by PostgreSQL's own
``pg_stat_database.xact_commit`` with a real worker process on a server of the test's own, and
each wake-up a sleeping worker depends on is checked with one (the database clock times it).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import transaction

import zeroloss
from tests.conftest import child_env, database_url
from tests.infra.pgcluster import PgCluster
from tests.support import expire_leases
from tests.support.cli import manage
from tests.support.processes import Proc, db_worker
from tests.support.waiting import wait_for
from zeroloss.ledger.models import Message, MessageEvent
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.runtime.schedules.models import Schedule
from zeroloss.runtime.wakeup import IDLE_POLL, Wakeup
from zeroloss.runtime.worker.loop import BLOCKED_RECHECK

QUEUE = "demo.record"
#: The bound of issue 49: an idle worker, default settings, at most one transaction a second.
BOUND_PER_SECOND = 1.0
#: Before the count: the worker's start-up is over and counted (its first safety-net look has
#: run: PostgreSQL flushes a rarely active backend's counts only at its next activity).
SETTLE = IDLE_POLL + 5.0
#: The idle time counted, to the worker's exit. Its counts are timer-driven, so a loaded host
#: only makes them fewer: about 0.65 a second (the sweep's 0.5, standby discovery, the
#: safety-net looks; benchmarks/idle.py), some 40 against the bound's 60.
WINDOW = 60.0
#: The default sweep interval: the sweep alone commits WINDOW / SWEEP_INTERVAL transactions.
SWEEP_INTERVAL = 2.0
#: Default settings: the environment's overrides (tests shorten the lease and the sweep) removed.
DEFAULTS = {"ZEROLOSS_SETTINGS_JSON": "{}", "CELERY_BROKER_URL": "", "REDIS_URL": ""}


def _listening(url: str, app_name: str) -> bool:
    """Whether a session of ``app_name`` LISTENs in ``url``'s database (asked from the server's
    ``postgres`` database: a session in the counted database would be counted)."""
    server, dbname = url.rsplit("/", 1)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s "
            "AND query LIKE 'LISTEN%%'",
            [dbname, app_name],
        ).fetchone()
    return bool(row and row[0])


def _counts(cluster: PgCluster) -> tuple[int, int]:
    """The worker database's committed transactions, and its sessions other than this one."""
    with cluster.connect(dbname="postgres") as conn:
        row = conn.execute(
            "SELECT xact_commit, (SELECT count(*) FROM pg_stat_activity WHERE datname = %s) "
            "FROM pg_stat_database WHERE datname = %s",
            [cluster.dbname, cluster.dbname],
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _ended(cluster: PgCluster) -> int | None:
    """The database's committed transactions once no session is left in it (else None)."""
    commits, sessions = _counts(cluster)
    return commits if sessions == 0 else None


@pytest.fixture
def private_server() -> Iterator[PgCluster]:
    """A PostgreSQL server of this test's own, its database migrated. On a shared server the
    count is not the worker's alone: PostgreSQL wakes every listening backend to read past other
    databases' notifications once they pile up, a transaction of the listener's database each."""
    cluster = PgCluster(dbname="zl_idle")
    try:
        cluster.start()
        migrate = manage(child_env(DATABASE_URL=cluster.url()), "migrate", "-v", "0", timeout=180)
        assert migrate.returncode == 0, migrate.stderr
        with cluster.connect() as conn:  # what autovacuum would do during the count, done now
            conn.execute("VACUUM ANALYZE")
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.postgres_only
@pytest.mark.once
@pytest.mark.slow
def test_an_idle_worker_makes_at_most_one_transaction_a_second(private_server: PgCluster) -> None:
    """Counted from once its start-up is over to after its exit: PostgreSQL flushes a backend's
    counts lazily but always as the backend ends, so the reading after the exit is exact."""
    url = private_server.url()
    # Every registered queue (ten in the example project), one thread, every setting at its default.
    worker = db_worker(DATABASE_URL=url, PGAPPNAME="zl-idle", **DEFAULTS)
    try:
        wait_for("the worker's listener", lambda: _listening(url, "zl-idle"), 90)
        time.sleep(SETTLE)
        before, _ = _counts(private_server)
        started = time.monotonic()
        time.sleep(WINDOW)
        assert worker.popen.poll() is None, worker.text[-3000:]
    finally:
        assert worker.terminate() == 0, worker.text[-3000:]
    counted = time.monotonic() - started
    # Every session ended (its counts flushed as it did) before the reading.
    after = wait_for("the worker's sessions to end", lambda: _ended(private_server), 30)
    assert after is not None
    own = after - before
    per_second = own / counted
    assert per_second <= BOUND_PER_SECOND, (
        f"an idle worker committed {own} transactions in {counted:.1f} s ({per_second:.2f}/s, the bound "
        f"is {BOUND_PER_SECOND}/s)\n{worker.text[-3000:]}"
    )
    assert own > WINDOW / SWEEP_INTERVAL / 2, f"{own} transactions: fewer than the sweep's alone"


@pytest.fixture
def idle_worker() -> Iterator[Proc]:
    """One worker of ``demo.record`` on the test database, its listener up and its threads idle."""
    worker = db_worker("--queue", QUEUE, PGAPPNAME="zl-idle-wake", ZEROLOSS_SWEEP_INTERVAL="0.5")
    try:
        wait_for("the worker's listener", lambda: _listening(database_url(), "zl-idle-wake"), 90)
        time.sleep(1.0)  # past its first claim round: asleep until told
        yield worker
    finally:
        worker.terminate()


def _event_at(message_id: str, reason: str, nth: int = 1) -> dt.datetime:
    def found() -> dt.datetime | None:
        rows = list(
            MessageEvent.objects.filter(message__message_id=message_id, reason=reason)
            .order_by("id")
            .values_list("created_at", flat=True)
        )
        return rows[nth - 1] if len(rows) >= nth else None

    at = wait_for(f"{reason} #{nth} of {message_id}", found, 60)
    assert at is not None
    return at


#: A woken worker claims within this of the wake-up, by the database clock: its poll was 0.5 s
#: before, asleep it waits IDLE_POLL; a loaded host's scheduling delay is well within it.
PROMPT = dt.timedelta(seconds=min(5.0, IDLE_POLL / 3))


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_sleeping_worker_wakes_for_a_send_a_delay_a_retry_a_requeue_and_a_schedule(
    idle_worker: Proc, settings
) -> None:
    # A send: its insert's NOTIFY.
    sent = zeroloss.send(QUEUE, {}, message_id="idle-send")
    assert _event_at("idle-send", "claimed") - sent.created_at < PROMPT

    # A delayed message: the worker sleeps until its available_at, read after its send's wake-up.
    delayed = zeroloss.send(QUEUE, {}, message_id="idle-delay", delay=3)
    claimed = _event_at("idle-delay", "claimed")
    assert delayed.available_at is not None
    assert delayed.available_at <= claimed < delayed.available_at + PROMPT

    # A retry: the failure moves it back to pending (a wake-up), claimed again once due.
    zeroloss.send(QUEUE, {"fail": True}, message_id="idle-retry", max_attempts=2)
    again = _event_at("idle-retry", "claimed", 2)
    due = Message.objects.get(message_id="idle-retry").available_at  # the retry's (claims keep it)
    assert due is not None
    assert due <= again < due + PROMPT

    # A requeue by the sweep: a lease held elsewhere runs out; the sweep's requeue wakes the worker.
    # First the worker falls into its deep sleep: past the polling that follows a due message.
    time.sleep(BLOCKED_RECHECK + 1)
    service = ZeroLossMessageService(instance_id="idle-elsewhere")
    with transaction.atomic():  # claimed as it is stored: the idle worker never sees it pending
        service.persist_message("idle-requeue", QUEUE, {})
        [lease] = service.claim(QUEUE)
    assert lease.message_id == "idle-requeue"
    assert expire_leases(["idle-requeue"]) == 1
    requeued = _event_at("idle-requeue", "lease_expired")
    assert _event_at("idle-requeue", "claimed", 2) - requeued < PROMPT

    # A database schedule saved: the worker's scheduler reads it at once (its idle rounds are
    # IDLE_POLL apart). Ticks every 5 s from the epoch: one fell due within ON_TIME_WINDOW, sent.
    schedule = Schedule.objects.create(name="idle-tick", queue=QUEUE, every=5, payload={})
    tick = wait_for(
        "the new schedule's first tick",
        lambda: Message.objects.filter(message_id__startswith="idle-tick@").first(),
        60,
    )
    assert tick is not None
    assert tick.created_at - schedule.updated_at < PROMPT


@pytest.mark.ledger
@pytest.mark.django_db(transaction=True)
def test_next_available_in_reads_the_earliest_pending_message_of_the_queues() -> None:
    service = ZeroLossMessageService()
    assert service.next_available_in([QUEUE, "demo.orders"]) is None
    service.persist_message("na-later", QUEUE, {}, delay=60)
    ahead = service.next_available_in([QUEUE, "demo.orders"])
    assert ahead is not None and 55 < ahead <= 60
    service.persist_message("na-sooner", "demo.orders", {}, delay=20)
    ahead = service.next_available_in([QUEUE, "demo.orders"])
    assert ahead is not None and 15 < ahead <= 20
    assert service.next_available_in(["demo.emails"]) is None  # other queues' are not counted
    service.persist_message("na-now", QUEUE, {})
    ahead = service.next_available_in([QUEUE])
    assert ahead is not None and ahead <= 0
    [lease] = service.claim(QUEUE)  # processing: no longer pending
    assert lease.message_id == "na-now"
    ahead = service.next_available_in([QUEUE])
    assert ahead is not None and ahead > 55


@pytest.mark.unit
def test_a_wake_up_between_a_look_and_the_wait_is_not_lost() -> None:
    wakeup = Wakeup("default", [QUEUE])
    seen = wakeup.seen()
    wakeup.wake()  # while the thread was claiming
    started = time.monotonic()
    assert wakeup.wait(30, since=seen) is True
    assert time.monotonic() - started < 1
    # Every waiting thread is woken, and a thread that looks again waits for the next one.
    seen = wakeup.seen()
    woken: list[bool] = []
    threads = [threading.Thread(target=lambda: woken.append(wakeup.wait(30, since=seen))) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    wakeup.wake()
    for t in threads:
        t.join(10)
    assert woken == [True, True, True]
    assert wakeup.wait(0.05, since=wakeup.seen()) is False
