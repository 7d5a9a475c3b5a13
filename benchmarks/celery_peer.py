"""The Celery + Redis peer: ``python -m benchmarks.celery_peer BROKER_URL COUNT`` prints msg/s.

A no-op task with ``acks_late`` (what a careful Celery user runs), COUNT of them published to
the machine's Redis first (not timed), then one worker process (prefork, concurrency 1,
prefetch 1) drains them; the rate is COUNT / (last task end - first task start), timed by the
tasks themselves in Redis. Nothing here is durable: Redis keeps the queue in memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from celery import Celery

BROKER = os.environ.get("BENCHPEER_BROKER", "redis://127.0.0.1:6379/14")
app = Celery("benchpeer", broker=BROKER)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
)


_timing: Any = None


@app.task(name="benchpeer.noop")
def noop() -> None:
    global _timing
    if _timing is None:  # one connection per worker process, as a real task would keep
        import redis

        _timing = redis.Redis.from_url(BROKER)
    r = _timing
    now = time.time()
    r.set("benchpeer:first", now, nx=True)
    r.set("benchpeer:last", now)
    r.incr("benchpeer:done")


def main() -> int:
    import redis

    global BROKER
    BROKER = sys.argv[1]
    app.conf.update(broker_url=BROKER)
    count = int(sys.argv[2])
    r = redis.Redis.from_url(BROKER)
    r.flushdb()
    with app.producer_or_acquire() as producer:
        for _ in range(count):
            noop.apply_async(producer=producer)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "benchmarks.celery_peer",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            "1",
            "--prefetch-multiplier",
            "1",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        env={**env, "BENCHPEER_BROKER": BROKER},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600
        while int(r.get("benchpeer:done") or 0) < count:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit(f"celery peer drained {int(r.get('benchpeer:done') or 0)}/{count}")
            time.sleep(0.05)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    first, last = float(r.get("benchpeer:first") or 0), float(r.get("benchpeer:last") or 0)
    r.flushdb()
    print(f"{count / max(last - first, 1e-9):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
