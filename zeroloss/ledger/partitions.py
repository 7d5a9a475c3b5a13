"""The partitioned ledger (PostgreSQL; docs/scaling.md, "Retention by partition").

The message table is range-partitioned by ``created_at`` and the audit table by the copy of it
each audit row carries (``message_created_at``), one partition per ``PARTITION_PERIOD`` (a day
unless set), so that a message and its whole history sit in partitions of the same period.
There is no default partition (it would make ``DETACH ... CONCURRENTLY`` impossible): the
sweep creates ``PARTITIONS_AHEAD`` periods ahead, a send finding them running out creates them
itself (:mod:`.periods`), and a purge of completed messages detaches
and drops every period whose messages are all past their retention, counting them into
``PurgeRecord`` rows first, so that the conservation check stays exact (:mod:`.partition_drops`).

The message ids' uniqueness lives in ``zeroloss_message_key`` and the ordering keys' heads in
``zeroloss_ordering_head`` (neither is partitioned): a partitioned table can have no unique
index without its partition key. Its statements are :mod:`.statements_partitions`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from . import statements_partitions as sql
from .base import engine_for
from .models import DroppedPeriod, Message, MessageEvent, MessageKey

MESSAGES = Message._meta.db_table
EVENTS = MessageEvent._meta.db_table
KEYS = MessageKey._meta.db_table
DROPPED = DroppedPeriod._meta.db_table
#: Each partitioned table and its partition key.
TABLES = ((MESSAGES, "created_at"), (EVENTS, "message_created_at"))
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_BOUNDS = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")
#: How long partition DDL waits for its lock before it gives up (and is tried again later):
#: an ATTACH queued behind a long transaction would hold up every statement queued after it.
LOCK_TIMEOUT_MS = 1000
#: The suffix of the tables (and their indexes and sequences) a conversion builds beside the
#: ledger's own until they replace them (:mod:`.conversion`).
BUILDING = "_partitioned"
#: The advisory lock of the partitions' DDL (one sweeper at a time creates them).
DDL_LOCK = 0x7A6C5041
#: The unique indexes of the unpartitioned layout, and the plain indexes that serve the same
#: lookups when partitioned (the uniqueness is then the key and head tables').
REPLACED_INDEXES = {
    "zeroloss_message_id_uniq": "zeroloss_msg_message_id_idx",
    "zeroloss_ordering_head_uniq": "zeroloss_msg_head_idx",
}


@dataclass(frozen=True, order=True)
class Partition:
    """One period's partition of the message table (its audit rows' partition has the same suffix)."""

    start: dt.datetime
    end: dt.datetime
    name: str


@dataclass(frozen=True)
class Dropped:
    """One period a purge dropped, and what it held: ``{(queue, status): count}``."""

    name: str
    counts: dict[tuple[str, str], int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def period_start(at: dt.datetime, period: int) -> dt.datetime:
    """The start of the period (``period`` seconds, aligned on the Unix epoch, UTC) holding ``at``."""
    seconds = int((at - _EPOCH).total_seconds())
    return _EPOCH + dt.timedelta(seconds=seconds - seconds % period)


def suffix_of(start: dt.datetime, period: int) -> str:
    return "p" + start.strftime("%Y%m%d" if period % 86400 == 0 else "%Y%m%d%H")


def _bound(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def _rows(
    conn: BaseDatabaseWrapper, statement: str, params: list[Any] | None = None
) -> list[tuple[Any, ...]]:
    with conn.cursor() as cursor:
        cursor.execute(statement, params or [])
        return list(cursor.fetchall()) if cursor.description else []


def is_partitioned(conn: BaseDatabaseWrapper) -> bool:
    """Whether this ledger's message table is partitioned (a PostgreSQL install migrated empty)."""
    if not engine_for(conn).partitions_by_period:
        return False
    return bool(_rows(conn, sql.IS_PARTITIONED, [MESSAGES])[0][0])


