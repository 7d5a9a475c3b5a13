"""How PostgreSQL plans a claim by queue beside many retained messages (docs/scaling.md,
"Retention by partition"): each of the claim's ranges reads the partitions' claim indexes in
order and merges them, stopping at its LIMIT, even where the planner's estimate of the queue's
pending rows falls to almost none; and the setting that makes it so never outlives the claim's
transaction or changes the caller's."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from zeroloss.ledger import partitions, statements_leases
from zeroloss.ledger.base import engine_for
from zeroloss.ledger.postgres import PostgresEngine
from zeroloss.ledger.service import ZeroLossMessageService

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

QUEUE = "demo.record"
RETAINED = 200_000
PENDING = 3_000
DAY = 86400


def load(queue: str, count: int, status: str, *, analyze: bool = True) -> None:
    """``count`` messages of ``queue`` in ``status`` (pending, or completed an hour ago), stored by
    one statement: the shape of a day that retains far more than it has pending. Without
    ``analyze``, the partition's statistics predate them (a backlog sent since the last ANALYZE)."""
    done = status == "completed"
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, "
            "max_attempts, available_at, claimed_by, last_error, replication_targets, created_at, updated_at, "
            "completed_at) SELECT %s || g, %s, '{}'::jsonb, md5(g::text), %s, %s, 5, "
            "statement_timestamp() - %s * interval '1 second', '', '', '[]'::jsonb, "
            "statement_timestamp() - %s * interval '1 second', statement_timestamp(), "
            "CASE WHEN %s THEN statement_timestamp() END FROM generate_series(1, %s) g",
            [f"{queue}-", queue, status, int(done), 3600 if done else 1, 3600 if done else 1, done, count],
        )
        if analyze:
            cursor.execute("ANALYZE zeroloss_message")


def claim_plan(service: ZeroLossMessageService, *, planned: bool, sql: str = "") -> str:
    """EXPLAIN of the claim statement a worker runs (its audit CTE included), or of ``sql`` with
    its parameters, as it is planned with (``planned``) and without statements.PLAN_CLAIM;
    nothing is run."""
    engine = engine_for(connection)
    assert isinstance(engine, PostgresEngine)
    sql = sql or engine.audit_wrapper("CLAIM", False)
    params = {
        "ack_timeout": 30.0,
        "claimed_by": "test-worker",
        **service.leases._claim_range(QUEUE, 100),
        "detail": "",
        "actor": "test-worker",
    }
    with transaction.atomic(), connection.cursor() as cursor:
        if planned:
            cursor.execute(engine.sql["PLAN_CLAIM"], {"bound_ms": 0, "bound": "0"})
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def plan_statements(queries: list[dict[str, str]]) -> list[str]:
    return [q["sql"] for q in queries if "enable_sort" in q["sql"]]


def test_a_claim_beside_many_retained_messages_merges_the_index_scans_instead_of_sorting() -> None:
    service = ZeroLossMessageService()
    load("demo.retained", RETAINED, "completed")
    load(QUEUE, PENDING, "pending")
    unplanned = claim_plan(service, planned=False)
    # What the setting is for: left to its estimate, the planner sorts the queue's pending rows
    # (it expects almost none of them) instead of reading the claim index in order.
    assert re.search(r"Sort\s+\(", unplanned), unplanned
    planned = claim_plan(service, planned=True)
    assert "Merge Append" in planned and "zeroloss_msg_claim_idx" in planned, planned
    # The only sorts left are of ranges the planner knows are empty (the from-head claim has no
    # remembered position: rows=0); and a sort that cannot be avoided does not get the
    # statement compiled (JIT) for its cost.
    sorts = [line for line in planned.splitlines() if re.search(r"\bSort\s+\(", line)]
    assert all("rows=0 " in line for line in sorts), planned
    assert "JIT" not in planned, planned
    # And a claim, as zeroloss runs it, takes the oldest first.
    leases = service.claim(QUEUE, limit=100)
    assert [lease.message_id for lease in leases] == sorted(
        (lease.message_id for lease in leases), key=lambda mid: int(mid.rsplit("-", 1)[1])
    )
    assert len(leases) == 100


