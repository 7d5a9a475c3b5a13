"""``zeroloss_worker --queue Q`` works on the database ``QUEUE_DATABASES`` routes Q to.

A second ledger database on the same PostgreSQL server; the worker, the migration and the
sender are real processes given the routing through the environment, as a deployment sets it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from project.demo.models import HandledRecord
from tests.conftest import child_env, database_url
from tests.support.cli import manage

pytestmark = [pytest.mark.postgres_only, pytest.mark.once]

ROUTED = {"QUEUE_DATABASES": {"demo.record": "ledger2"}}


@pytest.fixture
def second_ledger() -> Iterator[str]:
    """The URL of a second database on the test server, migrated, dropped afterwards."""
    name = f"{connection.settings_dict['NAME']}_ledger2"
    server = database_url().rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env = child_env(ZEROLOSS_EXTRA_DATABASES=json.dumps({"ledger2": f"{server}/{name}"}))
        migrate = manage(env, "migrate", "--database", "ledger2", "-v", "0", timeout=180)
        assert migrate.returncode == 0, migrate.stderr
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.django_db(transaction=True)
def test_a_worker_for_a_routed_queue_drains_that_queues_database(children, second_ledger):
    routing = {
        "ZEROLOSS_EXTRA_DATABASES": json.dumps({"ledger2": second_ledger}),
        "ZEROLOSS_SETTINGS_JSON": json.dumps(ROUTED),
    }
    sender = children.spawn(
        "send_routed", {"sends": {"demo.record": 3}, "elsewhere": "demo.record"}, **routing
    )
    [sent] = children.finish(sender)
    assert sent["done"]
    worker = manage(
        child_env(**routing), "zeroloss_worker", "--queue", "demo.record", "--burst", "--no-listen"
    )
    assert worker.returncode == 0, worker.stderr
    with psycopg.connect(second_ledger, autocommit=True) as ledger2:
        statuses = ledger2.execute("SELECT status, count(*) FROM zeroloss_message GROUP BY 1").fetchall()
    assert statuses == [("completed", 3)], (statuses, worker.stderr[-2000:])
    assert HandledRecord.objects.filter(queue_name="demo.record").count() == 3
    assert "on database 'ledger2'" in worker.stderr  # it says which database it works on


@pytest.mark.parametrize(
    ("args", "says"),
    [
        # one worker process claims from one database
        (
            ["--queue", "demo.record", "--queue", "demo.record_tx"],
            [
                "'demo.record' (ledger2), 'demo.record_tx' (default)",
                "run one zeroloss_worker per database",
                "--database default --queue demo.record_tx; --database ledger2 --queue demo.record",
            ],
        ),
        # a --database that is not the queue's
        (["--database", "default", "--queue", "demo.record"], ["not 'default'", "--database ledger2"]),
    ],
)
def test_a_worker_asked_for_queues_of_another_database_refuses_with_exit_code_2(tmp_path, args, says):
    never_opened = tmp_path / "ledger2.sqlite3"
    env = child_env(
        ZEROLOSS_EXTRA_DATABASES=json.dumps({"ledger2": f"sqlite:///{never_opened}"}),
        ZEROLOSS_SETTINGS_JSON=json.dumps(ROUTED),
    )
    worker = manage(env, "zeroloss_worker", *args, "--burst", "--no-listen")
    assert worker.returncode == 2, (worker.returncode, worker.stderr[-2000:])
    for text in says:
        assert text in worker.stderr, worker.stderr[-2000:]
    assert "Traceback" not in worker.stderr
    assert not never_opened.exists()
