"""``zeroloss_partition convert``: a populated unpartitioned ledger (one that 0.2 created and
``migrate`` upgraded) converted to partitions online (issue 31, docs/scaling.md).

The ledger is a database of its own on the test server, made as an upgrade makes it: migrated
to 0009, a message stored, then migrated to the end (0010 leaves a populated ledger as it is).
A real worker drains it and a real producer sends to it while the conversion runs; a
conversion SIGKILLed part way is run again and finishes. Nothing is lost: every message sent is
stored once, handled once, and ``zeroloss_verify`` balances.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from tests.conftest import child_env, database_url
from tests.support.cli import manage
from tests.support.processes import Proc
from tests.support.waiting import wait_for
from zeroloss.ledger.service import ZeroLossMessageService

QUEUE = "demo.record"
SEND = """
import os, zeroloss
k = 0
while k < {batches} and not os.path.exists({stop!r}):
    zeroloss.send_many({queue!r}, [{{"tag": {tag!r}, "k": k, "n": i}} for i in range({size})])
    k += 1
    print(f"sent {{k}}", flush=True)
print(f"done {{k}}", flush=True)
"""


class Ledger:
    """A private ledger database, its URL, and a connection to it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.env = child_env(DATABASE_URL=url, ZEROLOSS_LOG_LEVEL="INFO")

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def scalar(self, sql: str) -> Any:
        return self.query(sql)[0][0]

    def manage(self, *args: str, timeout: float = 300) -> Any:
        return manage(self.env, *args, timeout=timeout)

    def send(self, batches: int, size: int, tag: str, stop: str = "") -> Proc:
        """Send ``batches`` batches of ``size`` (or until the file ``stop`` exists)."""
        code = SEND.format(queue=QUEUE, batches=batches, size=size, tag=tag, stop=stop or "/nonexistent")
        return Proc([sys.executable, "manage.py", "shell", "-c", code], self.env)

    def partitioned(self) -> bool:
        return bool(
            self.scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'zeroloss_message'::regclass)"
            )
        )


