"""Procrastinate's app for the peer benchmark (``benchmarks/task_peers.py``): one no-op task.

A plain Procrastinate app on its own database (``BENCHPEER_DATABASE_URL``), without Django.
"""

from __future__ import annotations

import os

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCHPEER_DATABASE_URL", ""))
)


@app.task(name="noop")
def noop() -> None:
    """Does nothing."""