def _row_lookup(plan: str) -> str:
    """How the claim's UPDATE finds the rows its subquery chose: its scan of the partitions the
    statement did not prune (after the subquery's, before the audit rows' CTE)."""
    return plan.rsplit("Subplans Removed", 1)[1].split("CTE ev", 1)[0]


def test_a_claim_on_a_backlog_sent_since_the_last_analyze_finds_its_rows_by_id() -> None:
    """The UPDATE checks no status again: checked there, a partition whose statistics predate
    its backlog was planned to find the chosen rows through every pending row of the partition
    (its status index, rechecked for the ids): each claim of 100 read all 20,000."""
    service = ZeroLossMessageService()
    load(QUEUE, 20_000, "pending", analyze=False)
    lookup = _row_lookup(claim_plan(service, planned=True))
    assert re.search(r"Index Scan (using|on) zeroloss_message_p\d+_pkey", lookup), lookup
    assert "status" not in lookup, lookup
    # What it guards against, on this very partition: the status checked again outside.
    engine = engine_for(connection)
    assert isinstance(engine, PostgresEngine)
    claim = engine.audit_wrapper("CLAIM", False)
    checked_again = claim.replace(") c LIMIT %(limit)s))", ") c LIMIT %(limit)s)) AND status = 'pending'")
    assert checked_again != claim
    assert "queue_status_idx" in _row_lookup(claim_plan(service, planned=True, sql=checked_again))


def test_a_claim_in_autocommit_runs_planned_in_a_transaction_of_its_own_and_leaves_nothing_set() -> None:
    service = ZeroLossMessageService()
    service.persist_message("m-1", QUEUE, {"n": 1})
    with CaptureQueriesContext(connection) as queries:
        leases = service.claim(QUEUE, limit=10)
    assert [lease.message_id for lease in leases] == ["m-1"]
    assert len(plan_statements(queries.captured_queries)) == 1
    assert connection.get_autocommit() and not connection.in_atomic_block
    with connection.cursor() as cursor:
        cursor.execute("SHOW enable_sort")
        assert cursor.fetchone() == ("on",)


def test_a_claim_in_the_callers_transaction_puts_the_callers_setting_back() -> None:
    service = ZeroLossMessageService()
    service.persist_message("m-1", QUEUE, {"n": 1})
    service.persist_message("m-2", QUEUE, {"n": 2})
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        jit = cursor.fetchone()
    for setting in ("on", "off"):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL enable_sort = {setting}")
            with CaptureQueriesContext(connection) as queries:
                assert len(service.claim(QUEUE, limit=1)) == 1
            assert len(plan_statements(queries.captured_queries)) == 2  # planned, then put back
            with connection.cursor() as cursor:
                cursor.execute("SHOW enable_sort")
                assert cursor.fetchone() == (setting,)
                cursor.execute("SHOW jit")
                assert cursor.fetchone() == jit


def test_the_workers_outcome_and_claim_transaction_is_planned_once_when_it_begins() -> None:
    service = ZeroLossMessageService()
    for n in range(3):
        service.persist_message(f"m-{n}", QUEUE, {"n": n})
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        service.leases.bound_claim_transaction()
        first = service.claim(QUEUE, limit=1)
        second = service.claim(QUEUE, limit=1)
        with connection.cursor() as cursor:
            cursor.execute("SHOW enable_sort")
            inside = cursor.fetchone()
            cursor.execute(
                "SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'"
            )
            bound = cursor.fetchone()
    assert len(first) == len(second) == 1 and first[0].message_id != second[0].message_id
    planning = plan_statements(queries.captured_queries)
    assert len(planning) == 2  # the one that began the transaction, and SHOW enable_sort
    assert statements_leases.LEASES.texts("postgresql")["PLAN_CLAIM"].split(",")[0] in planning[0]
    assert inside == ("off",)
    assert bound == (str(int(service.settings.ACK_TIMEOUT * 1000)),)
    # A later transaction of the same connection is not taken for it.
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        assert len(service.claim(QUEUE, limit=1)) == 1
    assert len(plan_statements(queries.captured_queries)) == 2


