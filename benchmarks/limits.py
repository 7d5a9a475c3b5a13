"""Queue limits (issue 27, docs/control.md): what a limit costs, and whether it holds.

``python -m benchmarks.limits [--messages N (30000)] [--runs R (5)] [--minute] [--never-reached both|concurrency|rate]``
(also ``python -m benchmarks --only limits``, the quick profile).

A database (default ``zeroloss_bench_limits``) is created, migrated and dropped at the end.
Workers are real ``zeroloss_worker --burst`` processes (``benchmarks.settings``), started
together and timed from the first to the last claim of the ledger's audit rows (database clock).

1. **Drain cost of a limit never reached**: ``N`` no-op messages drained by 2 workers x 4
   threads with no limit, then with ``concurrency 10000, rate 1000000/s`` (every claim counts
   what is in flight and takes tokens, on PostgreSQL in one of the queue's advisory slots, but
   none is held back); runs alternate, the ratio is of the medians (issue: <= 10% cost, i.e.
   ratio >= 0.90). Also printed: each run's own ratio, and the rates while both workers claim
   (from the later worker's first claim to the earlier one's last: no start-up skew, no tail).
   Every drain starts after a ``CHECKPOINT``.
2. **A limit of N gives N in flight**: 3 workers x 4 threads drain 50 ms messages under
   ``concurrency 4``; the processing count sampled every 20 ms (max, and the mean while the
   backlog lasts).
3. **The rate limiter's accuracy**: ``rate 20/s`` for 10 s (``--minute``: ``600/m`` for 60 s),
   3 workers x 4 threads, a backlog larger than the period allows: claims per second overall
   (against the rate), and the most in any 1 s window.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from . import db

ROOT = Path(__file__).resolve().parent.parent


def _setup(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


_WORKER = [sys.executable, "manage.py", "zeroloss_worker", "--burst", "--no-sweep", "--no-schedule"]
_WORKER += ["--poll-interval", "0.2"]


def _workers(n: int, queue: str, threads: int = 4) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [
        subprocess.Popen(
            [*_WORKER, "--queue", queue, "--concurrency", str(threads)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def _wait(procs: list[subprocess.Popen[bytes]], timeout: float = 600) -> None:
    for p in procs:
        p.wait(timeout=timeout)


def _reset(queue: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE zeroloss_messageevent, zeroloss_message, zeroloss_message_key, zeroloss_ordering_head, "
            "zeroloss_queuecontrol, zeroloss_rate_bucket CASCADE"
        )
        # Each drain starts after a checkpoint: one falling inside a drain (the WAL of the drains
        # before it) slowed whichever side it hit, by up to a third.
        cursor.execute("CHECKPOINT")


def _send(queue: str, n: int) -> None:
    from zeroloss.ledger.service import ZeroLossMessageService

    service = ZeroLossMessageService()
    for start in range(0, n, 1000):
        service.persist_messages([(f"{queue}-{i}", queue, {}) for i in range(start, min(n, start + 1000))])


def _claims(queue: str) -> list[float]:
    """Epoch seconds of every claim of the queue (its audit rows, database clock), sorted."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM e.created_at)::float8 FROM zeroloss_messageevent e "
            "JOIN zeroloss_message m ON m.id = e.message_id WHERE m.queue_name = %s AND e.reason = 'claimed' "
            "ORDER BY 1",
            [queue],
        )
        return [r[0] for r in cursor.fetchall()]


