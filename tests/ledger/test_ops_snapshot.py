"""One snapshot of the ledger for every reader, at a cost that does not grow with history (15, 17.8).

``zeroloss_status``, the admin dashboard, the metrics and the health check read the same
:class:`~zeroloss.ops.snapshot.Snapshot`, show durations with one formatter and count statuses
from one list. Completed counts are exact on small tables and estimated from PostgreSQL's
statistics on large ones; the live counts never read a completed row.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cli import run
from tests.support.factories import clear_cache, make_dead, make_stuck
from zeroloss.integrations import replication
from zeroloss.ledger.models import Message, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.management import base
from zeroloss.ops import dashboard, snapshot
from zeroloss.ops.snapshot import compute_snapshot, format_duration, get_snapshot

#: A count per status, all zero (a status added later counts zero here too).
NONE = dict.fromkeys(Status.values, 0)


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def metric(client, name: str, **labels: str) -> float:
    text = client.get("/zeroloss/metrics/").content.decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    raise AssertionError(f"no sample {name}{labels}")


def backed_off_ledger() -> None:
    """A message created an hour ago that became claimable 725 s ago (a retry), and one delayed."""
    service = ZeroLossMessageService()
    service.persist_message("retried", "emails", {"n": 1})
    service.persist_message("delayed", "sms", {"n": 2}, delay=3600)
    now = timezone.now()
    Message.objects.filter(message_id="retried").update(
        created_at=now - dt.timedelta(hours=1), available_at=now - dt.timedelta(seconds=725)
    )


@pytest.mark.django_db
def test_every_reader_reports_the_same_oldest_pending_age(client):
    backed_off_ledger()
    make_stuck(["s1"], queue="emails")
    make_dead(["d1"], queue="sms")
    status = json.loads(run("zeroloss_status", "--json").out)
    board = dashboard.snapshot(ZeroLossMessageService())
    # Claimable messages by available_at: 725 s, not the hour since created_at.
    assert 725 <= status["oldest_pending_age"] < 785
    assert board.oldest_pending_age == status["oldest_pending_age"]  # the same cached snapshot
    assert (
        metric(client, "zeroloss_oldest_pending_age_seconds", queue="emails") == status["oldest_pending_age"]
    )
    assert metric(client, "zeroloss_oldest_pending_age_seconds", queue="sms") == 0.0  # only a delayed one
    assert (
        (board.stuck, board.dead, board.total)
        == (status["stuck"], status["dead"], status["total"])
        == (1, 1, 4)
    )
    assert board.totals == [status["totals"][s] for s in Status.values]
    assert board.requirement.ok is status["replication"]["ok"] is True
    assert board.database_now.isoformat() == status["taken_at"]


@pytest.mark.django_db
def test_one_duration_format_everywhere(client, admin_client):
    backed_off_ledger()
    table = run("zeroloss_status", "--queue", "emails").out
    assert re.search(r"^emails .* 1[23]m \d\ds$", table, re.M), table
    page = admin_client.get("/admin/zeroloss/message/dashboard/").content.decode()
    assert re.search(r'zl-card-value">1[23]m \d\ds<', page), "the dashboard card shows the same format"
    assert dashboard.format_duration is format_duration
    assert not hasattr(base, "format_duration")
    assert dashboard.format_lsn is replication.format_lsn
    assert [format_duration(s) for s in (None, 3.25, 42, 185, 7620, 4 * 86400 + 3 * 3600, -90)] == [
        "-",
        "3.2s",
        "42s",
        "3m 05s",
        "2h 07m",
        "4d 03h",
        "-1m 30s",
    ]


def test_one_status_list():
    assert not hasattr(snapshot, "STATUSES") and not hasattr(dashboard, "STATUSES")
    assert dashboard.Dashboard.__dataclass_fields__["statuses"].default == tuple(Status.values)


@pytest.mark.django_db
def test_small_tables_are_counted_exactly():
    make_dead(["d1"])
    snap = compute_snapshot(ZeroLossMessageService())
    assert snap.completed_estimated is False
    assert snap.totals == NONE | {"dead": 1}


def bulk_completed(counts: dict[str, int]) -> None:
    """Completed rows for the estimate's tests (setup: written directly, as a loader would)."""
    now = timezone.now()
    Message.objects.bulk_create(
        Message(
            message_id=f"done-{queue}-{i}",
            queue_name=queue,
            payload={"i": i},
            checksum="0" * 64,
            status=Status.COMPLETED,
            attempts=1,
            max_attempts=5,
            available_at=now,
            created_at=now,
            updated_at=now,
            completed_at=now,
        )
        for queue, n in counts.items()
        for i in range(n)
    )


