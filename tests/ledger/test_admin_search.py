"""Search in the admin: an exact message id is one probe of the unique index, never a scan.

Syntax (docs/admin.md): a bare term is an exact message id or queue name; ``id:`` forces an
exact message id; ``error:`` searches the last error (a scan, asked for explicitly). In the
audit-event admin a bare term is an exact message id and ``actor:`` an exact actor.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from zeroloss.ledger.service import ZeroLossMessageService

CHANGELIST = "admin:zeroloss_message_changelist"
EVENTS = "admin:zeroloss_messageevent_changelist"
#: The index of message ids: the unique one, or (a partitioned ledger) each partition's.
UNIQUE_INDEX = r"(zeroloss_message_id_uniq|zeroloss_msg_message_id_idx_p\d+)"


def scanned_populated_tables(plan: str) -> set[str]:
    """The tables (or partitions) a plan reads whole that hold rows: an empty partition's
    sequential scan reads nothing, and the planner may choose it."""
    scanned = set(re.findall(r"Seq Scan on (zeroloss_\w+)", plan))
    populated = set()
    with connection.cursor() as cursor:
        for table in scanned:
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table})")
            if cursor.fetchone()[0]:
                populated.add(table)
    return populated


@pytest.fixture
def client(db: None) -> Client:
    worker = ZeroLossMessageService(instance_id="worker-1")
    worker.persist_messages([("Order-1", "emails", {}), ("order-1", "emails", {}), ("sms-1", "sms", {})])
    worker.persist_message("error:literal", "emails", {})
    worker.persist_message("failing", "billing", {}, max_attempts=1)
    lease = worker.claim_message("failing")
    assert lease
    assert worker.fail("failing", lease.token, "SMTPServerDisconnected: Connection unexpectedly closed")
    c = Client()
    c.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return c


def found(client: Client, view: str, term: str) -> set[str]:
    response = client.get(reverse(view), {"q": term})
    assert response.status_code == 200
    if view == EVENTS:
        return {e.message.message_id for e in response.context["cl"].result_list}
    return {m.message_id for m in response.context["cl"].result_list}


def test_message_search_syntax(client: Client) -> None:
    assert found(client, CHANGELIST, "order-1") == {"order-1"}  # exact, case-sensitive
    assert found(client, CHANGELIST, "  Order-1 ") == {"Order-1"}
    assert found(client, CHANGELIST, "order") == set()  # no substring match on ids
    assert found(client, CHANGELIST, "sms") == {"sms-1"}  # an exact queue name
    assert found(client, CHANGELIST, "Connection unexpectedly") == set()  # error text only when asked
    assert found(client, CHANGELIST, "error:connection UNEXPECTEDLY") == {"failing"}
    assert found(client, CHANGELIST, "id:error:literal") == {"error:literal"}
    assert found(client, CHANGELIST, "id:sms") == set()  # id: never matches a queue name
    assert found(client, CHANGELIST, "error:") == set()  # an empty error search finds nothing


def test_event_search_syntax(client: Client) -> None:
    assert found(client, EVENTS, "failing") == {"failing"}
    assert found(client, EVENTS, "fail") == set()
    assert found(client, EVENTS, "actor:worker-1") == {
        "Order-1",
        "order-1",
        "sms-1",
        "error:literal",
        "failing",
    }
    assert found(client, EVENTS, "worker-1") == set()  # a bare term is a message id


def search_sql(client: Client, view: str, term: str) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(reverse(view), {"q": term}).status_code == 200
    return [q["sql"] for q in queries.captured_queries if "zeroloss_message" in q["sql"]]


@pytest.mark.parametrize(("view", "term"), [(CHANGELIST, "order-1"), (EVENTS, "order-1")])
def test_a_bare_search_is_exact_equality(client: Client, view: str, term: str) -> None:
    for sql in search_sql(client, view, term):
        assert "UPPER(" not in sql.upper(), sql
        assert " LIKE " not in sql.upper(), sql


def _analyzed_ledger(count: int) -> None:
    worker = ZeroLossMessageService(instance_id="bulk")
    for start in range(0, count, 5000):
        worker.persist_messages(
            [(f"bulk-{i:06d}", f"q{i % 20}", {"i": i}) for i in range(start, min(start + 5000, count))]
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE zeroloss_message")
        cursor.execute("ANALYZE zeroloss_messageevent")


def plans(client: Client, view: str, query: str, literal: str) -> list[str]:
    """EXPLAIN of every statement of the changelist that searched for ``literal`` (rows and count).

    (The sidebar filters' own queries do not depend on the search and are left out.)
    """
    out = []
    with connection.cursor() as cursor:
        for sql in search_sql(client, view, query):
            if not sql.lstrip().upper().startswith("SELECT") or f"'{literal}'" not in sql:
                continue
            cursor.execute("EXPLAIN " + sql)
            out.append("\n".join(row[0] for row in cursor.fetchall()))
    assert len(out) >= 2, out  # the page's rows and its (capped) count
    return out


@pytest.mark.postgres_only
@pytest.mark.parametrize("view", [CHANGELIST, EVENTS])
@pytest.mark.parametrize("prefix", ["", "id:"])
def test_exact_id_search_uses_the_unique_index_on_postgres(client: Client, view: str, prefix: str) -> None:
    _analyzed_ledger(30_000)
    for plan in plans(client, view, f"{prefix}bulk-012345", "bulk-012345"):
        assert not scanned_populated_tables(plan), plan
        assert re.search(
            rf"Index (Only )?Scan using {UNIQUE_INDEX}|Bitmap Index Scan on {UNIQUE_INDEX}", plan
        ), plan
    assert found(client, view, f"{prefix}bulk-012345") == {"bulk-012345"}


# -- the sidebar filters list their values without reading every row --------------------


@pytest.mark.parametrize(
    ("view", "values"),
    [(CHANGELIST, ["billing", "emails", "sms"]), (EVENTS, ["claimed", "dead_lettered", "persisted"])],
)
def test_filter_values_come_from_an_index_walk_not_a_distinct_scan(
    client: Client, view: str, values: list[str], settings: Any
) -> None:
    settings.ZEROLOSS = {**settings.ZEROLOSS, "CACHE_TIMEOUT": 0}  # every view reads them
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(view))
    assert response.status_code == 200
    html = response.content.decode()
    for value in values:
        assert f"={value}" in html, value  # a filter link for each value present
    scans = [q["sql"] for q in queries.captured_queries if "DISTINCT" in q["sql"].upper()]
    assert scans == []
    if view == EVENTS:
        assert "?to_status__exact=dead" in html or "to_status=dead" in html


@pytest.mark.postgres_only
@pytest.mark.parametrize("view", [CHANGELIST, EVENTS])
def test_filter_values_use_an_index_on_postgres(client: Client, view: str, settings: Any) -> None:
    settings.ZEROLOSS = {**settings.ZEROLOSS, "CACHE_TIMEOUT": 0}
    _analyzed_ledger(30_000)
    with CaptureQueriesContext(connection) as queries:
        assert client.get(reverse(view)).status_code == 200
    walks = [q["sql"] for q in queries.captured_queries if "RECURSIVE" in q["sql"].upper()]
    assert walks, "no index walk ran"
    with connection.cursor() as cursor:
        for sql in walks:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan" not in plan, plan


@pytest.mark.postgres_only
@pytest.mark.process
def test_search_benchmark_runs(db: None) -> None:
    """``python -m benchmarks.admin_search`` (docs/admin.md's figures) still runs, at a small size."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT, child_env, database_url

    name = f"zl_admin_search_smoke_{os.getpid()}"
    small = ["--rows", "3000", "--runs", "1", "--server-url", database_url(), "--db-name", name]
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.admin_search", *small],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line[:42].strip(): line[42:] for line in result.stdout.splitlines()}
    assert re.search(f"Index Scan using {UNIQUE_INDEX}", rows["messages, id: prefix (now)"])
    assert re.search(UNIQUE_INDEX, rows["events, exact id (now)"])
    assert not re.search(UNIQUE_INDEX, rows["messages, old search_fields"])
