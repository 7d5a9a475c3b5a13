"""zeroloss behind a real PgBouncer (1.18) in transaction pooling mode.

What transaction pooling takes away, and what zeroloss does about it:

- named (protocol-level) prepared statements: a statement prepared on one server connection is
  unknown on the next, and a name another client prepared may already exist there. zeroloss
  prepares its hot-path statements unless ``ZEROLOSS["PREPARED_STATEMENTS"] = False``; Django's
  own ``prepare_threshold=None`` never prepares. Proved below: with the setting on, the second
  process through the pooler fails; off, every scenario works.
- LISTEN: registered on whichever server connection ran it. ``zeroloss_worker --no-listen``
  polls instead.
- session state: zeroloss sets none. Its only settings are ``SET LOCAL`` inside a transaction
  (``zeroloss.integrations.replication.record_commit``), which transaction pooling keeps with the
  transaction; it takes no advisory locks, and its one temporary table (a bulk send's staged
  rows) is created and dropped inside its transaction. Django's
  ``QuerySet.iterator()`` outside a transaction (``zeroloss_verify``) uses a ``WITH HOLD``
  cursor across statements: ``DISABLE_SERVER_SIDE_CURSORS = True``.

The scenarios (send, drain, SIGKILL + sweep, the admin's requeue) run in real processes whose
``default`` database is PgBouncer's port, handed over in ``ZEROLOSS_DATABASE_JSON``.
The exact check objects of W030-W032 are asserted here too (without a database).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from django.core.checks import Warning

from tests.infra.pgbouncer import PgBouncer
from tests.infra.pgcluster import PgCluster
from tests.support.cli import manage
from tests.support.failover import QUEUE, ROOT, ledger, wait_reachable, zeroloss_env
from tests.support.processes import Proc
from zeroloss.conf import ZeroLossSettings

pytestmark = pytest.mark.once  # PgBouncer's behaviour, not Django's: the first CI pass runs it

DB = "zl_ha_pgb"
POOLED = {"PREPARED_STATEMENTS": False}
FAST = ("--poll-interval", "0.1", "--concurrency", "2")


@dataclass
class Pooled:
    cluster: PgCluster
    bouncer: PgBouncer

    def database(self, *, direct: bool = False, server_side_cursors: bool = False) -> dict[str, Any]:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": str(self.cluster.primary_port if direct else self.bouncer.port),
            "CONN_MAX_AGE": 0,
            "DISABLE_SERVER_SIDE_CURSORS": not server_side_cursors,
        }

    def env(self, zeroloss: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, str]:
        return zeroloss_env(self.database(**kwargs), POOLED if zeroloss is None else zeroloss)

    def conn(self) -> psycopg.Connection[Any]:
        """Straight to PostgreSQL, for the test's own reads and lease expiry."""
        return self.cluster.connect(dbname=DB)


@pytest.fixture(scope="module")
def pooled() -> Iterator[Pooled]:
    cluster = PgCluster(dbname=DB)
    bouncer = PgBouncer("127.0.0.1", cluster.primary_port, DB, pool_mode="transaction", pool_size=4)
    try:
        cluster.start()
        bouncer.start()
        setup = Pooled(cluster, bouncer)
        migrated = manage(setup.env(), "migrate", "--noinput", "-v", "0", timeout=180)
        assert migrated.returncode == 0, f"migrate through PgBouncer failed: {migrated.stderr}"
        yield setup
    finally:
        bouncer.stop()
        cluster.stop()


def send(env: dict[str, str], prefix: str, count: int) -> list[str]:
    args = {"prefix": prefix, "queue": QUEUE, "max": count, "pace": 0}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.failover", "produce", json.dumps(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines[-1] == {"done": True, "sent": count}
    return [r["id"] for r in lines if r.get("outcome") == "accepted" and r["attempt"] == 1]


def drain(env: dict[str, str], workers: int = 2) -> None:
    procs = [
        Proc(
            [
                sys.executable,
                "manage.py",
                "zeroloss_worker",
                "--queue",
                QUEUE,
                "--no-listen",
                "--burst",
                *FAST,
            ],
            env,
        )
        for _ in range(workers)
    ]
    try:
        for proc in procs:
            assert proc.wait(120) == 0, proc.text[-3000:]
    finally:
        for proc in procs:
            proc.stop(signal.SIGKILL)