@pytest.fixture
def upgraded_ledger(transactional_db: None) -> Iterator[Ledger]:
    """A ledger as 0.2 left it and ``migrate`` upgraded it, holding 3,000 pending messages."""
    name = f"{connection.settings_dict['NAME']}_convert"
    server = database_url().rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    ledger = Ledger(f"{server}/{name}")
    try:
        first = ledger.manage("migrate", "zeroloss", "0009", "-v", "0", timeout=180)
        assert first.returncode == 0, first.stderr
        seeded = ledger.send(1, 1000, "before")
        assert seeded.wait(120) == 0, seeded.text
        rest = ledger.manage("migrate", "-v", "0", timeout=180)
        assert rest.returncode == 0, rest.stderr
        assert not ledger.partitioned()
        more = ledger.send(4, 500, "upgraded")
        assert more.wait(120) == 0, more.text
        # Audit rows written before 0.3 carry no message_created_at: the copy fills it in.
        ledger.query("UPDATE zeroloss_messageevent SET message_created_at = NULL WHERE id % 2 = 0")
        yield ledger
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _assert_nothing_lost(ledger: Ledger, sent: int) -> None:
    stored = ledger.scalar("SELECT count(*) FROM zeroloss_message")
    assert stored == sent
    assert ledger.scalar("SELECT count(DISTINCT message_id) FROM zeroloss_message") == sent
    assert ledger.scalar("SELECT count(*) FROM zeroloss_message_key") == sent
    assert ledger.scalar("SELECT count(*) FROM zeroloss_messageevent WHERE message_created_at IS NULL") == 0
    verify = ledger.manage("zeroloss_verify", "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["conservation"]["balanced"] is True


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_populated_ledger_converts_online_while_a_worker_drains_and_a_producer_sends(
    upgraded_ledger: Ledger, tmp_path: Path
) -> None:
    ledger = upgraded_ledger
    stop = tmp_path / "stop-sending"
    worker = Proc([sys.executable, "manage.py", "zeroloss_worker", "--queue", QUEUE], ledger.env)
    producer = None
    try:
        worker.wait_for("zeroloss_worker: queues", timeout=60)
        wait_for(
            "the worker to complete messages",
            lambda: ledger.scalar("SELECT count(*) FROM zeroloss_message WHERE status = 'completed'") > 0,
            60,
        )
        producer = ledger.send(10_000, 25, "during", stop=str(stop))
        producer.wait_for("sent 1\n", timeout=60)
        converted = ledger.manage("zeroloss_partition", "convert", "--yes", "--batch-size", "500")
        assert converted.returncode == 0, converted.stdout + converted.stderr
        for step in ("build:", "mirror:", "copy:", "verify:", "swap:"):
            assert step in converted.stderr
        assert "The ledger is partitioned." in converted.stdout
        assert ledger.partitioned()
        # The producer goes on across the swap, into the partitioned tables.
        at_swap = producer.text.count("sent ")
        producer.wait_for(f"sent {at_swap + 3}\n", timeout=60)
        stop.touch()
        assert producer.wait(60) == 0, producer.text
        batches = int(producer.text.rsplit("done ", 1)[1].split()[0])
        wait_for(
            "the worker to drain the ledger",
            lambda: ledger.scalar("SELECT count(*) FROM zeroloss_message WHERE status <> 'completed'") == 0,
            180,
        )
    finally:
        worker.terminate()
        if producer is not None:
            producer.terminate()
    sent = 1000 + 4 * 500 + batches * 25
    _assert_nothing_lost(ledger, sent)
    # Each message was handled once (the demo handler records every delivery).
    handled = ledger.query("SELECT count(*), count(DISTINCT message_id) FROM demo_handledrecord")[0]
    assert handled == (sent, sent)
    # Sends after the swap went to the partitioned table's partitions, and its sequence went on.
    assert ledger.scalar("SELECT count(*) FROM ONLY zeroloss_message") == 0
    assert ledger.scalar("SELECT count(*) FROM zeroloss_messageevent WHERE from_status = ''") == sent
    shown = ledger.manage("zeroloss_partition", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    layout = json.loads(shown.stdout)
    assert layout["layout"] == "partitioned" and layout["covered_until"] is not None
    assert ledger.scalar("SELECT to_regclass('zeroloss_message_partitioned')") is None
    assert ledger.scalar("SELECT to_regclass('zeroloss_conversion')") is None


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_conversion_cut_off_part_way_resumes_where_it_stopped(upgraded_ledger: Ledger) -> None:
    ledger = upgraded_ledger
    first = Proc(
        [
            sys.executable,
            "manage.py",
            "zeroloss_partition",
            "convert",
            "--yes",
            "--batch-size",
            "50",
            "-v",
            "2",
        ],
        ledger.env,
    )
    try:
        first.wait_for("copy: zeroloss_message: to id", timeout=120)
    finally:
        first.sigkill_group()
    assert not ledger.partitioned()
    shown = ledger.manage("zeroloss_partition", "show", "--json")
    assert json.loads(shown.stdout)["layout"] == "converting"
    (high, copied) = ledger.query(
        "SELECT high_water, copied_to FROM zeroloss_conversion WHERE table_name = 'zeroloss_message'"
    )[0]
    assert copied < high
    # Changes made while nothing runs are mirrored by the triggers the first run left.
    more = ledger.send(2, 100, "between")
    assert more.wait(120) == 0, more.text
    again = ledger.manage("zeroloss_partition", "convert", "--yes", "--batch-size", "500")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "mirror: zeroloss_message:" not in again.stderr  # resumed: its trigger and high water kept
    assert "build: created" not in again.stderr
    assert ledger.partitioned()
    _assert_nothing_lost(ledger, 1000 + 4 * 500 + 2 * 100)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_show_lists_the_partitions_and_convert_has_nothing_to_do_on_a_new_install(capsys: Any) -> None:
    call_command("zeroloss_partition", "show", "--json")
    shown = json.loads(capsys.readouterr().out)
    assert shown["layout"] == "partitioned"
    names = [p["name"] for p in shown["partitions"]]
    assert names and all(n.startswith("zeroloss_message_p") for n in names)
    assert shown["covered_until"] == shown["partitions"][-1]["end"]
    call_command("zeroloss_partition", "convert", "--yes")
    assert "nothing to do" in capsys.readouterr().err


@pytest.mark.sqlite_only
@pytest.mark.django_db(transaction=True)
def test_sqlite_keeps_its_one_table(capsys: Any) -> None:
    call_command("zeroloss_partition", "show", "--json")
    assert json.loads(capsys.readouterr().out) == {
        "layout": "unpartitioned",
        "covered_until": None,
        "dropping": [],
        "partitions": [],
    }
    with pytest.raises(CommandError, match="only a PostgreSQL ledger is partitioned") as refused:
        call_command("zeroloss_partition", "convert", "--yes")
    assert refused.value.returncode == 2
    assert ZeroLossMessageService().ensure_partitions() == []


def _waiting(ledger: Ledger, query_part: str) -> int | None:
    """The pid of a session waiting for a lock in a statement that contains ``query_part``."""
    found = ledger.query(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
        "AND position(%s in query) > 0",
        [query_part],
    )
    return found[0][0] if found else None


def _killed_while_waiting(ledger: Ledger, run: Proc, holder: psycopg.Connection[Any], query_part: str) -> str:
    """SIGKILL ``run`` once its session waits for a lock ``holder`` holds in a statement that
    contains ``query_part``; then release the lock and wait for that session to end. Its output."""
    try:
        wait_for(
            lambda: f"the conversion to wait in {query_part!r}:\n{run.text[-3000:]}",
            lambda: _waiting(ledger, query_part),
            120,
        )
        pid = _waiting(ledger, query_part)
        os.killpg(run.popen.pid, signal.SIGKILL)
        run.popen.wait(timeout=10)
    finally:
        holder.rollback()
        run.stop(signal.SIGKILL)
    # The killed client's session goes on to its next read, finds the client gone and rolls back.
    wait_for(
        "the killed conversion's session to end",
        lambda: not ledger.query("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]),
        30,
    )
    return run.text


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_conversion_killed_during_its_verify_and_during_its_swap_is_run_again_to_the_end(
    upgraded_ledger: Ledger,
) -> None:
    """SIGKILLed while its verify step reads both layouts, and while its swap transaction has
    dropped the old tables and renamed the new ones: nothing is committed or lost, and a run
    again finishes. Each kill waits until the step is held at a lock a test session holds."""
    ledger = upgraded_ledger
    command = [sys.executable, "manage.py", "zeroloss_partition", "convert", "--yes", "--batch-size", "500"]
    sent = 1000 + 4 * 500
    # 1. Verify. The mirror step is held first (a writer's lock on the ledger), so that the
    # partitions are all built; then the newest one, which nothing writes to, is locked: the
    # copy goes by, and the verify's scan of the partitioned table waits there.
    with psycopg.connect(ledger.url) as writer, psycopg.connect(ledger.url) as holder:
        writer.execute("LOCK TABLE zeroloss_message IN ROW EXCLUSIVE MODE")
        first = Proc(command, ledger.env)
        try:
            wait_for(lambda: first.text[-3000:], lambda: _waiting(ledger, "TRIGGER"), 120)
            newest = ledger.scalar(
                "SELECT max(inhrelid::regclass::text) FROM pg_inherits "
                "WHERE inhparent = 'zeroloss_message_partitioned'::regclass"
            )
            holder.execute(f"LOCK TABLE {newest} IN ACCESS EXCLUSIVE MODE")
        finally:
            writer.rollback()
        text = _killed_while_waiting(ledger, first, holder, "hashtextextended")
    assert "copy: zeroloss_messageevent: to id" in text and "verify:" not in text
    assert not ledger.partitioned()
    assert json.loads(ledger.manage("zeroloss_partition", "show", "--json").stdout)["layout"] == "converting"
    between = ledger.send(2, 100, "after-verify")
    assert between.wait(120) == 0, between.text
    sent += 2 * 100
    # 2. Swap. A session reads the progress table, which the swap transaction drops last.
    with psycopg.connect(ledger.url) as holder:
        holder.execute("SELECT count(*) FROM zeroloss_conversion")
        text = _killed_while_waiting(ledger, Proc(command, ledger.env), holder, "zeroloss_conversion")
    assert "verify: zeroloss_messageevent:" in text and "swap:" not in text
    assert not ledger.partitioned()
    assert ledger.scalar("SELECT to_regclass('zeroloss_message_partitioned')") is not None
    between = ledger.send(2, 100, "after-swap")
    assert between.wait(120) == 0, between.text
    sent += 2 * 100
    # 3. Run again: it verifies and swaps; nothing was lost on the way.
    again = ledger.manage("zeroloss_partition", "convert", "--yes", "--batch-size", "500")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "build: created" not in again.stderr and "mirror: zeroloss_message:" not in again.stderr
    assert ledger.partitioned()
    _assert_nothing_lost(ledger, sent)
