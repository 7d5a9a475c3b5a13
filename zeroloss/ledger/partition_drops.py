"""Whole periods dropped (PostgreSQL; docs/scaling.md, "Retention by partition"): a purge of
completed messages detaches and drops every period whose messages are all past their retention,
counting them into ``PurgeRecord`` rows first (the conservation check stays exact), then deletes
the dropped messages' ids from the key table in short batches. The partitions themselves, and
their creation ahead, are :mod:`.partitions`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..core.doc_pages import see
from . import statements_partitions as sql
from .base import engine_for
from .partitions import (
    DROPPED,
    EVENTS,
    KEYS,
    LOCK_TIMEOUT_MS,
    MESSAGES,
    TABLES,
    Dropped,
    _rows,
    is_partitioned,
    partitions,
)

#: A dropped period's keys deleted this many a transaction (each a short one: no long xmin, no
#: burst of locks or WAL that claims would wait behind).
KEY_BATCH = 5000
#: The session advisory lock of a drop (one at a time: a purge beside a retention turn).
DROP_LOCK = 0x7A6C5044


def _census(conn: BaseDatabaseWrapper, part: str) -> dict[tuple[str, str], int]:
    """A detached period's messages by queue and status."""
    with conn.cursor() as cursor:
        cursor.execute(sql.CENSUS_PLAN)  # the caller's transaction: the drop's
        counts = {(queue, status): n for queue, status, n in _rows(conn, sql.CENSUS.format(part=part))}
        cursor.execute(sql.CENSUS_PLAN_DONE)
    return counts


def _holds_kept(
    conn: BaseDatabaseWrapper,
    part: str,
    completed_before: dt.datetime,
    dead_before: dt.datetime | None,
    cancelled_before: dt.datetime | None = None,
) -> bool:
    """Whether a period holds a message a drop may not take (an index probe or two, no scan).
    ``cancelled_before``: the cancelled messages' cut-off when it is not the completed ones'."""
    dead = sql.DEAD_KEPT if dead_before is None else sql.DEAD_KEPT_BEFORE
    cancelled = completed_before if cancelled_before is None else cancelled_before
    params: list[Any] = [completed_before, cancelled] + ([] if dead_before is None else [dead_before])
    return bool(_rows(conn, sql.HOLDS_KEPT.format(part=part, dead=dead), params)[0][0])


def drop_expired(
    conn: BaseDatabaseWrapper,
    *,
    completed_before: dt.datetime,
    dead_before: dt.datetime | None,
    record: Callable[[dict[tuple[str, str], int]], None],
    cancelled_before: dt.datetime | None = None,
) -> list[Dropped]:
    """Detach and drop every period all of whose messages are finished and past retention
    (cancelled ones: past ``cancelled_before`` when given, else ``completed_before``).

    ``record(counts)`` writes the ``PurgeRecord`` rows, in the transaction that drops the period.
    Each period holding nothing a drop may not take (a probe of its partial indexes):
    ``DETACH PARTITION ... CONCURRENTLY`` of both tables (sends, claims and transitions go on;
    it waits for the transactions that could see the partition), then, in one transaction, the
    detached rows counted (one changed since the probe, a dead letter redriven:
    both attached again, kept), the records written, the audit partition dropped and the
    message partition kept as a :class:`DroppedPeriod`: the list of ids whose keys
    :func:`delete_dropped_keys` then deletes in short batches before dropping it. Cut off part
    way, the next call finishes what it detached. Runs outside a transaction (PostgreSQL
    refuses ``CONCURRENTLY`` inside one). One drop at a time: while another process's drop runs,
    this one drops nothing (that one takes the periods).
    """
    if conn.in_atomic_block:
        raise RuntimeError("a partition drop runs outside a transaction")
    # Two drops at once would detach and drop the same period under each other. The lock is the
    # session's (the detaches commit on their own); a process that dies releases it with its session.
    if not _rows(conn, sql.TRY_DROP_LOCK, [DROP_LOCK])[0][0]:
        return []  # another drop is running: it takes these periods
    try:
        return _drop_expired(conn, completed_before, dead_before, record, cancelled_before)
    finally:
        with contextlib.suppress(DatabaseError):  # a session gone has released it
            _rows(conn, sql.DROP_UNLOCK, [DROP_LOCK])


