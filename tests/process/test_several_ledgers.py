"""Several ledgers: queues routed to databases on two real PostgreSQL servers.

The second server is a private PostgreSQL this test starts (tests/infra/pgcluster.py). Everything that
talks to it runs in real processes given the routing through the environment
(``ZEROLOSS_EXTRA_DATABASES``, ``ZEROLOSS_SETTINGS_JSON``), as a deployment would set it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest

from project.demo.models import HandledRecord
from tests.conftest import ROOT, child_env
from tests.infra.pgcluster import PgCluster
from tests.support.processes import Proc
from zeroloss.ledger.models import Message
from zeroloss.ledger.service import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.postgres_only,
    pytest.mark.once,
]


@pytest.fixture
def second_server():
    cluster = PgCluster(dbname="ledger2")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_queues_routed_to_two_servers_are_sent_drained_swept_and_verified_per_ledger(children, second_server):
    routing = {
        "ZEROLOSS_EXTRA_DATABASES": json.dumps({"ledger2": second_server.url()}),
        "ZEROLOSS_SETTINGS_JSON": json.dumps({"QUEUE_DATABASES": {"demo.record": "ledger2"}}),
        "ZEROLOSS_ACK_TIMEOUT": "2",
        "ZEROLOSS_SWEEP_INTERVAL": "0.5",
    }
    env = child_env(**routing)
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--database", "ledger2", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert migrate.returncode == 0, migrate.stderr
    producer = children.spawn(
        "send_routed",
        {"sends": {"demo.record": 150, "demo.record_tx": 50}, "elsewhere": "demo.record"},
        **routing,
    )
    [sent] = children.finish(producer, timeout=120)
    assert "lives in database" not in sent["refused"] and "transaction on 'default'" in sent["refused"]
    # The default ledger holds only its own queue; the second server only the routed one.
    assert set(Message.objects.values_list("queue_name", flat=True)) == {"demo.record_tx"}
    assert Message.objects.count() == 50
    with psycopg.connect(second_server.url(), autocommit=True) as other:
        rows = other.execute("SELECT queue_name, count(*) FROM zeroloss_message GROUP BY 1").fetchall()
        assert rows == [("demo.record", 150)]
        assert not other.execute(
            "SELECT 1 FROM zeroloss_message WHERE message_id = 'wrong-transaction'"
        ).fetchone()
    # A worker per ledger; the one on the second server is SIGKILLed mid-drain, a second one sweeps.
    first = Proc(
        [sys.executable, "manage.py", "zeroloss_worker", "--database", "ledger2", "--queue", "demo.record"],
        dict(env, PGAPPNAME="ledger2-a", ZEROLOSS_LOG_LEVEL="INFO"),
    )
    local = Proc(
        [sys.executable, "manage.py", "zeroloss_worker", "--queue", "demo.record_tx"],
        dict(env, ZEROLOSS_LOG_LEVEL="INFO"),
    )
    procs = [first, local]
    try:
        assert wait_until(
            lambda: HandledRecord.objects.filter(queue_name="demo.record").count() >= 20, timeout=60
        ), first.text
        first.popen.kill()
        first.popen.wait(timeout=10)
        second = Proc(
            [
                sys.executable,
                "manage.py",
                "zeroloss_worker",
                "--database",
                "ledger2",
                "--queue",
                "demo.record",
            ],
            dict(env, ZEROLOSS_LOG_LEVEL="INFO"),
        )
        procs.append(second)

        def drained() -> bool:
            with psycopg.connect(second_server.url(), autocommit=True) as other:
                row = other.execute(
                    "SELECT count(*) FROM zeroloss_message WHERE status = 'completed'"
                ).fetchone()
            return bool(row and row[0] == 150) and Message.objects.filter(status="completed").count() == 50

        assert wait_until(drained, timeout=120, interval=0.5), second.text[-3000:]
    finally:
        for p in procs:
            p.terminate(timeout=15)
    handled = set(HandledRecord.objects.values_list("message_id", flat=True))
    assert handled == {f"demo.record-{n}" for n in range(150)} | {f"demo.record_tx-{n}" for n in range(50)}
    # Each ledger balances on its own.
    for alias in ("ledger2", "default"):
        verify = subprocess.run(
            [sys.executable, "manage.py", "zeroloss_verify", "--database", alias, "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert verify.returncode == 0, (alias, verify.stdout[-2000:], verify.stderr[-2000:])