def vacuum_analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM (ANALYZE) {Message._meta.db_table}")


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_large_tables_estimate_completed_and_count_the_rest(monkeypatch, client, admin_client):
    bulk_completed({"a": 6000, "b": 2000})
    ZeroLossMessageService().persist_messages([(f"p{i}", "a", {}) for i in range(5)])
    make_stuck(["s1"], queue="b")
    make_dead(["d1", "d2"], queue="c")
    vacuum_analyze()
    monkeypatch.setattr(snapshot, "EXACT_COMPLETED_ROWS", 1000)
    snap = compute_snapshot(ZeroLossMessageService())
    assert snap.completed_estimated is True
    totals = snap.totals
    assert (totals["pending"], totals["processing"], totals["dead"], snap.stuck) == (5, 1, 2, 1)  # exact
    assert abs(totals["completed"] - 8000) <= 400, totals  # an estimate: within 5%
    assert abs(snap.queues["a"].counts["completed"] - 6000) <= 600
    assert abs(snap.queues["b"].counts["completed"] - 2000) <= 600
    assert set(snap.queues) == {"a", "b", "c"}

    data = json.loads(run("zeroloss_status", "--json", "--no-cache").out)
    assert data["completed_estimated"] is True
    table = run("zeroloss_status", "--no-cache").out
    assert table.splitlines()[0].split()[:5] == ["queue", "pending", "processing", "completed~", "dead"]
    assert "completed~: estimated from PostgreSQL's statistics" in table
    assert metric(client, "zeroloss_completed_estimated") == 1.0
    page = admin_client.get("/admin/zeroloss/message/dashboard/?refresh=1").content.decode()
    assert "estimated from PostgreSQL statistics" in page

    monkeypatch.setattr(snapshot, "EXACT_COMPLETED_ROWS", 100_000)
    exact = compute_snapshot(ZeroLossMessageService())
    assert (exact.completed_estimated, exact.totals["completed"]) == (False, 8000)


def rows_read_from_the_message_table() -> int:
    """Rows PostgreSQL's statistics say were read from the message table and its indexes."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # flush this backend's counters now
        # The table and, partitioned, each of its partitions (the parent itself holds no rows).
        cursor.execute(
            "SELECT COALESCE(SUM(t.seq_tup_read), 0) + COALESCE((SELECT SUM(i.idx_tup_read) FROM "
            "pg_stat_user_indexes i WHERE i.relid IN (SELECT relid FROM pg_stat_user_tables WHERE relname = %s "
            "OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass))), 0) "
            "FROM pg_stat_user_tables t WHERE t.relname = %s "
            "OR t.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass)",
            [Message._meta.db_table] * 4,
        )
        return int(cursor.fetchone()[0])


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_snapshot_reads_no_completed_row(monkeypatch):
    bulk_completed({"a": 5000, "b": 5000})
    ZeroLossMessageService().persist_messages([(f"p{i}", "a", {}) for i in range(20)])
    make_stuck(["s1", "s2"], queue="b")
    make_dead(["d1"], queue="b")
    vacuum_analyze()
    monkeypatch.setattr(snapshot, "EXACT_COMPLETED_ROWS", 1000)  # 10,000 rows: "large"
    service = ZeroLossMessageService()
    before = rows_read_from_the_message_table()
    snap = compute_snapshot(service)
    read = rows_read_from_the_message_table() - before
    assert snap.completed_estimated
    # The live rows (23), a few index entries per queue for the skip scan, nothing of the
    # 10,000 completed rows (the full GROUP BY of issue 17.8 read all of them).
    assert read < 100, f"{read} rows read for one snapshot"
    assert snap.totals["pending"] == 20 and snap.stuck == 2


@pytest.mark.django_db
def test_dashboard_integrity_looks_at_live_rows_only():
    make_dead(["d1"])
    Message.objects.filter(message_id="d1").update(attempts=F("max_attempts") + 1)
    board = dashboard.collect(ZeroLossMessageService())
    assert board.integrity.attempts_beyond_max == 1
    assert get_snapshot(ZeroLossMessageService()).dead == 1
