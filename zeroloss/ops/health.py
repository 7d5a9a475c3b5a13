"""Health of the ledger for load balancers and monitors.

Unhealthy when any of these holds (thresholds in ``ZEROLOSS``):

- more stuck messages (expired leases) than ``HEALTH_MAX_STUCK`` (default 0);
- more dead letters than ``HEALTH_MAX_DEAD`` (default 100);
- the replication requirement (``REPLICATION_FACTOR``/``PERSISTENCE_LEVEL``) is unmet, as
  *measured* from the primary's streaming standbys;
- on a partitioned ledger, the partitions ahead end within one ``PARTITION_PERIOD`` (no sweep
  has created the next ones; sends create theirs, :mod:`zeroloss.ledger.periods`);
- a schedule's tick is overdue: unsent a minute (or three ``SCHEDULE_INTERVAL``) past its time,
  so no scheduler is running (:mod:`zeroloss.runtime.schedules.overdue`);
- the database cannot be read;
- the database's disk refuses new data, or stalls: a tiny commit takes more than
  ``COMMIT_STALL_S`` (:func:`storage_fault`, :func:`commit_stall`).

:func:`health_view` is a plain JSON view (HTTP 200 healthy, 503 unhealthy), routed at
``health/`` by ``zeroloss.urls``: the *alerts* (what a monitor pages on). For load balancers
and Kubernetes probes, which must not take a serving process out of rotation because of dead
letters, ``health/live/`` (:func:`live_view`: 200 whenever the process answers, no database
query) and ``health/ready/`` (:func:`ready_view`: 200 when every ledger database answers a
``SELECT 1``, 503 otherwise) say only whether this process can serve. When ``django-health-check`` is installed,
:class:`ZeroLossHealthCheck` plugs into it (4.x ``HealthCheck`` API; on 3.x
:class:`ZeroLossHealthCheckBackend` is the ``plugin_dir`` backend). Readings come from the
cached snapshot (``CACHE_TIMEOUT``).

A healthy report may carry ``warnings``: the partitions ahead end within
:func:`partitions_warn_before` (three days with the defaults), days before they run out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from ..core.outage import COMMIT_STALL_S, OutageMonitor, close_connection, is_outage, is_storage_fault
from ..ledger import statements_reads
from ..ledger.base import engine_for
from ..ledger.service import ZeroLossMessageService
from ..runtime.transports import ledger_aliases
from .snapshot import get_snapshot

logger = logging.getLogger("zeroloss")

#: An SQLite file's filesystem with less free space than this is full (a write may fail).
SQLITE_MIN_FREE_BYTES = 1 << 20


_stall_lock = threading.Lock()
#: The commit probe under way per alias: when it began, and set once it finished.
_stall_probes: dict[str, tuple[float, threading.Event]] = {}


def _sqlite_file(conn: Any) -> Path | None:
    """The SQLite database's file (None: in memory, or its folder missing)."""
    name = str(conn.settings_dict["NAME"])
    if not name or name.startswith(":memory:") or "mode=memory" in name:
        return None
    path = Path(name.removeprefix("file:").split("?", 1)[0])
    return path if path.parent.is_dir() else None


def _commit_probe(alias: str, done: threading.Event) -> None:
    """Commit a tiny transaction on this thread's own connection (then close it); on SQLite,
    whose commits take its write lock (a long transaction would look like a stall), fsync its
    file instead: what each of its commits waits for (``synchronous=FULL``)."""
    conn = connections[alias]
    try:
        if engine_for(conn).is_server:
            with transaction.atomic(using=alias):
                engine_for(conn).run(conn, statements_reads, "COMMIT_PROBE")
        elif (path := _sqlite_file(conn)) is not None:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except (DatabaseError, OSError):
        pass  # an unreachable or full database is the other checks' to report
    finally:
        with contextlib.suppress(DatabaseError):
            conn.close()
        with _stall_lock:
            _stall_probes.pop(alias, None)
        done.set()


def commit_stall(alias: str = DEFAULT_DB_ALIAS, deadline: float = COMMIT_STALL_S) -> str:
    """``""`` when a tiny commit on database ``alias`` (SQLite: an fsync of its file) finishes
    within ``deadline`` seconds, else ``"a commit has taken > N s"``: its disk stalls (fsync
    takes seconds). The commit runs in a thread of its own; one still stuck from an earlier
    call is waited on, not started again."""
    with _stall_lock:
        probe = _stall_probes.get(alias)
        if probe is None:
            probe = _stall_probes[alias] = (time.monotonic(), threading.Event())
            threading.Thread(
                target=_commit_probe, args=(alias, probe[1]), name="zeroloss-commit-probe", daemon=True
            ).start()
    began, done = probe
    if done.wait(max(0.0, began + deadline - time.monotonic())):
        return ""
    return f"a commit has taken > {deadline:g} s ({time.monotonic() - began:.1f} s so far)"


