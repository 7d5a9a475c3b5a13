"""Partitions that never run out: the period a send needs is there before its row is stored.

On a partitioned ledger (PostgreSQL, :mod:`.partitions`) a row whose period has no partition
is refused. The sweep keeps ``PARTITIONS_AHEAD`` periods ahead; a deployment where no sweep ran
for days (no worker, no beat) must still take messages, so every send asks :func:`ready`
first. That costs nothing most of the time (a dict read and a clock read): each process
remembers when, by its own monotonic clock, fewer than half the periods ahead it last saw will
be left. Then (or ``RECHECK_EVERY`` after it looked) it reads the catalogue again, and when
the periods ahead are short, creates them, on a connection of its own (its own transaction:
the sender's keeps no DDL lock), through the sweep's own code and lock
(:func:`.partitions.ensure_ahead`). Creating a partition attaches a new table (``SHARE UPDATE
EXCLUSIVE`` on the parent): sends, claims and transitions go on meanwhile.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import partitions
from . import statements_partitions as sql
from .base import engine_for, logger

#: A process reads the partitions again at least this often (seconds), whatever it estimates:
#: a clock that jumped, partitions dropped by hand.
RECHECK_EVERY = 300.0
#: After a try that left the periods ahead short, sends try again at most this often (seconds).
QUIET = 60.0
#: What PostgreSQL says of a row no partition takes.
NO_PARTITION = "no partition of relation"


#: Per database alias: when (this process's monotonic clock) a send reads the partitions
#: again: once fewer than half the periods ahead are left by the estimate, or RECHECK_EVERY.
_NEXT_LOOK: dict[str, float] = {}
_LOCK = threading.Lock()


def forget(alias: str | None = None) -> None:
    """Read the partitions again at the next send (of ``alias``; of every database: None)."""
    with _LOCK:
        if alias is None:
            _NEXT_LOOK.clear()
        else:
            _NEXT_LOOK.pop(alias, None)


def ready(alias: str, period: float, ahead: int) -> None:
    """Make sure a row stored now on database ``alias`` has its period (see the module's docstring)."""
    next_look = _NEXT_LOOK.get(alias)
    if next_look is not None and time.monotonic() < next_look:
        return  # (every send comes here: a dict read and a clock read)
    conn = connections[alias]
    if not engine_for(conn).partitions_by_period:
        _NEXT_LOOK[alias] = math.inf  # SQLite: one table, nothing to create
        return
    _look(conn, int(period), ahead)


def _look(conn: BaseDatabaseWrapper, period: int, ahead: int) -> None:
    table = partitions.MESSAGES
    if not partitions.is_partitioned(conn):
        # A conversion under way mirrors every new row into the partitioned tables it builds.
        building = partitions.MESSAGES + partitions.BUILDING
        if not partitions._rows(conn, sql.TABLE_EXISTS, [building])[0][0]:
            _remember(conn.alias, RECHECK_EVERY)
            return
        table = building
    now = partitions.database_now(conn)
    until = partitions.coverage(conn, table, now)
    quiet = 0.0
    if until is None or until < now + dt.timedelta(seconds=period * ahead / 2):
        try:
            _create_aside(conn.alias, period, ahead, wait=until is None)
        except DatabaseError as exc:
            if until is None:
                raise  # this send has nowhere to go
            logger.warning("zeroloss: partitions ahead not created on %r (%s); sends go on", conn.alias, exc)
        until = partitions.coverage(conn, table, now)
        if until is not None and until < now + dt.timedelta(seconds=period * ahead / 2):
            # Another process at it, or a lock not granted in time: try again in a while, not
            # at every send, unless the periods run out before.
            quiet = min(QUIET, max((until - now).total_seconds() - 1.0, 0.0))
    if until is not None:
        left = (until - now).total_seconds() - period * ahead / 2
        _remember(conn.alias, quiet or min(RECHECK_EVERY, max(left, 0.0)))


def _remember(alias: str, seconds: float) -> None:
    """Sends of ``alias`` look again in ``seconds``."""
    with _LOCK:
        _NEXT_LOOK[alias] = time.monotonic() + seconds


def _create_aside(alias: str, period: int, ahead: int, *, wait: bool) -> list[str]:
    """:func:`.partitions.ensure_ahead` on a connection of its own (a thread's), closed after."""
    created: list[str] = []
    failed: list[BaseException] = []

    def create() -> None:
        conn = connections[alias]
        try:
            created.extend(partitions.ensure_ahead(conn, period, ahead, wait=wait))
        except BaseException as exc:  # raised again in the sender's thread
            failed.append(exc)
        finally:
            conn.close()

    worker = threading.Thread(target=create, name="zeroloss-partitions", daemon=True)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return created


def missing_period(exc: BaseException) -> bool:
    """Whether a store failed for want of a partition (one dropped since this process looked)."""
    return isinstance(exc, DatabaseError) and NO_PARTITION in str(exc)
