"""A populated unpartitioned ledger converted to the partitioned layout, online (PostgreSQL).

``manage.py zeroloss_partition convert`` (docs/scaling.md, "Converting a 0.2 ledger"). Workers
and producers go on throughout; no step holds a lock that blocks them for longer than
``LOCK_TIMEOUT_MS`` (a step that cannot get its lock in that time gives up and tries again), and
every step can be cut off and run again:

1. **build**: the partitioned tables beside the ledger's own (``zeroloss_message_partitioned``,
   ``zeroloss_messageevent_partitioned``: the new layout's columns, keys and indexes, named
   ``…_partitioned`` until the swap), with a partition for every period that holds a row and
   from the period before now's to ``PARTITIONS_AHEAD`` after it.
2. **mirror**: a trigger on each old table that makes every change of a row (insert, update,
   delete) to its copy in the same transaction; the highest id stored before it existed (the
   sequence's value once the trigger holds) is what the copy must reach.
3. **copy**: the rows up to that id, in ranges of ``batch_size`` ids, each in its own short
   transaction that locks the rows it copies ``FOR SHARE`` (a transition of one of them waits
   for that transaction, and its mirror then replaces the copy); progress is kept in
   ``zeroloss_conversion``, so a resumed copy starts where it stopped.
4. **verify**: both pairs of tables compared in one snapshot (each transaction changed both or
   neither): row counts and a hash of every row must be equal, or the conversion stops.
5. **swap**: in one transaction, with ``ACCESS EXCLUSIVE`` locks on the old tables taken within
   ``LOCK_TIMEOUT_MS`` (or given up and tried again): the old tables dropped (their triggers with
   them), the new ones renamed to the ledger's names, the id sequences carried on.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import OperationalError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from . import partitions as layout
from . import statements_partitions as sql
from .base import engine_for
from .partitions import BUILDING, EVENTS, LOCK_TIMEOUT_MS, MESSAGES, TABLES

#: Where a conversion's copy stands (created by it, dropped when it is done).
PROGRESS = "zeroloss_conversion"
#: The server-side bounds of a conversion transaction that holds locks (sql.BOUND_IDLE): idle
#: between two of its statements, and one statement (a range copied, a rename).
IDLE_BOUND_MS = 1000
STATEMENT_BOUND_MS = 30_000


def _bound_held(cursor: Any) -> None:
    cursor.execute(sql.BOUND_IDLE.format(ms=IDLE_BOUND_MS))
    cursor.execute(sql.BOUND_STATEMENT.format(ms=STATEMENT_BOUND_MS))


#: How many times a step that could not get its lock within LOCK_TIMEOUT_MS tries again.
LOCK_ATTEMPTS = 60
_MIRRORS = {MESSAGES: "zeroloss_mirror_message", EVENTS: "zeroloss_mirror_event"}
_LOCK_NOT_AVAILABLE = "55P03"


class ConversionError(Exception):
    """The conversion cannot go on (what to do is in the message); nothing was lost."""


@dataclass
class Progress:
    """What one conversion step did, for the command's report."""

    step: str
    detail: str
    #: 1: a step's outcome, or a copy's progress every few seconds; 2: every range copied.
    level: int = 1


def _rows(conn: BaseDatabaseWrapper, statement: str, params: Sequence[Any] | None = None) -> list[Any]:
    with conn.cursor() as cursor:
        cursor.execute(statement, list(params or []))
        return list(cursor.fetchall()) if cursor.description else []


def _exists(conn: BaseDatabaseWrapper, table: str) -> bool:
    return bool(_rows(conn, sql.TABLE_EXISTS, [table])[0][0])


def _columns(conn: BaseDatabaseWrapper, table: str) -> list[str]:
    return [r[0] for r in _rows(conn, sql.COLUMNS, [table])]


def _sequence(conn: BaseDatabaseWrapper, table: str) -> str:
    (name,) = _rows(conn, sql.SERIAL_SEQUENCE, [table])[0]
    if name is None:
        raise ConversionError(f"{table}.id has no sequence: this is not a zeroloss ledger table")
    return str(name).split(".")[-1]


def _with_lock_retries(conn: BaseDatabaseWrapper, step: Callable[[], None], *, attempts: int) -> None:
    """Run ``step`` in a transaction whose locks wait at most LOCK_TIMEOUT_MS; when one cannot be
    had in that time (a long transaction holds it), roll back and try again a moment later."""
    for attempt in range(attempts):
        try:
            with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
                cursor.execute(sql.LOCK_TIMEOUT.format(ms=LOCK_TIMEOUT_MS))
                _bound_held(cursor)
                step()
            return
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != _LOCK_NOT_AVAILABLE or attempt == attempts - 1:
                raise
            time.sleep(min(0.1 * (attempt + 1), 2.0))


