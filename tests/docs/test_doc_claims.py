"""Behaviour the docs state in words (quickstart, guarantees, sweep, production), each tested.

- a resend is idempotent only while the message is in the ledger, and only its queue and
  payload are compared: other options are silently ignored (``ledger/persist.py`` ``_existing``);
- ``zeroloss_sweep --loop`` rides out killed connections (closes, logs once, reconnects);
- ``zeroloss_sweep --loop`` and ``zeroloss_worker`` exit with code 4 once the database has been
  unreachable longer than ``DB_OUTAGE_TOLERANCE``;
- a message's normal life writes three audit rows (docs/production.md, retention);
- docs/comparison.md says "yes" for every feature zeroloss has (each checked against the code),
  and its "What zeroloss does not have" names none of them;
- ``delivery.lease_lost`` turns true when a renewal is refused, and when no renewal lands
  before the lease runs out (the database not answering: here, its writes blocked by a lock
  another connection holds, on PostgreSQL and on SQLite).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

import zeroloss
from tests.conftest import ROOT, child_env, database_url
from tests.infra.pgcluster import free_port
from tests.support import backdate, expire_leases, finish, run_worker
from tests.support.factories import retention_not_due
from tests.support.processes import Proc
from zeroloss.conf import ZeroLossSettings
from zeroloss.exceptions import LeaseLostInterrupt
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until
from zeroloss.runtime.processing import Delivery

pytestmark = pytest.mark.django_db(transaction=True)


def reasons(message_id: str) -> list[str]:
    return list(MessageEvent.objects.for_message(message_id).values_list("reason", flat=True))


def test_a_resend_with_other_options_returns_the_stored_message_unchanged():
    service = ZeroLossMessageService()
    first = service.persist_message("opt-1", "demo.record", {"n": 1}, max_attempts=3)
    again = service.persist_message("opt-1", "demo.record", {"n": 1}, max_attempts=9, delay=600, priority=50)
    keyed = service.persist_message("opt-1", "demo.record", {"n": 1}, ordering_key="k")
    stored = Message.objects.get(message_id="opt-1")
    assert again.pk == keyed.pk == first.pk == stored.pk
    assert (stored.max_attempts, stored.priority, stored.ordering_key) == (3, 0, "")
    assert stored.available_at == first.available_at  # not pushed 600 s into the future
    assert reasons("opt-1") == ["persisted"]


def test_a_purged_message_id_is_free_again_and_the_same_send_runs_again():
    service = ZeroLossMessageService()
    service.persist_message("once-1", "demo.record", {"n": 1})
    call_command(
        "zeroloss_worker", "--queue", "demo.record", "--burst", "--poll-interval", "0.05", verbosity=0
    )
    assert Message.objects.get(message_id="once-1").status == Status.COMPLETED
    assert service.persist_message("once-1", "demo.record", {"n": 1}).status == Status.COMPLETED
    backdate(["once-1"], "completed_at", seconds_ago=1)  # older than 0 s within the same millisecond too
    assert service.purge_messages(status=Status.COMPLETED, older_than=0) == 1
    again = service.persist_message("once-1", "demo.record", {"n": 1})  # a new message
    assert again.status == Status.PENDING
    assert reasons("once-1") == ["persisted"]
    call_command(
        "zeroloss_worker", "--queue", "demo.record", "--burst", "--poll-interval", "0.05", verbosity=0
    )
    from project.demo.models import HandledRecord

    assert HandledRecord.objects.filter(message_id="once-1").count() == 2  # handled twice


def test_a_normal_life_writes_three_audit_rows():
    service = ZeroLossMessageService()
    service.persist_messages([(f"life-{i}", "demo.record", {"i": i}) for i in range(50)])
    call_command(
        "zeroloss_worker", "--queue", "demo.record", "--burst", "--poll-interval", "0.05", verbosity=0
    )
    assert Message.objects.filter(status=Status.COMPLETED).count() == 50
    assert MessageEvent.objects.count() == 150
    assert set(MessageEvent.objects.values_list("reason", flat=True)) == {
        "persisted",
        "claimed",
        "acknowledged",
    }


def _sessions(app_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [app_name],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.postgres_only
def test_sweep_loop_rides_out_killed_connections():
    service = ZeroLossMessageService()
    app = "zl-doc-sweep-loop"
    retention_not_due()  # its thread's own connection would be one more session to kill
    sweeper = Proc(
        [sys.executable, "manage.py", "zeroloss_sweep", "--loop", "--interval", "0.2"],
        child_env(PGAPPNAME=app),
    )
    try:
        assert wait_until(lambda: _sessions(app) >= 1, timeout=30), sweeper.text
        for round_ in range(3):
            mid = f"orphan-{round_}"
            service.persist_message(mid, "demo.record", {})
            assert service.claim_message(mid) is not None
            expire_leases([mid])
            # The sweep that requeued it has finished (its report is printed after its hooks):
            # the kill below lands between two sweeps, so each kill is an outage of its own.
            assert wait_until(lambda m=mid: f"requeued {m}" in sweeper.text, timeout=30), sweeper.text
            assert Message.objects.get(message_id=mid).status == Status.PENDING
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = %s",
                    [app],
                )
                assert cursor.fetchone()[0] == 1
            assert wait_until(lambda n=round_ + 1: sweeper.text.count("reachable again") == n, timeout=30), (
                sweeper.text
            )
        assert sweeper.popen.poll() is None, sweeper.text  # still running: nobody restarted it
        assert sweeper.text.count("unreachable since") == 3  # one line per outage, none per retry
        assert "Traceback" not in sweeper.text
        assert reasons("orphan-0") == ["persisted", "claimed", "lease_expired"]
    finally:
        assert sweeper.terminate() == 0, sweeper.text


def _tolerant_settings(tmp_path: Path, tolerance: float) -> dict[str, str]:
    """A settings module: the example project's, with DB_OUTAGE_TOLERANCE set, and a database
    URL on a loopback port where nothing listens (connections are refused)."""
    (tmp_path / "tolerant_settings.py").write_text(
        "from project.settings import *  # noqa: F403\n"
        f"ZEROLOSS = {{**ZEROLOSS, 'DB_OUTAGE_TOLERANCE': {tolerance}}}  # noqa: F405\n"
    )
    return child_env(
        DJANGO_SETTINGS_MODULE="tolerant_settings",
        PYTHONPATH=f"{ROOT}:{tmp_path}",
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{free_port()}/nowhere",
    )


@pytest.mark.postgres_only
@pytest.mark.parametrize(
    ("command", "needle"),
    [
        (["zeroloss_sweep", "--loop", "--interval", "0.2"], "DB_OUTAGE_TOLERANCE=4s"),
        (["zeroloss_worker", "--queue", "demo.record"], "unreachable longer than DB_OUTAGE_TOLERANCE"),
    ],
    ids=["zeroloss_sweep", "zeroloss_worker"],
)
def test_past_db_outage_tolerance_the_process_exits_4(tmp_path: Path, command: list[str], needle: str):
    # Longer than a lease keeper's tick (ACK_TIMEOUT / 3): an idle keeper has nothing to renew,
    # and must not take that for the database being back (which restarted the outage clock).
    env = _tolerant_settings(tmp_path, 4)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "manage.py", *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 4, out
    assert needle in out
    assert out.count("unreachable since") == 1  # one line for the outage, none per retry
    assert "reachable again" not in out
    assert time.monotonic() - started < 60


# -- delivery.lease_lost -----------------------------------------------------------------


@contextlib.contextmanager
def writes_blocked() -> Iterator[None]:
    """Another connection holds a lock that makes every write to the ledger wait (the database
    is up, but no renewal can land): PostgreSQL, an EXCLUSIVE table lock; SQLite, the write lock."""
    if connection.vendor == "postgresql":
        import psycopg

        with psycopg.connect(database_url(), connect_timeout=10) as conn:
            conn.execute("LOCK TABLE zeroloss_message IN EXCLUSIVE MODE")  # reads go on, writes wait
            yield
            conn.rollback()
    else:
        lite = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        try:
            lite.execute("BEGIN IMMEDIATE")
            yield
            lite.execute("ROLLBACK")
        finally:
            lite.close()


def _watch_lease(queue: str) -> tuple[dict[str, bool], threading.Event, threading.Event]:
    """A handler that, on its first attempt, waits (at most 30 s) for its lease to be lost (or
    for the keeper's LeaseLostInterrupt, whichever comes first)."""
    seen: dict[str, bool] = {}
    started, done = threading.Event(), threading.Event()

    def watch(delivery: Delivery) -> None:
        if delivery.attempt > 1:
            return
        seen["at_start"] = delivery.lease_lost
        started.set()
        try:
            wait_until(lambda: delivery.lease_lost, 30, interval=0.02)
        except LeaseLostInterrupt:  # on a worker thread the keeper also stops the handler
            pass
        finally:
            seen["lost"] = delivery.lease_lost
            done.set()

    zeroloss.handler(queue)(watch)
    return seen, started, done


def test_lease_lost_turns_true_when_a_renewal_is_refused():
    seen, started, done = _watch_lease("claims.refused")
    ZeroLossMessageService().persist_message("refused-1", "claims.refused", {})
    worker, thread = run_worker("claims.refused")
    try:
        assert started.wait(30)
        assert expire_leases(["refused-1"]) == 1  # the next renewal finds an expired lease
        assert done.wait(30)
        assert seen == {"at_start": False, "lost": True}
        # Its late outcome is refused; the sweep requeues it and attempt 2 completes.
        assert wait_until(lambda: Message.objects.get(message_id="refused-1").status == Status.COMPLETED, 30)
        assert reasons("refused-1") == ["persisted", "claimed", "lease_expired", "claimed", "acknowledged"]
        assert worker.stats.outcomes["lease_lost"] == 1
    finally:
        finish(worker, thread)


@pytest.mark.django_db(transaction=True)
def test_a_renewal_that_lands_after_the_lease_ran_out_here_leaves_it_lost():
    """Regression (found as a flaky fault test): the worker's clock said the lease had run out, its
    outcome was counted lost, then a slow renewal came back "renewed" and the next flush acknowledged
    the message anyway. Lost stays lost: the late outcome is never sent."""
    from zeroloss.ledger.types import Completion, CompletionReport, Verdict
    from zeroloss.runtime.worker.completer import Completer
    from zeroloss.runtime.worker.keeper import LeaseKeeper

    service = ZeroLossMessageService(instance_id="late-renewer")
    service.persist_message("late-1", "claims.late", {})
    lease = service.claim_message("late-1")
    assert lease is not None
    keeper = LeaseKeeper(service, interval=60)  # not started: the test drives it
    # Held since longer than ACK_TIMEOUT on this worker's clock; the database's lease is fresh.
    keeper.hold([lease], claimed_at=time.monotonic() - service.settings.ACK_TIMEOUT - 1)
    keeper.renew_now()  # the database renews it, but too late for this worker
    assert keeper.is_lost("late-1")
    reports: list[CompletionReport] = []
    completer = Completer(service, keeper, on_report=reports.append, wait=lambda s: False)
    completer.add(Completion(lease, Verdict.ACKNOWLEDGE))
    completer.flush()
    assert (reports[0].acknowledged, reports[0].refused) == ([], ["late-1"])
    assert Message.objects.get(message_id="late-1").status == Status.PROCESSING
    assert reasons("late-1") == ["persisted", "claimed"]
    # Remembered as this worker's until the renewed lease runs out, so never released as unstarted.
    assert [held.message_id for held in keeper.held()] == ["late-1"]


@pytest.mark.django_db(transaction=True)
def test_an_outcome_committed_before_the_keeper_hears_of_it_is_not_a_lost_lease(caplog):
    """Regression (seen in benchmark drains, a batch of 100 at a time): the keeper renewed the
    leases in hand just after their outcomes' commit and just before the worker told it, found
    them no longer processing, and warned that each lease "was lost before it could be renewed".
    An outcome being recorded is not a lost lease; one whose recording failed is watched again."""
    from zeroloss.ledger.types import Completion, CompletionReport, Verdict
    from zeroloss.runtime.worker.completer import Completer
    from zeroloss.runtime.worker.keeper import LeaseKeeper

    service = ZeroLossMessageService(instance_id="settling")
    service.persist_messages([("settled-1", "claims.settle", {}), ("failed-1", "claims.settle", {})])
    settled, failed = service.claim("claims.settle", limit=2)
    keeper = LeaseKeeper(service, interval=60)  # not started: the test drives it
    keeper.hold([settled, failed])
    reports: list[CompletionReport] = []
    completer = Completer(service, keeper, on_report=reports.append, wait=lambda s: False)
    completer.add(Completion(settled, Verdict.ACKNOWLEDGE))
    batch, retried = completer.take()  # as the worker does before its outcome-and-claim transaction
    report = service.record_outcomes(batch)  # committed; the worker has not told the keeper yet
    with caplog.at_level("WARNING", logger="zeroloss"):
        keeper.renew_now()
    assert not keeper.is_lost(settled.message_id)
    assert "lost before it could be renewed" not in caplog.text
    completer.settle(batch, report, retried=retried)
    assert [held.message_id for held in keeper.held()] == [failed.message_id]

    # An attempt that did not record its outcome gives it back: a lease lost meanwhile is found.
    completer.add(Completion(failed, Verdict.ACKNOWLEDGE))
    batch, _ = completer.take()
    completer.restore(batch)
    assert expire_leases([failed.message_id]) == 1
    with caplog.at_level("WARNING", logger="zeroloss"):
        keeper.renew_now()
    assert keeper.is_lost(failed.message_id)
    assert f"lease of {failed.message_id} was lost before it could be renewed" in caplog.text


def test_lease_lost_turns_true_when_no_renewal_lands_before_the_lease_runs_out():
    seen, started, done = _watch_lease("claims.silent")
    ZeroLossMessageService().persist_message("silent-1", "claims.silent", {})
    worker, thread = run_worker("claims.silent")
    try:
        assert started.wait(30)
        blocked_at = time.monotonic()
        with writes_blocked():  # renewals wait; ACK_TIMEOUT (5 s) passes on the worker's clock
            assert done.wait(30)
            waited = time.monotonic() - blocked_at
        assert seen == {"at_start": False, "lost": True}
        # Known lost without any answer from the database: at most one lease after the block.
        assert waited <= worker.base.settings.ACK_TIMEOUT + 1
        assert wait_until(lambda: Message.objects.get(message_id="silent-1").status == Status.COMPLETED, 30)
        assert reasons("silent-1") == ["persisted", "claimed", "lease_expired", "claimed", "acknowledged"]
    finally:
        finish(worker, thread)


# -- docs/comparison.md: what zeroloss has ---------------------------------------------------

COMPARISON = ROOT / "docs" / "comparison.md"


def _zeroloss_cells() -> dict[str, str]:
    """The comparison's rows (between its zeroloss-claims markers): feature -> zeroloss's cell."""
    text = COMPARISON.read_text(encoding="utf-8")
    between = text.split("<!-- zeroloss-claims:start -->", 1)[1].split("<!-- zeroloss-claims:end -->", 1)[0]
    cells: dict[str, str] = {}
    for line in between.splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) < 3 or not parts[0] or set(parts[0]) <= {"-", " "}:
            continue  # a header or separator row
        assert parts[1] != "", f"docs/comparison.md: the row {parts[0]!r} has no zeroloss cell"
        cells[parts[0]] = parts[1]
    return cells


