"""The one picture of the ledger: ``zeroloss_status``, the dashboard, metrics and health read it.

:func:`get_snapshot` (cached) and :func:`compute_snapshot` (uncached) return a
:class:`Snapshot`: messages per queue x status, the age of the oldest claimable message, stuck
(expired-lease) and dead counts, replication nodes and requirement, what the recovery sweep
did according to the audit trail, and the blocked ordering keys. Every reader shows this one object, so they always agree.

Its cost does not grow with completed history:

============================  ====================================================================
pending, processing, dead     one ``GROUP BY queue_name, status`` over the three partial indexes
per queue, oldest pending,    (claim, lease, dead-letter): it reads the live rows only, never a
stuck                         completed one
completed per queue           counted exactly while the table holds at most
                              :data:`EXACT_COMPLETED_ROWS` rows (PostgreSQL's own row estimate);
                              above that, on PostgreSQL, **estimated** (``completed_estimated``):
                              table rows (``pg_class``, scaled to the table's current size the way
                              the planner does) minus the live rows, split over the queues by
                              their share in ``pg_stats``; queue names come from a skip scan of
                              ``zeroloss_msg_queue_status_idx``. SQLite always counts.
sweep recoveries              the ``(reason, created_at)`` event index
blocked ordering keys         the waiting messages' partial index, then one probe per key of the
                              one-head unique index (:meth:`~zeroloss.service.ZeroLossMessageService.blocked_keys`)
============================  ====================================================================

**Oldest pending age** is how long the oldest *claimable* pending message has been waiting to be
claimed: seconds since its ``available_at`` (database clock). A message waiting for its delay
or retry backoff is not backlog, so a queue whose pending messages are all scheduled for later
shows ``0.0``; a queue with nothing pending shows ``None``. (Dating from ``created_at`` would
make a message retried for hours look like a backlog of hours.)

Results go through Django's ``default`` cache for ``ZEROLOSS["CACHE_TIMEOUT"]`` seconds (``0``
disables it). Nothing that changes a message reads a snapshot: the cache can only make a *read*
a few seconds old. A cache that fails (Redis down) is logged and bypassed.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import operator

from django.core.cache import caches
from django.db import connections
from django.db.models import Count, Min, Q

from ..core.durations import format_duration
from ..core.states import COUNTED_STATUSES
from ..integrations import replication
from ..ledger import partitions, statements_reads
from ..ledger.models import Message, MessageEvent, Status
from ..ledger.service import ZeroLossMessageService
from ..runtime.schedules.overdue import overdue_schedules
from .snapshot_types import QueueSnapshot, ReplicationSnapshot, Snapshot, zero_counts

# The data types live in zeroloss.ops.snapshot_types; re-exported for code outside the package
# (and the docs), which import them from here.
__all__ = [
    "QueueSnapshot",
    "ReplicationSnapshot",
    "Snapshot",
    "cache_key",
    "compute_snapshot",
    "format_duration",
    "get_snapshot",
    "invalidate",
]

logger = logging.getLogger("zeroloss")

#: The Django cache alias snapshots are stored in.
CACHE_ALIAS = "default"
#: Bump when the cached layout changes, so old entries are never misread.
CACHE_VERSION = 3
#: Completed messages are counted exactly up to this many rows in the message table (PostgreSQL's
#: estimate); above it they are estimated. Counting that many takes tens of milliseconds.
EXACT_COMPLETED_ROWS = 200_000
#: At most this many queue names are read by the skip scan (each is one index descent).
MAX_QUEUES = 10_000
#: Blocked ordering keys kept in a snapshot (longest blocked first).
MAX_BLOCKED_KEYS = 100

MSG = Message._meta.db_table


def cache_key(service: ZeroLossMessageService) -> str:
    """Per database and per the settings that change the answer (replication requirement, node TTL)."""
    s = service.settings
    return (
        f"zeroloss:snapshot:v{CACHE_VERSION}:{service.using}:"
        f"{s.REPLICATION_FACTOR}:{s.PERSISTENCE_LEVEL}:{s.NODE_TTL:g}"
    )


def get_snapshot(service: ZeroLossMessageService, *, use_cache: bool = True) -> Snapshot:
    """The ledger's snapshot, from the cache when ``use_cache`` and one is fresh enough.

    A freshly computed snapshot is always stored (when caching is enabled), so
    ``use_cache=False`` also refreshes what the next cached reader sees.
    """
    timeout = service.settings.CACHE_TIMEOUT
    key = cache_key(service)
    if use_cache and timeout > 0:
        try:
            cached = caches[CACHE_ALIAS].get(key)
        except Exception:  # a broken cache must never break a read
            logger.warning("zeroloss: cache read failed; reading the database", exc_info=True)
            cached = None
        if cached is not None:
            try:
                return Snapshot.from_dict(cached, cached=True)
            except (KeyError, TypeError, ValueError):
                logger.warning("zeroloss: ignoring an unreadable cached snapshot", exc_info=True)
    snapshot = compute_snapshot(service)
    if timeout > 0:
        try:
            caches[CACHE_ALIAS].set(key, snapshot.as_dict(), timeout)
        except Exception:
            logger.warning("zeroloss: cache write failed", exc_info=True)
    return snapshot


def invalidate(service: ZeroLossMessageService) -> None:
    """Drop the cached snapshot of ``service``'s database (e.g. after an operator action)."""
    try:
        caches[CACHE_ALIAS].delete(cache_key(service))
    except Exception:
        logger.warning("zeroloss: cache delete failed", exc_info=True)


