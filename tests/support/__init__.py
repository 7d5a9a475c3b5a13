"""Helpers shared by the tests.

Leases are decided by the database clock, so a test never waits for one to run out: it moves
the lease's expiry into the past with :func:`expire_leases`, exactly as time would.

The models are imported inside the helpers: ``tests.support.debian`` is imported by fixtures
that also run outside Django (``python -m tests.infra.hacluster``, the fault suite).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from django.db import connections

#: The project's root (``manage.py``, ``docs/``): where children run.
ROOT = Path(__file__).resolve().parent.parent.parent


def expire_leases(
    message_ids: Iterable[str] | None = None, *, using: str = "default", seconds_ago: float = 1.0
) -> int:
    """Make the leases of these processing messages (all, if ``None``) expired ``seconds_ago`` ago,
    by the database's clock. Returns how many were moved."""
    from zeroloss.ledger.models import Message

    conn = connections[using]
    table = Message._meta.db_table
    if conn.vendor == "postgresql":
        past = "statement_timestamp() - %s * interval '1 second'"
        params: list[str | float] = [seconds_ago]
    else:
        past = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"
        params = [f"-{seconds_ago:.6f} seconds"]
    sql = f"UPDATE {table} SET lease_expires_at = {past} WHERE status = 'processing'"
    if message_ids is not None:
        ids = list(message_ids)
        if not ids:
            return 0
        sql += f" AND message_id IN ({','.join(['%s'] * len(ids))})"
        params += ids
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def backdate(message_ids: Iterable[str], column: str, *, seconds_ago: float, using: str = "default") -> int:
    """Move ``column`` (a timestamp such as ``dead_at`` or ``completed_at``) of these messages
    ``seconds_ago`` into the past by the database's clock: what waiting would do, without the wait."""
    from zeroloss.ledger.models import Message

    conn = connections[using]
    # only a model field's column is ever formatted into the statement
    field_column = Message._meta.get_field(column).column  # type: ignore[union-attr]
    params: list[str | float]
    if conn.vendor == "postgresql":
        past, params = "statement_timestamp() - %s * interval '1 second'", [seconds_ago]
    else:
        past, params = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)", [f"-{seconds_ago:.6f} seconds"]
    ids = list(message_ids)
    with conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Message._meta.db_table} SET {field_column} = {past} "
            f"WHERE message_id IN ({','.join(['%s'] * len(ids))})",
            [*params, *ids],
        )
        return cursor.rowcount


def register(queue: str, func: Callable[..., Any], **kwargs: Any) -> None:
    """Register ``func`` as the handler of ``queue`` (what ``@zeroloss.handler(queue)`` does)."""
    import zeroloss

    zeroloss.handler(queue, **kwargs)(func)


def run_worker(queue: str, **kwargs: Any) -> tuple[Any, threading.Thread]:
    """A built-in worker on ``queue`` in a thread of this process (stop it with :func:`finish`)."""
    from zeroloss.runtime.sweep_loop import StopFlag
    from zeroloss.runtime.worker import Worker

    worker = Worker([queue], stop=StopFlag(), poll_interval=0.05, **kwargs)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return worker, thread


def finish(worker: Any, thread: threading.Thread, timeout: float = 60) -> None:
    """Stop a worker of :func:`run_worker` and wait (bounded) until it has."""
    worker.stop.set("test")
    thread.join(timeout)
    assert not thread.is_alive(), "the worker did not stop"


def count_keeper_passes(keeper: Any) -> list[float]:
    """Record (monotonic time) each pass of this lease keeper at its renewal interval, whether it
    renews anything or not: a test waits for passes, not for a guessed number of seconds."""
    import time

    passes: list[float] = []
    has_work = keeper._has_work

    def counted() -> bool:
        passes.append(time.monotonic())
        return bool(has_work())

    keeper._has_work = counted
    return passes


def make_available(message_ids: Iterable[str], *, using: str = "default") -> int:
    """End the backoff (or delay) of these pending messages now, by the database's clock."""
    from zeroloss.ledger.models import Message

    conn = connections[using]
    table = Message._meta.db_table
    now = (
        "statement_timestamp()"
        if conn.vendor == "postgresql"
        else "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    )
    ids = list(message_ids)
    with conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET available_at = {now} WHERE status = 'pending' AND available_at IS NOT NULL "
            f"AND message_id IN ({','.join(['%s'] * len(ids))})",
            ids,
        )
        return cursor.rowcount


class PrivateRedis:
    """A real ``redis-server`` of the test's own, on a free loopback port (the fault suite's
    :class:`~tests.faults.cluster.RedisServer`): it can be stopped, frozen (SIGSTOP: it accepts
    connections and never answers) and thawed."""

    def __init__(self) -> None:
        from tests.faults.cluster import RedisServer

        self.server = RedisServer()
        self.server.start()
        self.port = self.server.port
        self.url = self.server.url()

    def _signal(self, sig: int) -> None:
        assert self.server.proc is not None, "the private redis-server is not running"
        self.server.proc.send_signal(sig)

    def freeze(self) -> None:
        import signal

        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        import signal

        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        import signal

        if self.server.proc is not None and self.server.proc.poll() is None:
            self._signal(signal.SIGCONT)
        self.server.stop()