def steady_rate(queue: str) -> float:
    """Claims per second while every worker process claimed: from the last process's first
    claim to the first process's last (audit rows by actor, database clock). Without the start
    of one process before the other's and the backlog's tail, which vary from drain to drain."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "WITH c AS (SELECT split_part(e.actor, '/', 1) AS p, e.created_at AS t FROM zeroloss_messageevent e "
            "JOIN zeroloss_message m ON m.id = e.message_id WHERE m.queue_name = %s AND e.reason = 'claimed'), "
            "w AS (SELECT max(f) AS t0, min(l) AS t1 FROM (SELECT min(t) f, max(t) l FROM c GROUP BY p) x) "
            "SELECT count(*) FILTER (WHERE c.t >= w.t0 AND c.t <= w.t1), extract(epoch FROM w.t1 - w.t0)::float8 "
            "FROM c, w GROUP BY w.t0, w.t1",
            [queue],
        )
        n, seconds = cursor.fetchone()
    return n / max(seconds, 1e-6)


def claim_statements(queue: str) -> dict[str, float]:
    """The drain's claims, one per transaction (its audit rows' ``xmin``): how many, how many
    messages each, and the mean milliseconds from its first to its last audit row (the claim
    statement's own time: a limited queue's claims hold its row lock for at least that)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), avg(n)::float8, 1000 * extract(epoch FROM avg(t1 - t0))::float8 FROM ("
            "SELECT count(*) n, min(e.created_at) t0, max(e.created_at) t1 FROM zeroloss_messageevent e "
            "JOIN zeroloss_message m ON m.id = e.message_id WHERE m.queue_name = %s AND e.reason = 'claimed' "
            "GROUP BY e.xmin::text) x",
            [queue],
        )
        claims, size, ms = cursor.fetchone()
    return {"claims": claims, "per_claim": size, "claim_ms": ms}


#: The limits of the "never reached" drain, by ``--never-reached``.
NEVER_REACHED = {
    "both": {"concurrency": 10_000, "rate": "1000000/s"},
    "concurrency": {"concurrency": 10_000},
    "rate": {"rate": "1000000/s"},
}


def drain(n: int, limited: bool, kind: str = "both") -> float:
    from zeroloss.ledger.service import ZeroLossMessageService

    queue = "bench.noop"
    _reset(queue)
    if limited:
        ZeroLossMessageService().limit_queue(queue, **NEVER_REACHED[kind])  # type: ignore[arg-type]
    _send(queue, n)
    _wait(_workers(2, queue))
    claims = _claims(queue)
    assert len(claims) == n, (len(claims), n)
    return n / max(claims[-1] - claims[0], 1e-6)