def _accepts(command: str, *args: str) -> bool:
    from django.core.management import load_command_class

    parser = load_command_class("zeroloss", command).create_parser("manage.py", command)
    try:
        parser.parse_args(list(args))
    except SystemExit:
        return False
    return True


def _has_scheduler() -> bool:
    import zeroloss.runtime.schedules  # noqa: F401

    return "SCHEDULES" in {f.name for f in dataclasses.fields(ZeroLossSettings)} and _accepts(
        "zeroloss_schedule", "list"
    )


def _has_queue_limit(option: dict[str, object]) -> bool:
    from zeroloss.conf import parse_settings

    return bool(parse_settings({"QUEUES": {"limited": option}}).QUEUES["limited"])


def _has_async_handlers() -> bool:
    from zeroloss.runtime.handlers import HandlerSpec

    async def handle(delivery: Delivery) -> None:
        return None

    return HandlerSpec("claims.async", handle).is_async


def _has_admin() -> bool:
    from django.contrib import admin

    return admin.site.is_registered(Message)


def _has_tasks_backend() -> bool:
    from zeroloss.integrations.tasks_backend import ZeroLossBackend

    return ZeroLossBackend is not None


def _parameters(func: object) -> set[str]:
    return set(inspect.signature(func).parameters)  # type: ignore[arg-type]


