"""Benchmark-only handlers, autodiscovered through ``benchmarks.settings``.

- ``bench.noop``: does nothing, so a drain measures the ledger and the worker, not a handler.
- ``bench.pressure``: sleeps 1 ms (the pressure cells, benchmarks/pressure.py).
- ``bench.hold``: sleeps 50 ms (the concurrency limit's in-flight count, benchmarks/limits.py).
- ``bench.kill``: on its first attempt writes a marker (pid, time) and hangs, so the suite can
  SIGKILL the worker that holds it; on a later attempt writes a marker and returns.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import zeroloss
from zeroloss.runtime.processing import Delivery

from .db import MARKER_DIR_ENV


@zeroloss.handler("bench.noop")
def noop(delivery: Delivery) -> None:
    return None


@zeroloss.handler("bench.kill")
def hang_first_attempt(delivery: Delivery) -> None:
    started = time.time()
    directory = Path(os.environ.get(MARKER_DIR_ENV, "."))
    marker = directory / f"{delivery.message_id}.{delivery.attempt}"
    tmp = directory / f".{marker.name}.tmp"
    tmp.write_text(json.dumps({"pid": os.getpid(), "t": started, "attempt": delivery.attempt}))
    tmp.rename(marker)
    if delivery.attempt == 1:
        deadline = time.monotonic() + 120  # the suite SIGKILLs this process long before
        while time.monotonic() < deadline:
            time.sleep(0.05)


@zeroloss.handler("bench.tx", transactional=True)
def one_insert(delivery: Delivery) -> None:
    """A transactional handler writing one row: its effect commits with its acknowledgement."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_effects (message_id) VALUES (%s)", [delivery.message_id])


@zeroloss.handler("bench.latency", store_result=True)
def started_at(delivery: Delivery) -> float:
    """Returns when it started (this host's clock, as the sender's ``sent`` is): stored as the result."""
    return time.time()


@zeroloss.handler("bench.pressure")
def one_millisecond(delivery: Delivery) -> None:
    """The pressure cells' handler: 1 ms of work (a sleep), as the public benchmark's jobs."""
    time.sleep(0.001)


@zeroloss.handler("bench.hold")
def hold(delivery: Delivery) -> None:
    """Holds its slot 50 ms (benchmarks/limits.py: how many run at once under a concurrency limit)."""
    time.sleep(0.05)