def in_flight(limit: int, n: int) -> dict[str, float]:
    from zeroloss.ledger.models import Message
    from zeroloss.ledger.service import ZeroLossMessageService

    queue = "bench.hold"
    _reset(queue)
    ZeroLossMessageService().limit_queue(queue, concurrency=limit)
    _send(queue, n)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        from django.db import connections

        try:
            while not stop.is_set():
                samples.append(Message.objects.filter(queue_name=queue, status="processing").count())
                time.sleep(0.02)
        finally:
            connections.close_all()

    sampler = threading.Thread(target=sample)
    procs = _workers(3, queue)
    sampler.start()
    _wait(procs)
    stop.set()
    sampler.join()
    busy = samples[len(samples) // 10 : -len(samples) // 10 or None]  # the backlog's middle
    return {"limit": limit, "max": max(samples), "mean": statistics.mean(busy) if busy else 0.0}


def rate_accuracy(count: int, period: str, seconds: float) -> dict[str, float]:
    from zeroloss.core.rates import parse_rate
    from zeroloss.ledger.service import ZeroLossMessageService

    queue = "bench.noop"
    _reset(queue)
    rate = parse_rate(f"{count}/{period}")
    ZeroLossMessageService().limit_queue(queue, rate=rate.text)
    n = int(rate.per_second * seconds) + rate.burst
    _send(queue, n)
    _wait(_workers(3, queue))
    claims = _claims(queue)
    span = claims[-1] - claims[0]
    in_one_second = max(sum(1 for t in claims[i:] if t < s + 1.0) for i, s in enumerate(claims))
    return {
        "rate": rate.per_second,
        "claims": len(claims),
        "span_s": span,
        "achieved_per_s": (len(claims) - rate.burst) / span if span else 0.0,
        "max_in_1s": in_one_second,
    }


def run(messages: int, runs: int, minute: bool, server: str, name: str, kind: str = "both") -> dict[str, Any]:
    admin_url = db.with_database(server, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        _setup(db.with_database(server, name))
        plain, limited = [], []
        steady: dict[str, list[float]] = {"plain": [], "limited": []}
        stats: dict[str, list[dict[str, float]]] = {"plain": [], "limited": []}
        for _ in range(runs):  # alternating, so load changes hit both alike
            plain.append(drain(messages, limited=False))
            steady["plain"].append(steady_rate("bench.noop"))
            stats["plain"].append(claim_statements("bench.noop"))
            limited.append(drain(messages, limited=True, kind=kind))
            steady["limited"].append(steady_rate("bench.noop"))
            stats["limited"].append(claim_statements("bench.noop"))
        results: dict[str, Any] = {
            "claims": {
                k: {f: statistics.median(s[f] for s in v) for f in ("claims", "per_claim", "claim_ms")}
                for k, v in stats.items()
            },
            "drain_plain": statistics.median(plain),
            "drain_limited": statistics.median(limited),
            "drain_runs": {"plain": plain, "limited": limited},
            "steady_runs": steady,
            "steady_plain": statistics.median(steady["plain"]),
            "steady_limited": statistics.median(steady["limited"]),
            "never_reached": NEVER_REACHED[kind],
        }
        results["drain_ratio"] = results["drain_limited"] / results["drain_plain"]
        results["steady_ratio"] = results["steady_limited"] / results["steady_plain"]
        # Each pair's own ratio (the two drains of one run, minutes apart at most), and their median.
        results["pair_ratios"] = [lim / pl for pl, lim in zip(plain, limited, strict=True)]
        results["pair_ratio"] = statistics.median(results["pair_ratios"])
        results["in_flight"] = in_flight(4, 400)
        results["rate"] = rate_accuracy(600, "m", 60) if minute else rate_accuracy(20, "s", 10)
        return results
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def report(r: dict[str, Any]) -> str:
    f, rate = r["in_flight"], r["rate"]
    return "\n".join(
        [
            "| figure | value |",
            "| --- | --- |",
            f"| drain, no limit (2 workers x 4 threads, no-op) | {r['drain_plain']:,.0f} msg/s |",
            f"| drain, a limit never reached ({r['never_reached']}) | {r['drain_limited']:,.0f} msg/s |",
            f"| ratio limited / no limit (issue: >= 0.90) | {r['drain_ratio']:.2f} |",
            f"| each run's ratio (their median) | {'; '.join(f'{x:.2f}' for x in r['pair_ratios'])} "
            f"({r['pair_ratio']:.2f}) |",
            f"| while both workers claim: no limit; limit never reached; ratio | {r['steady_plain']:,.0f}; "
            f"{r['steady_limited']:,.0f}; {r['steady_ratio']:.2f} |",
            *(
                f"| claims, {k}: per drain; messages each; ms each (first to last audit row) | "
                f"{c['claims']:.0f}; {c['per_claim']:.0f}; {c['claim_ms']:.1f} |"
                for k, c in r["claims"].items()
            ),
            f"| concurrency {f['limit']}: most in flight (sampled every 20 ms) | {f['max']} |",
            f"| concurrency {f['limit']}: mean in flight while the backlog lasts | {f['mean']:.2f} |",
            f"| rate {rate['rate']:g}/s: claims, over | {rate['claims']} in {rate['span_s']:.1f} s |",
            f"| rate {rate['rate']:g}/s: achieved (after the first bucket) | {rate['achieved_per_s']:.2f}/s |",
            f"| rate {rate['rate']:g}/s: most claims in any 1 s | {rate['max_in_1s']} |",
        ]
    )


def run_in_suite(suite: Any, *, quick: bool) -> None:
    """``python -m benchmarks --only limits``: on the suite's server, printed after its table."""
    results = run(
        2000 if quick else 10_000, 1 if quick else 3, False, suite.database.server, "zeroloss_bench_limits"
    )
    print("\nlimits:\n" + report(results), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.limits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=30_000, help="Messages per drain.")
    parser.add_argument("--runs", type=int, default=5, help="Drains of each kind (alternating).")
    parser.add_argument("--minute", action="store_true", help="The rate over a minute (600/m for 60 s).")
    parser.add_argument(
        "--never-reached",
        choices=sorted(NEVER_REACHED),
        default="both",
        help="Which limit the second drain has (never reached): both, concurrency, rate.",
    )
    parser.add_argument("--server-url", help="Any database URL on the PostgreSQL server to use.")
    parser.add_argument("--db-name", default="zeroloss_bench_limits", help="The database to create and drop.")
    parser.add_argument("--json", type=Path, help="Also save the figures to this file.")
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = run(
        args.messages,
        args.runs,
        args.minute,
        db.server_url(args.server_url),
        args.db_name,
        args.never_reached,
    )
    print(report(results))
    print(f"total {time.monotonic() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