def _estimated_completed(service: ZeroLossMessageService, live: dict[str, int]) -> dict[str, int] | None:
    """Completed messages per queue from PostgreSQL's statistics, or None to count them instead.

    None when the table is small enough to count (or has never been analysed, which
    autovacuum fixes within minutes of its first few thousand rows).
    """
    conn = service.connection
    engine = service.engine
    [(rows,)], _ = engine.run(conn, statements_reads, "TABLE_ROWS", {"table": MSG})
    if rows is None or rows <= EXACT_COMPLETED_ROWS:
        return None
    found, _ = engine.run(conn, statements_reads, "QUEUE_SHARES", {"table": MSG})
    if not found:
        return None
    [stats] = found
    # Each step is one descent of the (queue_name, status) index: cost follows the number of queues.
    walked, _ = engine.execute(conn, statements_reads.distinct_walk(MSG, "queue_name"), [MAX_QUEUES])
    names = [r[0] for r in walked]
    common_names, common_freqs, n_distinct, null_frac = stats
    shares = dict(zip(common_names or [], common_freqs or [], strict=True))
    distinct = -n_distinct * rows if n_distinct < 0 else n_distinct
    # What the planner assumes for a value missing from the most-common list: an even share
    # of the rows the list does not cover.
    rare = max(1.0 - sum(shares.values()) - null_frac, 0.0) / max(distinct - len(shares), 1.0)
    completed = max(rows - sum(live.values()), 0.0)
    weights = {q: max(rows * shares.get(q, rare) - live.get(q, 0), 0.0) for q in names}
    total_weight = sum(weights.values()) or 1.0
    # A queue the skip scan found without live messages holds at least one completed message.
    return {q: max(round(completed * w / total_weight), 0 if live.get(q) else 1) for q, w in weights.items()}


def compute_snapshot(service: ZeroLossMessageService) -> Snapshot:
    """Read a snapshot from the database now (no cache)."""
    alias = service.using
    messages = Message.objects.using(alias)
    now = service.database_now()
    counts: dict[str, dict[str, int]] = {}
    oldest: dict[str, dt.datetime] = {}
    stuck: dict[str, int] = {}
    # One statement, so the counts are consistent with each other. An OR of the statuses lets
    # PostgreSQL combine their partial indexes (a BitmapOr): completed rows are never read.
    live_rows = (
        messages.filter(functools.reduce(operator.or_, (Q(status=s) for s in COUNTED_STATUSES)))
        .values("queue_name", "status")
        .annotate(
            n=Count("*"),
            oldest=Min("available_at", filter=Q(status=Status.PENDING)),
            stuck=Count("id", filter=Q(status=Status.PROCESSING, lease_expires_at__lt=now)),
        )
        .order_by()
    )
    for row in live_rows:
        counts.setdefault(row["queue_name"], zero_counts())[row["status"]] = row["n"]
        if row["oldest"] is not None:
            oldest[row["queue_name"]] = row["oldest"]
        if row["stuck"]:
            stuck[row["queue_name"]] = row["stuck"]
    estimated = None
    if service.engine.has_statistics:
        estimated = _estimated_completed(service, {q: sum(c.values()) for q, c in counts.items()})
    completed = estimated
    if completed is None:
        completed = {
            row["queue_name"]: row["n"]
            for row in messages.filter(status=Status.COMPLETED)
            .values("queue_name")
            .annotate(n=Count("*"))
            .order_by()
        }
    for name, n in completed.items():
        counts.setdefault(name, zero_counts())[Status.COMPLETED] = n

    controls = {s.queue_name: s for s in service.queue_states()}
    for name in controls:
        counts.setdefault(name, zero_counts())  # a paused or limited queue shows, messages or not
    queues = {
        name: QueueSnapshot(
            name=name,
            counts=c,
            oldest_pending_age=(max((now - oldest[name]).total_seconds(), 0.0) if name in oldest else None),
            stuck=stuck.get(name, 0),
            paused=name in controls and controls[name].paused,
            concurrency=controls[name].limits.concurrency if name in controls else None,
            rate=str(controls[name].limits.rate) if name in controls and controls[name].limits.rate else None,
        )
        for name, c in sorted(counts.items())
    }
    live, down = replication.node_counts(service)
    req = replication.requirement(service)
    events = MessageEvent.objects.using(alias)
    sweep_dead = Q(reason="dead_lettered", actor__startswith="sweep@")
    requeued = events.filter(reason="lease_expired").count()
    dead_lettered = events.filter(sweep_dead).count()
    # One sweep transaction stamps all its rows with one actor and one database time.
    runs = (
        events.filter(Q(reason="lease_expired") | sweep_dead)
        .order_by()
        .values("actor", "created_at")
        .distinct()
        .count()
        if requeued or dead_lettered
        else 0
    )
    blocked = service.blocked_keys(limit=MAX_BLOCKED_KEYS + 1)
    conn = connections[alias]
    partitioned = partitions.is_partitioned(conn)
    return Snapshot(
        database=alias,
        taken_at=now,
        queues=queues,
        nodes_live=live,
        nodes_down=down,
        replication=ReplicationSnapshot(req.required, req.available, req.ok, list(req.problems)),
        recovered_requeued=requeued,
        recovered_dead_lettered=dead_lettered,
        sweep_runs=runs,
        cached=False,
        completed_estimated=estimated is not None,
        blocked_keys=tuple(blocked[:MAX_BLOCKED_KEYS]),
        blocked_keys_truncated=len(blocked) > MAX_BLOCKED_KEYS,
        partitioned=partitioned,
        partitions_until=partitions.coverage(conn) if partitioned else None,
        overdue_schedules=tuple(overdue_schedules(alias, now)),
    )
