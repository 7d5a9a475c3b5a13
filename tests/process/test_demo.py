"""The demo end to end, as a newcomer runs it (without serving), checked against the database.

The SQLite pass runs the embedded default (SQLite file, built-in workers); the PostgreSQL
pass runs the same demo on PostgreSQL with Celery workers and beat over Redis.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
import redis
from django.db import connection

from project.demo.models import HandledRecord
from tests.conftest import ROOT, database_url
from zeroloss.ledger.models import Message, MessageEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_demo_loses_nothing_and_handles_nothing_twice(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["ZEROLOSS_VAR_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    postgres = connection.vendor == "postgresql"
    if postgres:
        broker = os.environ.get("ZEROLOSS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
        redis.Redis.from_url(broker).flushdb()
        env["DATABASE_URL"] = database_url()
        env["CELERY_BROKER_URL"] = broker
    summary_file = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "project.demo.run",
            "--no-serve",
            "--messages",
            "400",
            "--workers",
            "2",
            "--fail-every",
            "20",
            "--json",
            str(summary_file),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "admin user: admin / " in proc.stdout
    assert "SIGKILL worker pid" in proc.stdout
    summary = json.loads(summary_file.read_text())
    assert summary["transport"] == ("celery" if postgres else "database")
    assert summary["sent"] == 400
    assert summary["lost"] == 0 and summary["handled_twice"] == 0
    assert summary["completed"] + summary["dead_lettered"] == 400
    assert summary["dead_lettered"] == 10  # every 20th of the 200 emails always fails
    # The Django task example: every receipt enqueued with @task(...).enqueue() ran, read back
    # with get_result; the rolled-back one was never stored.
    assert summary["tasks_enqueued"] == summary["tasks_successful"] == 3
    assert "one more rolled back" in proc.stdout
    # Every lease the killed worker died holding was freed by the sweep, exactly once.
    assert summary["orphaned_by_kill"] >= 1
    assert summary["recovered_by_sweep"] == summary["orphaned_by_kill"]
    # Each number is printed with what it counts.
    assert "leases the sweep found expired and put back: exactly the killed worker's" in proc.stdout
    for line in proc.stdout.split("summary (from the ledger and the handlers' own records)\n")[
        1
    ].splitlines()[:11]:
        number, meaning = line[:37].strip(), line[37:].strip()
        assert number.split()[-1].replace(".", "").isdigit() and len(meaning) > 20, line

    prefix = f"demo-{summary['run']}-"
    if postgres:
        statuses = dict(
            (s, Message.objects.filter(message_id__startswith=prefix, status=s).count())
            for s in ("completed", "dead")
        )
        expired = MessageEvent.objects.filter(
            message__message_id__startswith=prefix, reason="lease_expired"
        ).count()
        handled = HandledRecord.objects.filter(message_id__startswith=prefix)
        handled_ids = list(handled.values_list("message_id", flat=True))
    else:
        db = sqlite3.connect(tmp_path / "zeroloss.sqlite3")
        statuses = dict(
            db.execute(
                "SELECT status, COUNT(*) FROM zeroloss_message WHERE message_id LIKE ? GROUP BY status",
                [prefix + "%"],
            ).fetchall()
        )
        expired = db.execute(
            "SELECT COUNT(*) FROM zeroloss_messageevent e JOIN zeroloss_message m ON m.id = e.message_id "
            "WHERE m.message_id LIKE ? AND e.actor LIKE 'sweep@%'",
            [prefix + "%"],
        ).fetchone()[0]
        handled_ids = [
            r[0]
            for r in db.execute(
                "SELECT message_id FROM demo_handledrecord WHERE message_id LIKE ?", [prefix + "%"]
            )
        ]
        db.close()
    assert statuses.get("completed") == summary["completed"]
    assert statuses.get("dead") == summary["dead_lettered"]
    assert expired == summary["recovered_by_sweep"]
    assert len(handled_ids) == len(set(handled_ids)) == summary["completed"]