#: Each feature zeroloss has (the comparison's row), with the code that shows it has it.
HAS: dict[str, Callable[[], bool]] = {
    "where messages live": lambda: True,
    "enqueue joins your transaction": lambda: True,
    "a killed worker's message comes back": lambda: _accepts("zeroloss_sweep", "--loop"),
    "a late worker cannot complete a re-run message (fencing)": lambda: (
        "lease_token" in {f.name for f in Message._meta.get_fields()}
    ),
    "retries with backoff, dead letters": lambda: (
        hasattr(Status, "DEAD") and "max_attempts" in _parameters(zeroloss.send)
    ),
    "audit trail of every transition": lambda: "actor" in {f.name for f in MessageEvent._meta.get_fields()},
    "handler writes commit with the acknowledgement": lambda: (
        "transactional" in _parameters(zeroloss.handler)
    ),
    "periodic tasks": _has_scheduler,
    "priorities": lambda: "priority" in _parameters(zeroloss.send),
    "cancel before it runs": lambda: _accepts("zeroloss_cancel", "some-id"),
    "stop a running task": lambda: (
        "abort" in _parameters(zeroloss.cancel) and hasattr(Delivery, "abort_requested")
    ),
    "time limits": lambda: {"soft_time_limit", "time_limit"} <= _parameters(zeroloss.handler),
    "rate limits": lambda: _has_queue_limit({"rate": "10/s"}),
    "concurrency limits across workers": lambda: _has_queue_limit({"concurrency": 2}),
    "pause a queue": lambda: _accepts("zeroloss_queue", "pause", "emails"),
    "retention of finished messages": lambda: (
        "RETENTION" in {f.name for f in dataclasses.fields(ZeroLossSettings)}
    ),
    "ordering keys, deduplication windows": lambda: (
        {"ordering_key", "dedup_key", "dedup_window"} <= _parameters(zeroloss.send)
    ),
    "Django's Tasks API (`@task`, `.enqueue()`)": _has_tasks_backend,
    "operator's admin": _has_admin,
    "concurrency model": lambda: _accepts("zeroloss_worker", "--pool", "process") and _has_async_handlers(),
    "needs beside Django": lambda: True,
    "workflows (chain, group, chord)": lambda: all(
        hasattr(zeroloss, name) for name in ("Workflow", "chain", "group", "chord")
    ),
}
#: What the comparison lists as missing but zeroloss has (the old page said all of these).
NOT_MISSING = (
    "scheduler", "periodic", "cancel", "abort", "rate limit", "concurrency limit", "priorit",
    "pause", "async handler", "process pool", "time limit", "dead letter", "deduplication", "admin",
)  # fmt: skip