def can_partition(conn: BaseDatabaseWrapper) -> bool:
    """Whether this ledger's database partitions (PostgreSQL; SQLite keeps one table)."""
    return engine_for(conn).partitions_by_period


def status(conn: BaseDatabaseWrapper) -> str:
    """``partitioned``, ``unpartitioned``, or ``converting`` (a conversion started and not done)."""
    if layout.is_partitioned(conn):
        return "partitioned"
    if not can_partition(conn):
        return "unpartitioned"
    return "converting" if _exists(conn, MESSAGES + BUILDING) else "unpartitioned"


def convert(
    conn: BaseDatabaseWrapper,
    *,
    period: int,
    ahead: int,
    batch_size: int = 5000,
    report: Callable[[Progress], None] = lambda p: None,
    lock_attempts: int = LOCK_ATTEMPTS,
) -> None:
    """Convert this ledger (outside any transaction); resumes a conversion that was cut off."""
    if not can_partition(conn):
        raise ConversionError("only a PostgreSQL ledger is partitioned; SQLite keeps its one table")
    if conn.in_atomic_block:
        raise ConversionError("the conversion runs outside a transaction (each step commits on its own)")
    if layout.is_partitioned(conn):
        report(Progress("done", "the ledger is partitioned already"))
        return
    _build(conn, period, ahead, report)
    _mirror(conn, report, lock_attempts)
    _copy(conn, batch_size, report)
    _verify(conn, report)
    _swap(conn, report, lock_attempts)
    layout.ensure_ahead(conn, period, ahead)
    report(Progress("done", "the ledger is partitioned"))


# -- 1. build ---------------------------------------------------------------------------------


def _build(conn: BaseDatabaseWrapper, period: int, ahead: int, report: Callable[[Progress], None]) -> None:
    for table, key in TABLES:
        target = table + BUILDING
        if _exists(conn, target):
            continue
        sequence = _sequence(conn, table) + BUILDING
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            cursor.execute(sql.CREATE_PARTITIONED.format(table=table, key=key))
            cursor.execute(sql.CREATE_SEQUENCE.format(sequence=sequence))
            cursor.execute(sql.ID_FROM_SEQUENCE.format(table=target, sequence=sequence))
            cursor.execute(sql.OWN_SEQUENCE.format(table=target, sequence=sequence))
            cursor.execute(sql.KEY_NOT_NULL.format(table=target, key=key))
            cursor.execute(sql.PRIMARY_KEY.format(table=target, columns=f"(id, {key})"))
            for name, definition, unique, primary in layout.indexes(conn, table):
                if not primary:
                    cursor.execute(layout.parent_index(definition, name, unique, table, target, BUILDING))
        report(Progress("build", f"created {target}"))
    held = {p for table, _ in TABLES for (p,) in _rows(conn, sql.PERIODS_HELD.format(table=table), [period])}
    now = layout.database_now(conn)
    made = []
    for number in sorted(held):
        start = dt.datetime.fromtimestamp(number * period, dt.UTC)
        made += layout.create_partitions(conn, start, start + dt.timedelta(seconds=1), period, building=True)
    made += layout.create_partitions(
        conn,
        layout.period_start(now, period) - dt.timedelta(seconds=period),
        now + dt.timedelta(seconds=period * ahead),
        period,
        building=True,
    )
    if made:
        report(Progress("build", f"{len(made)} partitions, {made[0]} to {made[-1]}"))


# -- 2. mirror --------------------------------------------------------------------------------


def _mirror(conn: BaseDatabaseWrapper, report: Callable[[Progress], None], lock_attempts: int) -> None:
    with conn.cursor() as cursor:
        cursor.execute(sql.PROGRESS_CREATE.format(progress=PROGRESS))
    started = {r[0] for r in _rows(conn, sql.PROGRESS.format(progress=PROGRESS))}
    for table, _ in TABLES:
        if table in started:
            continue
        function = _MIRRORS[table]
        fill = sql.MIRROR_FILL.format(messages=MESSAGES) if table == EVENTS else ""

        def install(table: str = table, function: str = function, fill: str = fill) -> None:
            with conn.cursor() as cursor:
                cursor.execute(
                    sql.MIRROR_FUNCTION.format(
                        function=function, source=table, target=table + BUILDING, fill=fill
                    )
                )
                cursor.execute(sql.MIRROR_TRIGGER_DROP.format(function=function, source=table))
                cursor.execute(sql.MIRROR_TRIGGER.format(function=function, source=table))

        _with_lock_retries(conn, install, attempts=lock_attempts)
        # The trigger is committed: every insert since is mirrored, and every one before it
        # took an id at most the sequence's value now (CREATE TRIGGER waited for them all).
        sequence = _sequence(conn, table)
        (high,) = _rows(conn, sql.SEQUENCE_LAST.format(sequence=sequence))[0]
        (low,) = _rows(conn, sql.MIN_ID.format(table=table))[0]
        with conn.cursor() as cursor:
            cursor.execute(sql.PROGRESS_START.format(progress=PROGRESS), [table, high, low])
        report(Progress("mirror", f"{table}: every change mirrored; ids {low} to {high} to copy"))


