"""10,000 schedules: the scheduler's database cost per minute, and tick lateness.

``python -m benchmarks.schedules [--schedules N] [--minutes M] [--server-url URL]``

A database ``zeroloss_bench_sched`` on the server is created, migrated, filled with ``N``
database schedules (``every: 60``, so all ``N`` tick at the same second of every minute: the
burst is the worst case), and dropped at the end. One real :class:`Scheduler` runs its rounds
every ``SCHEDULE_INTERVAL`` (1 s), or sooner when a tick falls due (``next_round_in``), for ``M`` whole minutes, on this process's connection; every
statement it sends is counted and timed (``execute_wrapper``). A second scheduler runs the
same rounds beside it (what every extra worker adds: its rounds find the ticks already sent).

Lateness is ``created_at - tick`` of every tick message, by the database clock (the message is
claimable from ``created_at``): p50 and p99.

The raw-SQL limit, in the same run: one ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO
NOTHING`` of ``N`` message rows (no audit rows, no state), the least any scheduler could write
for one burst.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import psycopg

from . import db

DB_NAME = "zeroloss_bench_sched"


def _setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ["ZEROLOSS_SETTINGS_JSON"] = json.dumps({"SCHEDULE_INTERVAL": 1.0})
    import django

    django.setup()


class Meter:
    """Counts and times every statement of one connection."""

    def __init__(self) -> None:
        self.queries = 0
        self.seconds = 0.0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.queries += 1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(schedules: int, minutes: int, server: str) -> dict[str, Any]:
    admin_url = db.with_database(server, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME}")
        conn.execute(f"CREATE DATABASE {DB_NAME}")
    url = db.with_database(server, DB_NAME)
    try:
        _setup_django(url)
        from django.core.management import call_command
        from django.db import connection

        from zeroloss.ledger.models import Message
        from zeroloss.runtime.schedules.models import Schedule
        from zeroloss.runtime.schedules.scheduler import Scheduler

        call_command("migrate", verbosity=0)
        Schedule.objects.bulk_create(
            [
                Schedule(name=f"s{n:05d}", queue="demo.record", every=60, payload={"n": n})
                for n in range(schedules)
            ],
            batch_size=2000,
        )
        main, other = Scheduler(instance_id="bench-a"), Scheduler(instance_id="bench-b")
        main.run_once()
        other.run_once()
        # Start just after a minute's burst, then run whole minutes.
        now = main.read_clock()[0]
        wait = 60 - (now.second + now.microsecond / 1e6) + 1.0
        print(f"  . {schedules} schedules loaded; waiting {wait:.0f}s for a minute to start", file=sys.stderr)
        time.sleep(wait)
        main.run_once()  # the burst of the minute just begun, before the measured window
        other.run_once()
        Message.objects.all().delete()
        meter_main, meter_other = Meter(), Meter()
        rounds = 0
        started = time.monotonic()
        burst_seconds: list[float] = []
        while time.monotonic() - started < minutes * 60:
            t0 = time.monotonic()
            with connection.execute_wrapper(meter_main):
                report = main.run_once()
            if report.sent:
                burst_seconds.append(time.monotonic() - t0)
            t1 = time.monotonic()
            with connection.execute_wrapper(meter_other):
                other_report = other.run_once()
            if other_report.sent:  # the other one found the tick first this time
                burst_seconds.append(time.monotonic() - t1)
            rounds += 1
            time.sleep(max(0.0, main.next_round_in() - (time.monotonic() - t0)))
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM created_at - split_part(message_id, '@', 2)::timestamptz) "
                "FROM zeroloss_message WHERE message_id LIKE 's%%@%%'"
            )
            lateness = [float(r[0]) for r in cursor.fetchall()]
        sent = len(lateness)
        # The raw-SQL limit: one statement storing the burst's N rows.
        with psycopg.connect(url, autocommit=True) as raw:
            raw.execute("TRUNCATE zeroloss_message, zeroloss_message_key CASCADE")
            ids = [f"raw{n:05d}@2026-01-01T00:00:00+00:00" for n in range(schedules)]
            t0 = time.perf_counter()
            # The ids into the key table first, as zeroloss's sends do on PostgreSQL.
            raw.execute(
                "WITH k AS (INSERT INTO zeroloss_message_key (message_id, created_at) SELECT id, now() "
                "FROM unnest(%s::text[]) AS id ON CONFLICT DO NOTHING RETURNING message_id) "
                "INSERT INTO zeroloss_message (message_id, queue_name, payload, checksum, status, attempts, "
                "max_attempts, priority, ordering_key, available_at, claimed_by, last_error, replication_targets, "
                "created_at, updated_at) SELECT k.message_id, 'demo.record', '{}'::jsonb, '', 'pending', 0, 5, 0, "
                "'', now(), '', '', '[]'::jsonb, now(), now() FROM k ON CONFLICT DO NOTHING",
                [ids],
            )
            raw_seconds = time.perf_counter() - t0
        return {
            "schedules": schedules,
            "minutes": minutes,
            "rounds": rounds,
            "ticks_sent": sent,
            "ticks_expected": schedules * minutes,
            "queries_per_minute": meter_main.queries / minutes,
            "db_seconds_per_minute": meter_main.seconds / minutes,
            "second_scheduler_queries_per_minute": meter_other.queries / minutes,
            "second_scheduler_db_seconds_per_minute": meter_other.seconds / minutes,
            "burst_round_seconds_median": statistics.median(burst_seconds) if burst_seconds else None,
            "lateness_p50": percentile(lateness, 0.50) if lateness else None,
            "lateness_p99": percentile(lateness, 0.99) if lateness else None,
            "raw_sql_burst_seconds": raw_seconds,
        }
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--minutes", type=int, default=2)
    parser.add_argument("--server-url")
    args = parser.parse_args(argv)
    result = run(args.schedules, args.minutes, db.server_url(args.server_url))
    print(json.dumps(result, indent=2))
    print(
        f"{result['schedules']} schedules, {result['minutes']} min: {result['ticks_sent']}/{result['ticks_expected']} "
        f"ticks; scheduler {result['queries_per_minute']:.0f} queries/min, "
        f"{result['db_seconds_per_minute']:.2f} s of database time/min (a second scheduler: "
        f"{result['second_scheduler_queries_per_minute']:.0f} queries, "
        f"{result['second_scheduler_db_seconds_per_minute']:.2f} s/min); lateness p50 "
        f"{result['lateness_p50']:.3f} s, p99 {result['lateness_p99']:.3f} s; burst round "
        f"{result['burst_round_seconds_median']:.2f} s vs raw-SQL insert of the burst "
        f"{result['raw_sql_burst_seconds']:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
