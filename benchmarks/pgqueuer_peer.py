"""PgQueuer as a peer: ``python -m benchmarks.pgqueuer_peer SERVER_URL COUNT [BATCH [DB_PREFIX]]``
prints msg/s.

PgQueuer 1.6 (asyncpg; its ``QueueManager`` with no concurrency limit, ``batch_size`` BATCH,
default 25, the fastest its documentation shows) on its own database on the same server
(created, installed and dropped here). COUNT no-op jobs are enqueued first (not timed), then
one worker process drains them (``mode=drain``); the rate is COUNT / (last job's end - first
job's start), taken in that process. Caveats for the table: PgQueuer deletes a job's row when it
completes and writes no audit row and no fencing token (an outcome is not refused to a worker
whose job was re-picked); zeroloss keeps every message, audits every transition and fences
every outcome.

Needs the ``bench`` dependency group (``pip install --group bench``; ``make bench`` installs it).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BATCH = 25


def _database_url(server_url: str, name: str) -> str:
    return urlunparse(urlparse(server_url)._replace(path=f"/{name}"))


async def _enqueue(url: str, count: int) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        for start in range(0, count, 1000):
            n = min(1000, count - start)
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    finally:
        await conn.close()


async def _drain(url: str, count: int, batch: int) -> float:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(url)
    first: list[float] = []
    last = [0.0]
    done = [0]
    try:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job: object) -> None:
            if not first:
                first.append(time.time())
            done[0] += 1
            last[0] = time.time()

        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=dt.timedelta(seconds=1))
    finally:
        await conn.close()
    if done[0] < count:
        raise RuntimeError(f"PgQueuer ran {done[0]} of {count} jobs")
    return count / (last[0] - first[0])


def run(server_url: str, count: int, batch: int = DEFAULT_BATCH, prefix: str = "zlbench") -> float:
    """Enqueue, drain in a worker process of its own, drop the database; the drain's msg/s."""
    name = f"{prefix}_pgqueuer_{uuid.uuid4().hex[:8]}"
    url = _database_url(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        asyncio.run(_enqueue(url, count))
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.pgqueuer_peer", "--worker", url, str(count), str(batch)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode:
            raise RuntimeError(f"the PgQueuer worker failed:\n{out.stderr[-3000:]}")
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main(argv: list[str]) -> None:
    if argv[0] == "--worker":
        print(asyncio.run(_drain(argv[1], int(argv[2]), int(argv[3]))))
        return
    batch = int(argv[2]) if len(argv) > 2 else DEFAULT_BATCH
    print(f"{run(argv[0], int(argv[1]), batch, *argv[3:4]):.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