# -- 3. copy ----------------------------------------------------------------------------------


def _copy(conn: BaseDatabaseWrapper, batch_size: int, report: Callable[[Progress], None]) -> None:
    progress = {r[0]: (r[1], r[2]) for r in _rows(conn, sql.PROGRESS.format(progress=PROGRESS))}
    for table, _ in TABLES:
        high, at = progress[table]
        names = _columns(conn, table)
        columns = ", ".join(
            sql.COPY_FILL.format(messages=MESSAGES) if n == "message_created_at" else f"s.{n}" for n in names
        )
        statement = sql.COPY_RANGE.format(target=table + BUILDING, source=table, columns=columns)
        copied, started, last_report = 0, time.monotonic(), time.monotonic()
        while at <= high:
            upto = min(at + batch_size, high + 1)
            with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
                _bound_held(cursor)
                cursor.execute(statement, [at, upto])
                copied += max(cursor.rowcount, 0)
                cursor.execute(sql.PROGRESS_COPIED.format(progress=PROGRESS), [upto, table])
            at = upto
            periodic = time.monotonic() - last_report > 5 or at > high
            last_report = time.monotonic() if periodic else last_report
            line = f"{table}: to id {at - 1} of {high}, {copied} rows in {time.monotonic() - started:.1f} s"
            report(Progress("copy", line, level=1 if periodic else 2))


# -- 4. verify --------------------------------------------------------------------------------


def _fingerprints(conn: BaseDatabaseWrapper) -> dict[str, tuple[Any, Any]]:
    found = {}
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        cursor.execute(sql.REPEATABLE_READ)
        for table, _ in TABLES:
            # The audit rows' message_created_at is filled in the copy (NULL before 0.3).
            columns = ", ".join(n for n in _columns(conn, table) if n != "message_created_at")
            for name in (table, table + BUILDING):
                cursor.execute(sql.FINGERPRINT.format(columns=columns, table=name))
                found[name] = tuple(cursor.fetchone())
    return found


def _verify(conn: BaseDatabaseWrapper, report: Callable[[Progress], None]) -> None:
    found = _fingerprints(conn)
    for table, _ in TABLES:
        old, new = found[table], found[table + BUILDING]
        if old != new:
            raise ConversionError(
                f"{table} and its copy differ ({old[0]} and {new[0]} rows): nothing was swapped; run the "
                "conversion again (it copies what is missing), and report this if it persists"
            )
        report(Progress("verify", f"{table}: {old[0]} rows, equal in one snapshot"))


# -- 5. swap ----------------------------------------------------------------------------------


def _swap(conn: BaseDatabaseWrapper, report: Callable[[Progress], None], lock_attempts: int) -> None:
    indexes = {table: layout.indexes(conn, table + BUILDING) for table, _ in TABLES}
    sequences = {table: _sequence(conn, table) for table, _ in TABLES}
    locked: list[float] = []

    def swap() -> None:
        with conn.cursor() as cursor:
            cursor.execute(sql.LOCK_EXCLUSIVE.format(tables=", ".join(t for t, _ in TABLES)))
            locked.append(time.monotonic())
            for table, _ in TABLES:
                (last,) = _rows(conn, sql.SEQUENCE_LAST.format(sequence=sequences[table]))[0]
                cursor.execute(sql.DROP.format(table=table))
                cursor.execute(sql.MIRROR_FUNCTION_DROP.format(function=_MIRRORS[table]))
                cursor.execute(sql.RENAME_TABLE.format(table=table + BUILDING, name=table))
                cursor.execute(
                    sql.RENAME_CONSTRAINT.format(
                        table=table, old=f"{table}{BUILDING}_pkey", name=f"{table}_pkey"
                    )
                )
                for name, _, _, primary in indexes[table]:
                    if not primary:
                        cursor.execute(sql.RENAME_INDEX.format(index=name, name=name.removesuffix(BUILDING)))
                sequence = sequences[table]
                cursor.execute(sql.RENAME_SEQUENCE.format(sequence=sequence + BUILDING, name=sequence))
                cursor.execute(sql.SEQUENCE_SET, [sequence, last])
            cursor.execute(sql.PROGRESS_DROP.format(progress=PROGRESS))

    for table, _ in TABLES:
        with conn.cursor() as cursor:
            cursor.execute(sql.ANALYZE.format(table=table + BUILDING))
    _with_lock_retries(conn, swap, attempts=lock_attempts)
    held = time.monotonic() - locked[-1]  # until the commit released them
    report(Progress("swap", f"the partitioned tables are the ledger's (locks held {held * 1000:.0f} ms)"))
