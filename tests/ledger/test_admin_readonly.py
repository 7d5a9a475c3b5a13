"""Reading the operator's desk never writes to the database.

Opening a page is a GET: the admin must not run an INSERT, UPDATE, DELETE or SET (a
replication measurement that records a commit position is such a write). Every statement of
the request is captured on the connection the admin and its service use, and the message
row is read back afterwards. Committed data (``transaction=True``), so nothing is hidden by a
test transaction: on PostgreSQL the old measurement did write here.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from zeroloss.admin import get_service
from zeroloss.ledger.models import Message

#: A statement that changes something: DML anywhere (a CTE may hide it), or a SET of any kind.
WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE)\b|^\s*SET\b|pg_current_xact_id\(\)", re.IGNORECASE)
READ_ONLY_WORDS = re.compile(r'"[a-z_]*(?:update|delete|insert)[a-z_]*"', re.IGNORECASE)


def writes(queries: list[dict[str, Any]]) -> list[str]:
    # Quoted identifiers such as "updated_at" are column names, not statements.
    return [q["sql"] for q in queries if WRITE.search(READ_ONLY_WORDS.sub('""', q["sql"]))]


@pytest.fixture
def client_and_message(transactional_db: None, settings: Any) -> tuple[Client, Message]:
    settings.ZEROLOSS = {**settings.ZEROLOSS, "REPLICATION_FACTOR": 1, "CACHE_TIMEOUT": 0}
    service = get_service()
    service.persist_message("r1", "emails", {"n": 1})
    lease = service.claim_message("r1")
    assert lease
    assert service.fail("r1", lease.token, "Traceback (most recent call last):\n  boom")
    message = Message.objects.get(message_id="r1")
    assert message.commit_lsn is None  # the measurement would record one: the write to catch
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client, message


@pytest.mark.parametrize(
    "page", ["detail", "changelist", "search", "dashboard", "events", "nodes", "purge page", "blocked keys"]
)
def test_get_of_an_admin_page_never_writes(client_and_message: tuple[Client, Message], page: str) -> None:
    client, message = client_and_message
    url = {
        "detail": reverse("admin:zeroloss_message_change", args=[message.pk]),
        "changelist": reverse("admin:zeroloss_message_changelist"),
        "search": reverse("admin:zeroloss_message_changelist") + "?q=r1",
        "dashboard": reverse("admin:zeroloss_message_dashboard"),
        "events": reverse("admin:zeroloss_messageevent_changelist"),
        "nodes": reverse("admin:zeroloss_replicationnode_changelist"),
        "purge page": reverse("admin:zeroloss_message_purge"),
        "blocked keys": reverse("admin:zeroloss_message_blocked_keys"),
    }[page]
    connection = connections[get_service().using]
    # The first GET of the page: a measurement that records writes on the first view only.
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    assert queries.captured_queries, "nothing captured: wrong connection?"
    assert writes(queries.captured_queries) == []
    assert Message.objects.get(pk=message.pk).commit_lsn is None
    if page == "detail":
        html = response.content.decode()
        assert "1 of 1 copies" in html  # the integrity field still measures replication
        assert "valid" in html


def test_the_write_detector_sees_writes() -> None:
    sql = [
        'UPDATE "zeroloss_message" SET "commit_lsn" = 5',
        "SET LOCAL synchronous_commit TO remote_apply",
        'WITH t AS (UPDATE "zeroloss_message" SET x = 1 RETURNING id) SELECT * FROM t',
        "SELECT pg_current_xact_id()",
        'INSERT INTO "django_session" VALUES (1)',
    ]
    assert writes([{"sql": s} for s in sql]) == sql
    reads = ['SELECT "zeroloss_message"."updated_at", "deleted_flag" FROM "zeroloss_message"', "SELECT NOW()"]
    assert writes([{"sql": s} for s in reads]) == []
