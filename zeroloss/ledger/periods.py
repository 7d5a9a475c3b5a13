"""Partitions that never run out: the period a send needs is there before its row is stored.

On a partitioned ledger (PostgreSQL, :mod:`.partitions`) a row whose period has no partition
is refused. The sweep keeps ``PARTITIONS_AHEAD`` periods ahead; a deployment where no sweep ran
for days (no worker, no beat) must still take messages, so every send asks :func:`ready`
first. That costs nothing most of the time: each process remembers until when the partitions
it last saw cover, and estimates the database clock from its own monotonic clock. Once fewer
than half the periods ahead are left (or ``RECHECK_EVERY`` passed), it reads the catalogue
again, and when the periods ahead are short, creates them, on a connection of its own (its own
transaction: the sender's keeps no DDL lock), through the sweep's own code and lock
(:func:`.partitions.ensure_ahead`). Creating a partition attaches a new table (``SHARE UPDATE
EXCLUSIVE`` on the parent): sends, claims and transitions go on meanwhile.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass

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


@dataclass(frozen=True)
class _Seen:
    #: Until when the partitions cover (None: the ledger is not partitioned).
    until: dt.datetime | None
    #: The database clock, and this process's monotonic clock, when they were read.
    at: dt.datetime
    monotonic: float
    #: After a creation that failed or found another process at it: no new try before this
    #: (monotonic), unless the periods run out first.
    quiet_until: float = 0.0


#: Per database alias, what this process last saw.
_SEEN: dict[str, _Seen] = {}
_LOCK = threading.Lock()


def forget(alias: str | None = None) -> None:
    """Read the partitions again at the next send (of ``alias``; of every database: None)."""
    with _LOCK:
        if alias is None:
            _SEEN.clear()
        else:
            _SEEN.pop(alias, None)


def ready(conn: BaseDatabaseWrapper, period: int, ahead: int) -> None:
    """Make sure a row stored now on ``conn`` has its period (see the module's docstring)."""
    if not engine_for(conn).partitions_by_period:
        return
    seen = _SEEN.get(conn.alias)
    if seen is not None:
        now = time.monotonic()
        if now < seen.quiet_until:
            return
        elapsed = now - seen.monotonic
        if elapsed < RECHECK_EVERY and (
            seen.until is None or seen.at + dt.timedelta(seconds=elapsed + period * ahead / 2) < seen.until
        ):
            return
    _look(conn, period, ahead)


def _look(conn: BaseDatabaseWrapper, period: int, ahead: int) -> None:
    table = partitions.MESSAGES
    if not partitions.is_partitioned(conn):
        # A conversion under way mirrors every new row into the partitioned tables it builds.
        building = partitions.MESSAGES + partitions.BUILDING
        if not partitions._rows(conn, sql.TABLE_EXISTS, [building])[0][0]:
            _remember(conn.alias, None, partitions.database_now(conn))
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
        _remember(conn.alias, until, now, quiet)


def _remember(alias: str, until: dt.datetime | None, at: dt.datetime, quiet: float = 0.0) -> None:
    with _LOCK:
        mono = time.monotonic()
        _SEEN[alias] = _Seen(until, at, mono, mono + quiet)


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