def database_now(conn: BaseDatabaseWrapper) -> dt.datetime:
    value: dt.datetime = _rows(conn, sql.NOW)[0][0]
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def partitions(conn: BaseDatabaseWrapper, table: str = MESSAGES) -> list[Partition]:
    """The attached partitions of ``table``, oldest first (one being detached left out)."""
    found = []
    for name, bounds, pending in _rows(conn, sql.PARTITIONS, [table]):
        match = _BOUNDS.search(bounds or "")
        if match and not pending:
            found.append(Partition(_bound(match[1]), _bound(match[2]), name))
    return sorted(found)


def estimated_rows(conn: BaseDatabaseWrapper, found: list[Partition]) -> dict[str, int]:
    """Each partition's messages as the planner estimates them (0 before it was analysed)."""
    if not found:
        return {}
    return {name: max(int(n), 0) for name, n in _rows(conn, sql.PARTITION_ROWS, [[p.name for p in found]])}


def coverage(
    conn: BaseDatabaseWrapper, table: str = MESSAGES, now: dt.datetime | None = None
) -> dt.datetime | None:
    """Until when sends have a partition to go to (None: unpartitioned, or none covers now).
    ``table``: the tables a conversion builds (``MESSAGES + BUILDING``), which exist unpartitioned."""
    if table == MESSAGES and not is_partitioned(conn):
        return None
    end = None
    now = database_now(conn) if now is None else now
    for p in partitions(conn, table):
        if p.start <= (end or now) < p.end:
            end = p.end
    return end


# -- partitions created -----------------------------------------------------------------------


def _slots(start: dt.datetime, end: dt.datetime, period: int) -> Iterator[tuple[dt.datetime, dt.datetime]]:
    at = period_start(start, period)
    while at < end:
        yield at, at + dt.timedelta(seconds=period)
        at += dt.timedelta(seconds=period)


def indexes(conn: BaseDatabaseWrapper, table: str) -> list[tuple[str, str, bool, bool]]:
    """(name, definition, unique, primary) of each index of ``table``."""
    return [(n, d, bool(u), bool(p)) for n, d, u, p in _rows(conn, sql.INDEXES, [table])]


def _columns(definition: str) -> str:
    """The column list of an index definition (``CREATE ... USING btree (id, created_at)``)."""
    return definition[definition.index(" USING btree ") + len(" USING btree ") :]


def create_partitions(
    conn: BaseDatabaseWrapper, start: dt.datetime, end: dt.datetime, period: int, *, building: bool = False
) -> list[str]:
    """Create the partitions of both tables for every period from ``start``'s to ``end`` that no
    partition covers yet, each period's two in one transaction; the message partitions created.
    ``building``: of the tables a conversion builds (``BUILDING``), named as the ledger's own."""
    grown = BUILDING if building else ""
    existing = partitions(conn, MESSAGES + grown)
    created = []
    for low, high in _slots(start, end, period):
        if any(p.start < high and low < p.end for p in existing):
            continue  # covered (or overlapped by a partition of another period: left as it is)
        suffix = suffix_of(low, period)
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            cursor.execute(sql.LOCK_TIMEOUT.format(ms=LOCK_TIMEOUT_MS))
            for table, _ in TABLES:
                part, parent_table = f"{table}_{suffix}", table + grown
                cursor.execute(sql.CREATE_LIKE.format(part=part, table=parent_table))
                for name, definition, _, primary in indexes(conn, parent_table):
                    if primary:
                        cursor.execute(sql.PRIMARY_KEY.format(table=part, columns=_columns(definition)))
                    else:
                        parent = f" {name} ON ONLY public.{parent_table} "
                        if parent not in definition:
                            raise RuntimeError(f"unexpected index of {parent_table}: {definition}")
                        named = f" {name.removesuffix(grown) if grown else name}_{suffix} ON {part} "
                        cursor.execute(definition.replace(parent, named, 1))
                cursor.execute(sql.ATTACH.format(table=parent_table, part=part), [low, high])
        created.append(f"{MESSAGES}_{suffix}")
        existing.append(Partition(low, high, f"{MESSAGES}_{suffix}"))
    return created