def test_the_comparison_says_yes_for_every_feature_zeroloss_has():
    cells = _zeroloss_cells()
    missing_rows = sorted(set(HAS) - set(cells))
    assert not missing_rows, f"docs/comparison.md has no row for {missing_rows}"
    for feature, has_it in HAS.items():
        assert has_it(), f"the code no longer has {feature!r}: correct docs/comparison.md"
        assert cells[feature].lower().startswith("yes"), (
            f"docs/comparison.md, {feature!r}: zeroloss has it, the cell says {cells[feature]!r}"
        )
    # The lease default the row quotes is the code's.
    assert f"{ZeroLossSettings.ACK_TIMEOUT:g} s by default" in cells["a killed worker's message comes back"]


#: What the docs say zeroloss does not have yet, each with the code that would make it exist:
#: phrase (as the comparison and the Celery migration page write it) -> "it exists now".
NOT_YET: dict[str, Callable[[], bool]] = {
    "a retry policy per handler": lambda: bool({"retry_on", "max_attempts"} & _parameters(zeroloss.handler)),
    "a retry at a time the handler chooses": lambda: hasattr(zeroloss, "Retry"),
    "workflows": lambda: any(hasattr(zeroloss, name) for name in ("chain", "group", "workflow", "Workflow")),
}
MIGRATING = ROOT / "docs" / "migrating-from-celery.md"


def test_what_zeroloss_does_not_have_names_nothing_it_has():
    text = COMPARISON.read_text(encoding="utf-8")
    section = text.split("## What zeroloss does not have", 1)[1].split("\n## ", 1)[0].lower()
    claimed = [word for word in NOT_MISSING if word in section]
    assert not claimed, f"docs/comparison.md says zeroloss lacks what it has: {claimed}"
    # Each "not yet" is said while, and only while, the code does not have it.
    migrating = MIGRATING.read_text(encoding="utf-8").lower()
    for phrase, exists in NOT_YET.items():
        where = [name for name, page in (("comparison.md", section), ("migrating-from-celery.md", migrating))
                 if f"**{phrase}" in page]  # fmt: skip
        if exists():
            assert not where, f"zeroloss has {phrase!r} now: docs/{where} still say it does not"
        else:
            assert "comparison.md" in where, f"docs/comparison.md no longer says zeroloss lacks {phrase!r}"