def storage_fault(alias: str = DEFAULT_DB_ALIAS) -> str:
    """``""`` when database ``alias``'s disk takes new data, else what refuses it.

    PostgreSQL: a small sort spilled to temporary files in the data directory (no data kept,
    no WAL written), refused when the disk is full (SQLSTATE 53100). SQLite: the free space of
    its file's filesystem. Then whether a commit stalls (:func:`commit_stall`). Either answers for now, whatever this process's own statements met
    before. A database that cannot be reached raises (the health check's database check).
    """
    monitor = OutageMonitor.for_alias(alias)
    conn = connections[alias]
    engine = engine_for(conn)
    found = ""
    if engine.is_server:
        try:
            with transaction.atomic(using=alias):
                rows, _ = engine.run(conn, statements_reads, "STORAGE_PROBE_MEMORY")
                engine.run(conn, statements_reads, "STORAGE_PROBE")
                # the caller's own transaction (ATOMIC_REQUESTS) keeps its work_mem
                engine.run(conn, statements_reads, "STORAGE_PROBE_RESTORE", {"work_mem": rows[0][0]})
        except DatabaseError as exc:
            # A full disk may fail the temporary file's directory first (ENOENT, not ENOSPC).
            if not (is_storage_fault(exc) or "temporary file" in str(exc)):
                raise
            monitor.failed("the storage check", exc)
            found = " ".join(str(exc).split())[:300]
        if not found and (stall := commit_stall(alias)):
            return f"database {alias!r} storage stalled: {stall}"
    elif (path := _sqlite_file(conn)) is not None:
        st = os.statvfs(path.parent)
        free = st.f_bavail * st.f_frsize
        if free < SQLITE_MIN_FREE_BYTES:
            found = f"{free} bytes free on the filesystem of {path}"
        elif stall := commit_stall(alias):
            return f"database {alias!r} storage stalled: {stall}"
    return f"database {alias!r} storage fault: {found}" if found else ""


@dataclass(frozen=True)
class HealthReport:
    """The verdict and the numbers behind it (the JSON view's body, see docs/operations.md)."""

    healthy: bool
    checks: dict[str, dict[str, Any]]
    problems: list[str] = field(default_factory=list)
    taken_at: str | None = None
    cached: bool = False
    #: What needs attention before it fails: one sentence each (the report stays healthy).
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.healthy else "fail",
            "checks": self.checks,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "taken_at": self.taken_at,
            "cached": self.cached,
        }


def health_report(service: ZeroLossMessageService | None = None, *, use_cache: bool = True) -> HealthReport:
    """Evaluate the thresholds against a (possibly cached) snapshot; never raises on a DB failure."""
    service = service or ZeroLossMessageService()
    cfg = service.settings
    monitor = OutageMonitor.for_alias(service.using)
    try:
        snap = get_snapshot(service, use_cache=use_cache)
    except Exception as exc:
        if is_outage(exc):
            # One log line per outage (not a traceback per probe), and since when it lasts.
            monitor.failed("the health check", exc)
            close_connection(service.using)
            problem = monitor.status()
        else:
            logger.exception("zeroloss: health check could not read the ledger")
            problem = f"database {service.using!r} could not be read ({type(exc).__name__})"
        checks: dict[str, dict[str, Any]] = {
            "database": {
                "ok": False,
                "error": type(exc).__name__,
                "unreachable_since": monitor.since.isoformat() if monitor.since else None,
            }
        }
        if monitor.storage and monitor.since is not None:
            # a full disk refuses new sessions too (PostgreSQL: "could not write init file")
            checks["storage"] = {"ok": False, "error": problem}
        return HealthReport(healthy=False, checks=checks, problems=[problem])
    monitor.recovered()
    storage = storage_fault(service.using)
    stuck_ok = snap.stuck <= cfg.HEALTH_MAX_STUCK
    dead_ok = snap.dead <= cfg.HEALTH_MAX_DEAD
    rep = snap.replication
    problems: list[str] = [storage] if storage else []
    if not stuck_ok:
        problems.append(
            f"{snap.stuck} stuck message(s) (expired leases), above HEALTH_MAX_STUCK={cfg.HEALTH_MAX_STUCK}"
        )
    if not dead_ok:
        problems.append(f"{snap.dead} dead letter(s), above HEALTH_MAX_DEAD={cfg.HEALTH_MAX_DEAD}")
    problems += rep.problems if not rep.ok else []
    if not rep.ok and not rep.problems:
        problems.append("replication requirement unmet")
    # The sweep keeps PARTITIONS_AHEAD periods created (once a minute) and sends create theirs
    # when it does not: fewer left means no sweep ran for days. A warning days before; unhealthy
    # when less than one PARTITION_PERIOD is left.
    period = float(cfg.PARTITION_PERIOD)
    ahead = (snap.partitions_until - snap.taken_at).total_seconds() if snap.partitions_until else 0.0
    partitions_ok = not snap.partitioned or ahead >= period
    running_out = snap.partitioned and ahead < partitions_warn_before(cfg)
    until = snap.partitions_until.isoformat() if snap.partitions_until else "now"
    warnings: list[str] = []
    if not partitions_ok:
        problems.append(
            f"sends have a partition only until {until}, less than PARTITION_PERIOD ahead: "
            "is a sweep running? (zeroloss_partition show)"
        )
    elif running_out:
        warnings.append(partitions_warning(until))
    # A tick unsent well past its time: no scheduler is running for this database.
    overdue = snap.overdue_schedules
    problems += [f"{o.describe()}: is a scheduler running?" for o in overdue]
    return HealthReport(
        healthy=stuck_ok and dead_ok and rep.ok and partitions_ok and not overdue and not storage,
        checks={
            "database": {"ok": True},
            "storage": {"ok": not storage, "error": storage or None},
            "stuck": {"ok": stuck_ok, "value": snap.stuck, "max": cfg.HEALTH_MAX_STUCK},
            "dead": {"ok": dead_ok, "value": snap.dead, "max": cfg.HEALTH_MAX_DEAD},
            "replication": {"ok": rep.ok, **dataclasses.asdict(rep)},
            "partitions": {
                "ok": partitions_ok,
                "partitioned": snap.partitioned,
                "covered_until": snap.partitions_until.isoformat() if snap.partitions_until else None,
                "running_out": running_out,
            },
            "schedules": {"ok": not overdue, "overdue": [o.as_dict() for o in overdue]},
        },
        problems=problems,
        warnings=warnings,
        taken_at=snap.taken_at.isoformat(),
        cached=snap.cached,
    )