def claim_and_kill(env: dict[str, str], message_id: str) -> str:
    """A real process claims ``message_id`` through the pooler and is SIGKILLed holding it."""
    child = Proc(
        [sys.executable, "-m", "tests.infra.child", "claim_and_hang", json.dumps({"message_id": message_id})],
        env,
    )
    try:
        wait_reachable("the claim", 60, lambda: bool(child.records()))
        [claimed] = child.records()
        assert claimed["token"], child.text
    finally:
        child.stop(signal.SIGKILL)
    assert child.popen.returncode == -signal.SIGKILL
    return str(claimed["token"])


def check_ids(env: dict[str, str]) -> list[str]:
    done = manage(env, "check", "--database", "default")
    assert done.returncode == 0, done.stderr
    return sorted(
        {word.strip("():") for word in (done.stdout + done.stderr).split() if word.startswith("(zeroloss.")}
    )


@pytest.mark.postgres_only
@pytest.mark.slow
def test_send_drain_sigkill_sweep_and_admin_requeue_through_transaction_pooling(pooled: Pooled) -> None:
    env = pooled.env()
    assert (
        pooled.bouncer.show("CONFIG")
        and {r["key"]: r["value"] for r in pooled.bouncer.show("CONFIG")}["pool_mode"] == "transaction"
    )

    # send and drain: every message once, each transactional effect once
    ids = send(env, "pgb", 300)
    assert len(ids) == 300
    drain(env)
    with pooled.conn() as conn:
        state = ledger(conn)
    assert {i: state.get(i) for i in ids if state.get(i) != ("completed", 1)} == {}

    # SIGKILL while holding a lease, then the sweep (through the pooler) requeues it
    more = send(env, "pgb-kill", 2)
    # leases of 5 minutes: only the UPDATEs below expire them, whatever the machine's speed
    holder = pooled.env({**POOLED, "ACK_TIMEOUT": 300})
    tokens = {m: claim_and_kill(holder, m) for m in more}
    with pooled.conn() as conn:
        rows = conn.execute(
            "SELECT message_id, status, lease_token::text FROM zeroloss_message WHERE message_id = ANY(%s)",
            [more],
        ).fetchall()
        assert sorted(rows) == sorted((m, "processing", tokens[m]) for m in more)
        conn.execute(  # the lease is expired by moving it into the past, never by waiting
            "UPDATE zeroloss_message SET lease_expires_at = now() - interval '1 second' WHERE message_id = %s",
            [more[0]],
        )
    swept = manage(env, "zeroloss_sweep", "--json")
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["requeued"] == [more[0]]

    # the admin's "requeue stuck" action, through the Django test client, over the pooler:
    # first on a live lease (refused: not stuck), then once it has expired
    refused = admin_requeue(env, more[1])
    assert refused["status"] == 200 and refused["moved"] == 0, refused
    with pooled.conn() as conn:
        conn.execute(
            "UPDATE zeroloss_message SET lease_expires_at = now() - interval '1 second' WHERE message_id = %s",
            [more[1]],
        )
    requeued = admin_requeue(env, more[1])
    assert requeued["status"] == 200 and requeued["moved"] == 1, requeued
    drain(env, workers=1)
    with pooled.conn() as conn:
        state = ledger(conn)
        reasons = conn.execute(
            "SELECT m.message_id, array_agg(e.reason || ':' || e.actor ORDER BY e.id) FROM zeroloss_messageevent e "
            "JOIN zeroloss_message m ON m.id = e.message_id WHERE m.message_id = ANY(%s) GROUP BY 1",
            [more],
        ).fetchall()
    assert [state[m] for m in more] == [("completed", 1), ("completed", 1)]
    trail = {m: [r.split(":")[0] for r in events] for m, events in reasons}
    assert trail[more[0]][:4] == ["persisted", "claimed", "lease_expired", "claimed"]
    assert trail[more[1]][:4] == ["persisted", "claimed", "requeued_by_operator", "claimed"]
    assert [r for m, events in reasons for r in events if r.startswith("requeued_by_operator")] == [
        "requeued_by_operator:ops"
    ]

    # zeroloss_verify streams with QuerySet.iterator(): fine with DISABLE_SERVER_SIDE_CURSORS
    verified = manage(env, "zeroloss_verify", "--json")
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]

    # Measuring a message's copies records its WAL position in a transaction that uses SET LOCAL
    # (synchronous_commit, statement_timeout): through the pooler it works, and leaks nowhere.
    measured = subprocess.run(
        [sys.executable, "-m", "tests.infra.replication_child", "verify", json.dumps({"message_id": ids[0]})],
        cwd=ROOT,
        env={**env, "ZEROLOSS_SETTINGS_JSON": json.dumps({**POOLED, "REPLICATION_FACTOR": 2})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert measured.returncode == 0, measured.stderr[-3000:]
    report = json.loads(measured.stdout.strip().splitlines()[-1])
    assert (report["confirmed"], report["required"], report["measured"]) == (1, 2, True)
    with pooled.conn() as conn:
        row = conn.execute(
            "SELECT commit_lsn FROM zeroloss_message WHERE message_id = %s", [ids[0]]
        ).fetchone()
        assert row is not None and row[0] is not None  # the marker transaction committed
    clients = [pooled.bouncer.connect(autocommit=False) for _ in range(pooled.bouncer.pool_size)]
    seen: set[tuple[Any, ...]] = set()
    try:  # each client in a transaction holds its own server connection: every one is clean
        for c in clients:
            row = c.execute(
                "SELECT pg_backend_pid(), current_setting('synchronous_commit'), "
                "current_setting('statement_timeout')"
            ).fetchone()
            assert row is not None
            seen.add(row)
    finally:
        for c in clients:
            c.close()
    assert len(seen) == pooled.bouncer.pool_size
    assert {(sync, timeout) for _pid, sync, timeout in seen} == {("on", "0")}


@pytest.mark.postgres_only
@pytest.mark.slow
def test_prepared_statements_break_behind_transaction_pooling_unless_turned_off(pooled: Pooled) -> None:
    # Two processes one after the other: PgBouncer hands the second the server connection the
    # first used (LIFO), where zeroloss's statement names are already prepared.
    claim = [sys.executable, "-m", "tests.infra.child", "claim", json.dumps({"queue": "demo.none"})]

    def run(zeroloss: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            claim, cwd=ROOT, env=pooled.env(zeroloss), capture_output=True, text=True, timeout=60
        )

    pooled.bouncer.admin("RECONNECT")  # fresh server connections: no names left by earlier tests
    outcomes = [run({"PREPARED_STATEMENTS": True}) for _ in range(2)]
    assert outcomes[0].returncode == 0, outcomes[0].stderr[-2000:]
    assert outcomes[1].returncode != 0
    assert 'prepared statement "_pg3_0" already exists' in outcomes[1].stderr
    pooled.bouncer.admin("RECONNECT")
    for _ in range(3):
        done = run(POOLED)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout) == {"claims": []}


@pytest.mark.postgres_only
@pytest.mark.slow
def test_database_checks_measure_the_pooler(pooled: Pooled) -> None:
    # through PgBouncer with zeroloss's defaults: both measured warnings
    assert check_ids(pooled.env({}, server_side_cursors=True)) == ["zeroloss.W031", "zeroloss.W032"]
    # configured for transaction pooling: clean
    assert check_ids(pooled.env()) == []
    # straight to PostgreSQL, defaults: no pooler, no warning (the pid is the backend's own)
    assert check_ids(pooled.env({}, direct=True, server_side_cursors=True)) == []


# -- the exact check objects (no database needed) ----------------------------------------------


def _pg(port: str, **extra: Any) -> dict[str, Any]:
    return {"ENGINE": "django.db.backends.postgresql", "NAME": "x", "PORT": port, **extra}


W030 = Warning(
    "Database 'default' uses port 6432, PgBouncer's default, and ZEROLOSS['PREPARED_STATEMENTS'] is True: "
    "behind PgBouncer before 1.21 in transaction mode, zeroloss's prepared statements fail ('prepared "
    "statement \"_pg3_0\" already exists' / 'does not exist').",
    hint="Behind a transaction-pooling PgBouncer set ZEROLOSS['PREPARED_STATEMENTS'] = False (and run "
    "zeroloss_worker with --no-listen). If port 6432 is PostgreSQL itself or a session-pooling PgBouncer, add "
    "'zeroloss.W030' to SILENCED_SYSTEM_CHECKS.",
    obj="settings.DATABASES",
    id="zeroloss.W030",
)
W031 = Warning(
    "Database 'default' is reached through a connection pooler (the backend pid differs from the one the "
    "connection was given) and ZEROLOSS['PREPARED_STATEMENTS'] is True: in transaction pooling mode "
    "(PgBouncer before 1.21, or without max_prepared_statements) zeroloss's prepared statements fail.",
    hint="Set ZEROLOSS['PREPARED_STATEMENTS'] = False and run zeroloss_worker with --no-listen. Session "
    "pooling, or PgBouncer >= 1.21 with max_prepared_statements > 0, keeps prepared statements: then add "
    "'zeroloss.W031' to SILENCED_SYSTEM_CHECKS.",
    obj="settings.ZEROLOSS",
    id="zeroloss.W031",
)
W032 = Warning(
    "Database 'default' is reached through a connection pooler and Django's server-side cursors are on: in "
    "transaction pooling mode a QuerySet.iterator() outside a transaction (zeroloss_verify uses one) declares "
    "a cursor on one server connection and fetches from another.",
    hint="Set DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'] = True. Under session pooling add "
    "'zeroloss.W032' to SILENCED_SYSTEM_CHECKS.",
    obj="settings.DATABASES",
    id="zeroloss.W032",
)


@pytest.mark.parametrize(
    ("port", "prepared", "expected"),
    [
        ("6432", True, [W030]),
        (6432, True, [W030]),
        ("5432,6432", True, [W030]),  # libpq's multi-host form
        ("6432", False, []),
        ("5432", True, []),
        ("16432", True, []),
        ("", True, []),
    ],
)
def test_w030_from_the_configured_port(port: Any, prepared: bool, expected: list[Warning]) -> None:
    from zeroloss.ops import (
        checks,  # here: this module is also a child's entry point, run before django.setup()
    )

    cfg = ZeroLossSettings(PREPARED_STATEMENTS=prepared)
    assert checks.pooler_messages("default", None, _pg(port), cfg) == expected


def test_w031_w032_from_the_measurement() -> None:
    from zeroloss.ops import (
        checks,  # here: this module is also a child's entry point, run before django.setup()
    )

    on, off = ZeroLossSettings(), ZeroLossSettings(PREPARED_STATEMENTS=False)
    assert checks.pooler_messages("default", True, _pg("6432"), on) == [W031, W032]
    assert checks.pooler_messages("default", True, _pg("6432", DISABLE_SERVER_SIDE_CURSORS=True), on) == [
        W031
    ]
    assert checks.pooler_messages("default", True, _pg("6432", DISABLE_SERVER_SIDE_CURSORS=True), off) == []
    assert checks.pooler_messages("default", False, _pg("6432"), on) == []  # measured: no pooler


def test_w030_is_reported_by_manage_py_check(settings: Any) -> None:
    from django.db import connection

    from zeroloss.ops import (
        checks,  # here: this module is also a child's entry point, run before django.setup()
    )

    if connection.vendor != "postgresql":
        assert [m for m in checks.check_backend() if m.id == "zeroloss.W030"] == []
        return
    port = connection.settings_dict["PORT"]
    try:
        connection.settings_dict["PORT"] = "6432"
        assert [m for m in checks.check_backend() if m.id == "zeroloss.W030"] == [W030]
        settings.ZEROLOSS = {"PREPARED_STATEMENTS": False}
        assert [m for m in checks.check_backend() if m.id == "zeroloss.W030"] == []
    finally:
        connection.settings_dict["PORT"] = port


# -- the child process: the admin's requeue action through the Django test client ------------


def _admin_requeue(message_id: str) -> None:
    from django.contrib.auth.models import User
    from django.test import Client
    from django.test.utils import setup_test_environment

    from zeroloss.ledger.models import Message

    setup_test_environment()
    user = User.objects.filter(username="ops").first() or User.objects.create_superuser(
        "ops", "ops@example.com", "x"
    )
    client = Client()
    client.force_login(user)
    before = Message.objects.get(message_id=message_id)
    response = client.post(
        "/admin/zeroloss/message/", {"action": "requeue_stuck", "_selected_action": [before.pk]}, follow=True
    )
    after = Message.objects.get(message_id=message_id)
    notes = [str(m) for m in response.context["messages"]] if response.context else []
    moved = int(before.status == "processing" and after.status == "pending")
    print(json.dumps({"status": response.status_code, "moved": moved, "notes": notes}), flush=True)


def admin_requeue(env: dict[str, str], message_id: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.chaos.test_pgbouncer", message_id],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    _admin_requeue(sys.argv[1])
