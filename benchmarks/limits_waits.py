"""Where a limited queue's drain waits: ``pg_stat_activity`` sampled during the drains of
:mod:`benchmarks.limits` (docs/benchmarks.md, queue limits).

``python -m benchmarks.limits_waits [--messages N] [--runs R] [--server-url URL]``

Every 10 ms, the state and wait event of each client session of the benchmark's database; printed
per drain as the mean number of sessions in each (state, wait event type, wait event): with 2
workers x 4 claim threads, ``Lock tuple`` / ``Lock transactionid`` are claims waiting for the
queue's control row, ``idle in transaction`` a transaction waiting on its client (a claim holding
the row while its worker's Python runs).
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time

import psycopg

from . import db, limits

_SAMPLE = (
    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity WHERE datname = %s "
    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
)


def sampled_drain(url: str, name: str, n: int, limited: bool) -> tuple[float, dict[str, float]]:
    counts: collections.Counter[str] = collections.Counter()
    samples = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal samples
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                for state, kind, event in conn.execute(_SAMPLE, [name]):
                    counts[f"{state} {kind or '-'} {event or '-'}"] += 1
                samples += 1
                time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rate = limits.drain(n, limited)
    finally:
        stop.set()
        sampler.join()
    return rate, {k: v / max(samples, 1) for k, v in counts.most_common(6)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limits_waits", description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=2, help="Pairs of drains (no limit, then both limits).")
    parser.add_argument("--server-url", help="Any database URL on the PostgreSQL server to use.")
    parser.add_argument("--db-name", default="zeroloss_bench_waits")
    args = parser.parse_args(argv)
    server, name = db.server_url(args.server_url), args.db_name
    admin = db.with_database(server, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        url = db.with_database(server, name)
        limits._setup(url)
        print("| drain | msg/s | mean sessions per (state, wait event) |\n| --- | --- | --- |")
        for _ in range(args.runs):
            for limited in (False, True):
                rate, waits = sampled_drain(url, name, args.messages, limited)
                shown = "; ".join(f"{k}: {v:.2f}" for k, v in waits.items())
                print(
                    f"| {'limits never reached' if limited else 'no limit'} | {rate:,.0f} | {shown} |",
                    flush=True,
                )
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
