"""The process pool's drain against the thread pool's (issue 27, part C).

One real ``zeroloss_worker --concurrency 2`` drains the same number of pending messages with
``--pool thread`` and with ``--pool process`` (two spawned children), alternating in each run,
for a no-op handler (what the pipe round trip per message costs) and a 1 ms handler
(``bench.pressure``: closer to real work). Rates from the ledger's own timestamps (first
claim to last acknowledgement), the children already started (their start-up is not counted);
the process pool's ratio is against the thread pool's figure of the same run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from . import db
from .suite import WorkerProcess

QUEUES = {"noop": "bench.noop", "1ms": "bench.pressure"}
CONCURRENCY = "2"


def _children_started(parent: int, count: int, timeout: float = 120) -> None:
    """Wait until ``parent`` has ``count`` spawned children (multiprocessing's spawn_main)."""
    deadline = time.monotonic() + timeout
    while True:
        found = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
                cmdline = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            if int(text[text.rfind(")") + 2 :].split()[1]) == parent and b"spawn_main" in cmdline:
                found += 1
        if found >= count:
            time.sleep(2)  # each child calls django.setup() after it exists: give it time to answer
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker {parent}: {found}/{count} children after {timeout}s")
        time.sleep(0.1)


def _drain(suite: Any, queue: str, count: int, pool: str) -> tuple[float, bool]:
    db.reset(suite.conn)
    worker = WorkerProcess(
        suite.url,
        queue,
        suite.workdir,
        "--concurrency",
        CONCURRENCY,
        "--pool",
        pool,
        "--poll-interval",
        "0.1",
        "--no-sweep",
        "--no-schedule",
    )
    try:
        worker.wait_ready()
        if pool == "process":
            _children_started(worker.pid, int(CONCURRENCY))
        suite.load_pending(queue, count)
        suite.wait_drained(queue, count)
        window, checks = suite.drain_window(queue)
    finally:
        worker.stop()
    return count / window, all(checks.values())


def run_in_suite(suite: Any, *, quick: bool) -> None:
    count = 1_000 if quick else 5_000
    for name, queue in QUEUES.items():
        n = count if name == "noop" else count // 2
        thread = suite.figure(
            f"pool.thread_{name}", f"zeroloss_worker --pool thread --concurrency 2, {name} handler", "msg/s"
        )
        process = suite.figure(
            f"pool.process_{name}",
            f"zeroloss_worker --pool process --concurrency 2, {name} handler",
            "msg/s",
            ratio_to=f"pool.thread_{name}",
            ratio_label="thread pool",
        )
        ok = {"thread": True, "process": True}
        for run in range(suite.runs):
            for pool, fig in (("thread", thread), ("process", process)):
                rate, exact = _drain(suite, queue, n, pool)
                fig.values.append(rate)
                ok[pool] &= exact
            print(
                f"pool run {run + 1}, {name}: thread {thread.values[-1]:,.0f}, process {process.values[-1]:,.0f} msg/s",
                flush=True,
            )
        thread.checks["exactly once"] = ok["thread"]
        process.checks["exactly once"] = ok["process"]
    db.reset(suite.conn)