def partitions_warn_before(cfg: Any) -> float:
    """Seconds: partitions ahead ending sooner than this are reported (health, W042): three
    days, or half of ``PARTITIONS_AHEAD`` periods when that is shorter (the sweep keeps them
    all created; sends create theirs once half are left)."""
    return min(3 * 86400.0, float(cfg.PARTITION_PERIOD) * cfg.PARTITIONS_AHEAD / 2)


def partitions_warning(until: str) -> str:
    return (
        f"the partitions ahead end at {until}: no sweep has created periods ahead for days (sends "
        "create their own meanwhile); run a worker or a sweep (zeroloss_partition show)"
    )


@never_cache
@require_safe
def health_view(request: HttpRequest) -> JsonResponse:
    """``{"status": "ok"|"fail", ...}`` with HTTP 200 or 503."""
    report = health_report(ZeroLossMessageService(using=DEFAULT_DB_ALIAS))
    return JsonResponse(report.as_dict(), status=200 if report.healthy else 503)


@never_cache
@require_safe
def live_view(request: HttpRequest) -> JsonResponse:
    """Liveness: ``{"status": "ok"}``, HTTP 200, whenever the process can answer (no query)."""
    return JsonResponse({"status": "ok"})


def readiness(aliases: list[str] | None = None) -> tuple[bool, dict[str, dict[str, Any]]]:
    """Whether each ledger database (default: ``default`` and every ``LEDGER_DATABASES`` and
    ``QUEUE_DATABASES`` alias) answers ``SELECT 1`` now: no snapshot, no cache, no thresholds."""

    results: dict[str, dict[str, Any]] = {}
    for alias in aliases or list(dict.fromkeys([DEFAULT_DB_ALIAS, *ledger_aliases()])):
        monitor = OutageMonitor.for_alias(alias)
        try:
            conn = connections[alias]
            engine_for(conn).run(conn, statements_reads, "PING")
        except Exception as exc:
            if is_outage(exc):
                monitor.failed("the readiness check", exc)  # one log line per outage
                close_connection(alias)
            else:
                logger.exception("zeroloss: readiness check could not query database %r", alias)
            results[alias] = {"ok": False, "error": type(exc).__name__}
            continue
        monitor.recovered()
        results[alias] = {"ok": True}
    return all(r["ok"] for r in results.values()), results


@never_cache
@require_safe
def ready_view(request: HttpRequest) -> JsonResponse:
    """Readiness: ``{"status": "ok"|"fail", "databases": {...}}``, HTTP 200 or 503."""
    ready, databases = readiness()
    return JsonResponse(
        {"status": "ok" if ready else "fail", "databases": databases}, status=200 if ready else 503
    )