def _drop_expired(
    conn: BaseDatabaseWrapper,
    completed_before: dt.datetime,
    dead_before: dt.datetime | None,
    record: Callable[[dict[tuple[str, str], int]], None],
    cancelled_before: dt.datetime | None,
) -> list[Dropped]:
    with conn.cursor() as cursor:
        for table, _ in TABLES:
            for name, _, pending in _rows(conn, sql.PARTITIONS, [table]):
                if pending:
                    cursor.execute(sql.DETACH_FINALIZE.format(table=table, part=name))
    latest = max(c for c in (completed_before, cancelled_before, dead_before) if c is not None)
    attached = {p.name: p for p in partitions(conn) if p.end <= latest}
    dropping = {r[0] for r in _rows(conn, sql.DROPPED_PERIODS.format(dropped=DROPPED))}
    detached = [r[0] for r in _rows(conn, sql.DETACHED, [f"{MESSAGES}\\_p%"]) if r[0] not in dropping]
    dropped = []
    for part in sorted(set(attached) | set(detached)):
        events = EVENTS + part[len(MESSAGES) :]
        if part in attached:
            if _holds_kept(conn, part, completed_before, dead_before, cancelled_before):
                continue
            with conn.cursor() as cursor:
                cursor.execute(sql.DETACH_CONCURRENTLY.format(table=MESSAGES, part=part))
            bounds: tuple[Any, Any] = (attached[part].start, attached[part].end)
        else:
            bounds = _detached_bounds(conn, part)
        if any(p.name == events for p in partitions(conn, EVENTS)):
            with conn.cursor() as cursor:
                cursor.execute(sql.DETACH_CONCURRENTLY.format(table=EVENTS, part=events))
        with transaction.atomic(using=conn.alias):
            counts = _census(conn, part)
            # Kept: a status the probes do not name, or (asked again now that nothing changes it) one
            # they find.
            kept = any(status not in sql.PROBED_STATUSES for _, status in counts) or _holds_kept(
                conn, part, completed_before, dead_before, cancelled_before
            )
            if kept:
                _attach_again(conn, part, events)
                continue
            with conn.cursor() as cursor:
                if counts:
                    record(counts)
                    cursor.execute(sql.DROPPED_PERIOD.format(dropped=DROPPED), [part, *bounds])
                else:  # no key to delete
                    cursor.execute(sql.DROP.format(table=part))
                cursor.execute(sql.DROP_IF_EXISTS.format(table=events))
        dropped.append(Dropped(part, counts))
    return dropped


def delete_dropped_keys(conn: BaseDatabaseWrapper, *, batch: int = KEY_BATCH) -> int:
    """The keys of every dropped period deleted, ``batch`` a transaction, each period's detached
    message partition dropped with its :class:`DroppedPeriod` row once its keys are gone; the
    keys deleted. Cut off part way, the next call goes on from the last batch committed; a
    period another purger is deleting the keys of is left to it. Runs outside a transaction
    (each batch is one)."""
    if conn.in_atomic_block:
        raise RuntimeError("a dropped period's keys are deleted outside a transaction")
    deleted = 0
    for part, starts_at, ends_at, _ in _rows(conn, sql.DROPPED_PERIODS.format(dropped=DROPPED)):
        done = False
        while not done:
            with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
                cursor.execute(sql.DROPPED_LOCK.format(dropped=DROPPED), [part])
                held = cursor.fetchone()
                if held is None:  # another purger has it, or has finished it
                    break
                cursor.execute(
                    sql.DELETE_KEYS_BATCH.format(part=part, keys=KEYS), [held[0], batch, starts_at, ends_at]
                )
                last, count, gone = cursor.fetchone()
                deleted += gone
                if count < batch:
                    cursor.execute(sql.DROP_IF_EXISTS.format(table=part))
                    cursor.execute(sql.DROPPED_DONE.format(dropped=DROPPED), [part])
                    done = True
                else:
                    cursor.execute(sql.DROPPED_CLEANED_TO.format(dropped=DROPPED), [last, part])
    return deleted


def dropping(conn: BaseDatabaseWrapper) -> list[tuple[str, dt.datetime, dt.datetime, int]]:
    """The dropped periods whose keys are still being deleted: ``(table, start, end, cleaned to id)``."""
    if not engine_for(conn).partitions_by_period:
        return []
    return [
        (name, _aware(start), _aware(end), int(done))
        for name, start, end, done in _rows(conn, sql.DROPPED_PERIODS.format(dropped=DROPPED))
    ]


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def free_stale_keys(conn: BaseDatabaseWrapper, message_ids: list[str]) -> list[str]:
    """Of these ids, those whose key belongs to a dropped period still being cleaned up (its
    message is gone): their keys deleted, so that the caller can store them again."""
    if not message_ids or not is_partitioned(conn):
        return []
    return [r[0] for r in _rows(conn, sql.FREE_STALE_KEYS.format(keys=KEYS, dropped=DROPPED), [message_ids])]


def _detached_bounds(conn: BaseDatabaseWrapper, part: str) -> tuple[str, str]:
    """A detached period's bounds: the CHECK constraint its detach added names them."""
    for (definition,) in _rows(conn, sql.CHECKS, [part]):
        bounds = re.findall(r"'([^']+)'", definition)
        if len(bounds) == 2:
            return bounds[0], bounds[1]
    raise RuntimeError(
        f"{part} has lost the CHECK constraint its detach added, which says its bounds: attach it by hand "
        f"(ALTER TABLE ... ATTACH PARTITION {part} FOR VALUES FROM (...) TO (...); "
        f"{see('scaling', 'Retention by partition')})"
    )


def _attach_again(conn: BaseDatabaseWrapper, part: str, events: str) -> None:
    """Attach a detached period again (the CHECK constraint its detach added spares the attach
    its scan)."""
    bounds = _detached_bounds(conn, part)
    with conn.cursor() as cursor:
        cursor.execute(sql.LOCK_TIMEOUT.format(ms=LOCK_TIMEOUT_MS))
        cursor.execute(sql.ATTACH.format(table=MESSAGES, part=part), bounds)
        cursor.execute(sql.ATTACH.format(table=EVENTS, part=events), bounds)
