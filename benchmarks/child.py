"""Benchmark child processes: ``python -m benchmarks.child ROLE JSON_ARGS``.

Each prints ``{"ready": ...}`` once connected, waits for a line on stdin (the start barrier,
so process start-up is never timed), runs, and prints one JSON result line.

- ``raw-drain``: the raw-SQL claim + ack loop (psycopg only).
- ``claimer``: ``ZeroLossMessageService.claim(limit=1)`` timed per call, then an ack, until
  the queue is empty; prints one result line per round and waits for the next start line.
- ``paced-producer``: sends on a clock-paced schedule (the pressure cells, open loop).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _ready(**info: Any) -> None:
    print(json.dumps({"ready": True, "pid": os.getpid(), **info}), flush=True)
    sys.stdin.readline()


def raw_drain(args: dict[str, Any]) -> dict[str, Any]:
    import psycopg

    from .raw import drain_loop

    with psycopg.connect(args["url"], autocommit=True, prepare_threshold=0) as conn:
        conn.execute("SELECT 1")
        _ready()
        started = time.perf_counter()
        done = drain_loop(conn, queue=args["queue"], batch=args["batch"], actor=f"raw-{os.getpid()}")
        return {"done": done, "elapsed": time.perf_counter() - started}


def raw_batched(args: dict[str, Any]) -> dict[str, Any]:
    import psycopg

    from .raw import drain_batched_loop

    with psycopg.connect(args["url"], autocommit=True, prepare_threshold=0) as conn:
        conn.execute("SELECT 1")
        _ready()
        started = time.perf_counter()
        done = drain_batched_loop(conn, queue=args["queue"], batch=args["batch"], actor=f"rawb-{os.getpid()}")
        return {"done": done, "elapsed": time.perf_counter() - started}


def claimer(args: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    from django.db import connection

    from zeroloss.ledger.service import ZeroLossMessageService

    service = ZeroLossMessageService(instance_id=f"claimer-{os.getpid()}")
    service.database_now()  # connect before the barrier
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    _ready(backend=backend)
    rounds = []
    while True:  # one round per start line; "exit" (or EOF) ends the process
        latencies: list[float] = []
        acked = 0
        started = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            leases = service.claim(args["queue"], limit=args["limit"])
            latencies.append((time.perf_counter() - t0) * 1000)
            if not leases:
                break
            for lease in leases:
                acked += service.acknowledge(lease.message_id, lease.token)
        result = {"latencies_ms": latencies[:-1], "acked": acked, "elapsed": time.perf_counter() - started}
        print(json.dumps(result), flush=True)
        rounds.append(result)
        if sys.stdin.readline().strip() in ("", "exit"):
            return {"rounds": len(rounds)}


def paced_producer(args: dict[str, Any]) -> dict[str, Any]:
    """Open loop: sends what the clock says is due (``segments`` of (seconds, rate), ``bursts``
    of (offset, count)), whether or not anyone keeps up; a late tick sends everything due."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    from zeroloss.ledger.service import ZeroLossMessageService

    service = ZeroLossMessageService(instance_id=f"producer-{os.getpid()}")
    service.database_now()  # connect before the barrier
    queue, prefix = args["queue"], args["prefix"]
    segments = [(float(s), float(r)) for s, r in args["segments"]]
    bursts = sorted((float(at), int(n)) for at, n in args["bursts"])
    total_seconds = sum(s for s, _ in segments)

    def due(elapsed: float) -> int:
        count, offset = 0.0, 0.0
        for seconds, rate in segments:
            count += rate * max(0.0, min(elapsed, offset + seconds) - offset)
            offset += seconds
        return int(count) + sum(n for at, n in bursts if at <= elapsed)

    _ready()
    started = time.monotonic()
    sent, transactions, max_lag = 0, 0, 0.0
    while (elapsed := time.monotonic() - started) < total_seconds:
        target = due(elapsed)
        while sent < target:
            n = min(target - sent, 1000)
            service.persist_messages([(f"{prefix}-{i}", queue, {"n": i}) for i in range(sent, sent + n)])
            sent += n
            transactions += 1
        max_lag = max(max_lag, time.monotonic() - started - elapsed)
        time.sleep(0.005)  # a tick: about 4 messages a transaction at 800 msg/s
    final = due(total_seconds)
    while sent < final:
        n = min(final - sent, 1000)
        service.persist_messages([(f"{prefix}-{i}", queue, {"n": i}) for i in range(sent, sent + n)])
        sent += n
        transactions += 1
    return {"sent": sent, "transactions": transactions, "max_tick_s": round(max_lag, 3)}


ROLES = {
    "raw-drain": raw_drain,
    "raw-batched": raw_batched,
    "claimer": claimer,
    "paced-producer": paced_producer,
}


def main() -> int:
    role, raw_args = sys.argv[1], sys.argv[2]
    result = ROLES[role](json.loads(raw_args))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