def ack_plan(service: ZeroLossMessageService, *, upper: bool = False) -> tuple[str, str]:
    """EXPLAIN ANALYZE of the acknowledgement of a claim of 100 (the worker's batch statement,
    its audit CTE included), rolled back; and the partition its messages are in. ``upper``: with
    an upper bound beside the lower one (the end of the lower bound's day)."""
    engine = engine_for(connection)
    assert isinstance(engine, PostgresEngine)
    leases = service.claim(QUEUE, limit=100)
    assert len(leases) == 100
    sql = engine.audit_wrapper("ACK", False)
    bound = engine.period([x.created_at for x in leases])
    if upper:
        lower = "created_at >= CAST(%(created_from)s AS timestamptz)"
        assert lower in sql
        sql = sql.replace(
            lower, f"{lower} AND zeroloss_message.created_at < CAST(%(created_to)s AS timestamptz)"
        )
        bound["created_to"] = bound["created_from"] + dt.timedelta(days=1)
    params = {
        **engine.batch(mid=[x.message_id for x in leases], tok=[x.token for x in leases], res=[None] * 100),
        **bound,
        "detail": "",
        "actor": "test-worker",
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            engine.sql["PLAN_CLAIM"], {"bound_ms": 0, "bound": "0"}
        )  # as in the worker's transaction
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    assert re.search(r"Update on zeroloss_message .*rows=100 ", plan), plan
    created = leases[0].created_at
    assert created is not None
    return plan, f"zeroloss_message_p{created.astimezone(dt.UTC):%Y%m%d}"


@pytest.fixture
def unanalyzed_period() -> Iterator[dt.datetime]:
    """The start of a period 40 days ago, its partitions created for the test (no ANALYZE has
    seen them: an earlier test's left statistics on today's), detached and dropped after it."""
    sent = partitions.period_start(partitions.database_now(connection), DAY) - dt.timedelta(days=40)
    created = partitions.create_partitions(connection, sent, sent + dt.timedelta(hours=1), DAY)
    assert created == [f"zeroloss_message_p{sent:%Y%m%d}"]
    yield sent
    with connection.cursor() as cursor:
        for table, _ in partitions.TABLES:
            part = created[0].replace(partitions.MESSAGES, table, 1)
            cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {part}")
            cursor.execute(f"DROP TABLE {part}")


def test_an_acknowledgement_on_a_backlog_sent_since_the_last_analyze_reads_no_creation_time_index(
    unanalyzed_period: dt.datetime,
) -> None:
    """A batch statement is bounded below by its messages' creation day, not above too: a range
    of both bounds, on a partition whose statistics predate its backlog, was planned through the
    creation-time index, every row of the day for each acknowledgement of 100."""
    service = ZeroLossMessageService()
    sent = unanalyzed_period + dt.timedelta(hours=1)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, "
            "max_attempts, available_at, claimed_by, last_error, replication_targets, created_at, updated_at) "
            "SELECT %s || g, %s, '{}'::jsonb, md5(g::text), 'pending', 0, 5, %s, '', '', '[]'::jsonb, %s, %s "
            "FROM generate_series(1, 20000) g",
            [f"{QUEUE}-", QUEUE, sent, sent, sent],
        )
    plan, partition = ack_plan(service)
    assert partition == f"zeroloss_message_p{unanalyzed_period:%Y%m%d}"
    assert "created_idx" not in plan, plan
    # The earlier periods' partitions are pruned when it is planned: the first it updates is
    # its messages'.
    assert min(re.findall(r"Update on (zeroloss_message_p\d+)", plan)) == partition, plan
    # What it guards against, on this very partition: an upper bound beside the lower one.
    plan, _ = ack_plan(service, upper=True)
    assert "created_idx" in plan, plan