def ensure_ahead(conn: BaseDatabaseWrapper, period: int, ahead: int, *, wait: bool = False) -> list[str]:
    """Create the partitions missing from now's period to ``ahead`` periods after it (the sweep's
    duty); nothing on an unpartitioned ledger, or while another process creates them (``wait``:
    a send whose period is missing waits for that process, at most ``LOCK_TIMEOUT_MS``, then
    creates what it left missing)."""
    if not is_partitioned(conn):
        # A conversion under way (conversion.py) mirrors new rows into the tables it builds.
        if not engine_for(conn).partitions_by_period:
            return []
        if not _rows(conn, sql.TABLE_EXISTS, [MESSAGES + BUILDING])[0][0]:
            return []
        now = database_now(conn)
        return create_partitions(conn, now, now + dt.timedelta(seconds=period * ahead), period, building=True)
    now = database_now(conn)
    horizon = now + dt.timedelta(seconds=period * ahead)
    current = partitions(conn)
    if current and current[-1].end >= horizon and any(p.start <= now < p.end for p in current):
        return []
    with transaction.atomic(using=conn.alias):
        if wait:
            with conn.cursor() as cursor:
                cursor.execute(sql.LOCK_TIMEOUT.format(ms=LOCK_TIMEOUT_MS))
                cursor.execute(sql.DDL_LOCK_WAIT, [DDL_LOCK])
        elif not _rows(conn, sql.TRY_DDL_LOCK, [DDL_LOCK])[0][0]:
            return []
        return create_partitions(conn, now, horizon, period)


def parent_index(definition: str, name: str, unique: bool, table: str, parent: str, grown: str = "") -> str:
    """An index of the unpartitioned ``table`` made for its partitioned ``parent``: unique ones
    replaced by REPLACED_INDEXES (the key and head tables hold the uniqueness), named ``+ grown``."""
    found = f" {name} ON public.{table} "
    if found not in definition:
        raise RuntimeError(f"unexpected index of {table}: {definition}")
    if unique:
        definition = definition.replace("CREATE UNIQUE INDEX", "CREATE INDEX", 1)
    renamed = REPLACED_INDEXES[name] if unique else name
    return definition.replace(found, f" {renamed}{grown} ON public.{parent} ", 1)


def partition_tables(conn: BaseDatabaseWrapper, period: int, ahead: int) -> bool:
    """Make the message and audit tables partitioned, with partitions from the period before
    now's to ``ahead`` after it, if both are empty (a new install; the migration's step).
    False, and nothing changed, when either holds rows or they are partitioned already."""
    if is_partitioned(conn) or any(_rows(conn, sql.HOLDS_ROWS.format(table=t))[0][0] for t, _ in TABLES):
        return False
    with conn.cursor() as cursor:
        for table, key in TABLES:
            held = indexes(conn, table)
            (sequence,) = _rows(conn, sql.SERIAL_SEQUENCE, [table])[0]
            cursor.execute(sql.CREATE_PARTITIONED.format(table=table, key=key))
            cursor.execute(sql.DROP.format(table=table))
            cursor.execute(sql.RENAME_PARTITIONED.format(table=table))
            cursor.execute(sql.CREATE_SEQUENCE.format(sequence=sequence))
            cursor.execute(sql.ID_FROM_SEQUENCE.format(table=table, sequence=sequence))
            cursor.execute(sql.OWN_SEQUENCE.format(table=table, sequence=sequence))
            cursor.execute(sql.KEY_NOT_NULL.format(table=table, key=key))
            cursor.execute(sql.PRIMARY_KEY.format(table=table, columns=f"(id, {key})"))
            for name, definition, unique, primary in held:
                if not primary:
                    cursor.execute(parent_index(definition, name, unique, table, table))
    now = database_now(conn)
    create_partitions(
        conn,
        period_start(now, period) - dt.timedelta(seconds=period),
        now + dt.timedelta(seconds=period * ahead),
        period,
    )
    return True
