"""System checks with stable ids. Errors stop ``manage.py check``; warnings name a risk.

| id              | meaning |
| --------------- | ------- |
| zeroloss.E001   | ``ZEROLOSS`` is not a dict |
| zeroloss.E002   | unknown key in ``ZEROLOSS`` |
| zeroloss.E003   | invalid value in ``ZEROLOSS`` |
| zeroloss.E004   | the database is neither PostgreSQL nor SQLite |
| zeroloss.E005   | ``JSON_ENCODER`` is not the importable dotted path of a ``json.JSONEncoder`` subclass |
| zeroloss.E006   | ``QUEUES`` is not a dict of valid queue names -> dicts of known options |
| zeroloss.E007   | a queue's ``concurrency`` or ``rate`` in ``QUEUES`` is invalid |
| zeroloss.E008   | ``RETENTION`` or a queue's ``retention`` in ``QUEUES`` is invalid |
| zeroloss.E010   | ``PERSISTENCE_LEVEL = "replicated"`` on a database that cannot replicate |
| zeroloss.E011   | ``QUEUE_DATABASES`` or ``LEDGER_DATABASES`` names an alias missing from ``DATABASES`` |
| zeroloss.W001   | ``SWEEP_INTERVAL`` is longer than ``ACK_TIMEOUT`` |
| zeroloss.W002   | heartbeat interval is not shorter than ``ACK_TIMEOUT`` |
| zeroloss.W003   | SQLite without ``transaction_mode = "IMMEDIATE"`` |
| zeroloss.W010   | PostgreSQL with fewer streaming physical standbys than ``REPLICATION_FACTOR - 1``, |
|                 | or a role that cannot read ``pg_stat_replication`` (``check --database default``) |
| zeroloss.W011   | ``REPLICATION_FACTOR > 1`` on a database that cannot replicate |
| zeroloss.E020   | a zeroloss task backend's ``QUEUES`` (``TASKS``) is not a list of valid queue |
|                 | names (``[]``: any queue)                                                     |
| zeroloss.E021   | a task queue is also the queue of a ``@zeroloss.handler`` |
| zeroloss.E022   | a zeroloss task backend's ``OPTIONS`` is not a dict, or has an unknown key |
| zeroloss.E023   | a zeroloss task backend's ``OPTIONS["MAX_ATTEMPTS"]`` is invalid |
| zeroloss.E024   | a zeroloss task backend in ``TASKS`` without ``"zeroloss"`` in ``INSTALLED_APPS`` |
| zeroloss.W020   | ``TASKS`` names the zeroloss backend but no Tasks framework is installed |
|                 | (Django < 6 without ``django-tasks``): ``TASKS`` does nothing |
| zeroloss.W030   | PostgreSQL on port 6432 (PgBouncer's default) with ``PREPARED_STATEMENTS`` on |
| zeroloss.W031   | a pooler answers the connection (measured) and ``PREPARED_STATEMENTS`` is on |
|                 | (``check --database default``)                                           |
| zeroloss.W032   | a pooler answers the connection (measured) and Django's server-side cursors |
|                 | are on (``DISABLE_SERVER_SIDE_CURSORS``; ``check --database default``)   |
| zeroloss.I050   | PostgreSQL through psycopg2 with ``PREPARED_STATEMENTS`` on: nothing is prepared |
| zeroloss.E050   | ``SCHEDULES`` is not a dict of name -> dict, or a schedule name is invalid |
| zeroloss.E051   | a schedule has an unknown key |
| zeroloss.E052   | a schedule has both or neither of ``cron`` / ``every`` |
| zeroloss.E053   | a schedule's ``cron`` is not a valid five-field expression |
| zeroloss.E054   | a schedule's ``every`` is not a number of seconds > 0 |
| zeroloss.E055   | a schedule's ``timezone`` is not a known IANA time zone |
| zeroloss.E056   | a schedule's ``queue`` has no handler, or it has both or neither of ``queue`` / ``task`` |
| zeroloss.E057   | a schedule's ``task`` cannot be imported or is not a Django task |
| zeroloss.E058   | a schedule's other key has an invalid value (``payload``, ``priority``, ``catch_up``, ...) |
| zeroloss.E070   | ``TRANSPORT = "celery"`` and the loaded Celery app is not the project's: Celery's |
|                 | default app (``proj/__init__.py`` does not import the app), or one whose broker  |
|                 | is not ``CELERY_BROKER_URL``                                                      |
| zeroloss.E060   | a handler's ``soft_time_limit`` is not shorter than its hard bound (``HANDLER_TIMEOUT``) |
| zeroloss.E040   | PostgreSQL older than 13 (``check --database default``) |
| zeroloss.W040   | PostgreSQL with ``fsync = off`` (``check --database default``) |
| zeroloss.W041   | PostgreSQL with ``synchronous_commit = off`` for zeroloss's connection |
|                 | (``check --database default``) |
| zeroloss.W042   | a partitioned ledger's partitions ahead end within three days (no sweep ran for |
|                 | days; ``check --database default``) |
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Info, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS, connections

from ...core.doc_pages import see
from ...core.setting_values import SettingError
from ...core.settings import ZeroLossSettings, parse_settings
from ...integrations.replication import requirement
from ...ledger import partitions
from ...ledger.engine import Engine
from ...ledger.postgres import PostgresEngine
from ...ledger.service import ZeroLossMessageService
from ...ledger.sqlite import SqliteEngine
from ...runtime.schedules.spec import schedule_errors
from ..health import partitions_warn_before, partitions_warning
from .server import (  # noqa: F401  (each check's public names stay importable from here)
    MIN_POSTGRES_VERSION_NUM,
    PGBOUNCER_DEFAULT_PORT,
    behind_pooler,
    pooler_messages,
    postgres_messages,
    postgres_readings,
)

#: The engine of each database zeroloss supports, by Django's vendor name.
ENGINES: dict[str, type[Engine]] = {engine.vendor: engine for engine in (PostgresEngine, SqliteEngine)}


def _settings() -> tuple[ZeroLossSettings | None, list[CheckMessage]]:
    try:
        return parse_settings(getattr(settings, "ZEROLOSS", None)), []
    except SettingError as exc:
        return None, [Error(str(exc), hint=exc.hint, obj="settings.ZEROLOSS", id=exc.check_id)]


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    cfg, errors = _settings()
    if cfg is None:
        return errors
    messages: list[CheckMessage] = []
    if cfg.SWEEP_INTERVAL > cfg.ACK_TIMEOUT:
        messages.append(
            Warning(
                f"SWEEP_INTERVAL ({cfg.SWEEP_INTERVAL:g}s) is longer than ACK_TIMEOUT ({cfg.ACK_TIMEOUT:g}s): "
                "orphaned messages wait up to a whole sweep interval after their lease expired.",
                hint="Set ZEROLOSS['SWEEP_INTERVAL'] to at most ACK_TIMEOUT (a third of it is a good start).",
                obj="settings.ZEROLOSS",
                id="zeroloss.W001",
            )
        )
    for alias in sorted({*cfg.LEDGER_DATABASES, *cfg.QUEUE_DATABASES.values()} - set(settings.DATABASES)):
        messages.append(
            Error(
                f"ZEROLOSS names the database alias {alias!r}, which is not in DATABASES.",
                hint="Add it to DATABASES, or fix QUEUE_DATABASES / LEDGER_DATABASES.",
                obj="settings.ZEROLOSS",
                id="zeroloss.E011",
            )
        )
    if cfg.heartbeat_interval >= cfg.ACK_TIMEOUT:
        messages.append(
            Warning(
                f"The heartbeat interval ({cfg.heartbeat_interval:g}s) is not shorter than ACK_TIMEOUT "
                f"({cfg.ACK_TIMEOUT:g}s): live workers will lose their leases.",
                hint="Leave HEARTBEAT_INTERVAL unset (ACK_TIMEOUT / 3) or make it well below ACK_TIMEOUT.",
                obj="settings.ZEROLOSS",
                id="zeroloss.W002",
            )
        )
    return messages


def _aliases(databases: Iterable[str] | None) -> list[str]:
    return list(databases) if databases else [DEFAULT_DB_ALIAS]


@register(Tags.database)
def check_database(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Checks that need to talk to the database (``manage.py check --database default``).

    E040/W040/W041 read the server's settings; W010 is measured on the primary
    (``pg_stat_replication``), never read from the node registry.
    """
    if not databases:
        return []
    cfg, _ = _settings()

    messages: list[CheckMessage] = []
    for alias in databases:
        engine = ENGINES.get(connections[alias].vendor)
        if engine is None or not engine.is_server:  # an unsupported database is E004's
            continue
        messages += postgres_messages(alias, *postgres_readings(alias))
        if cfg is None:
            continue
        messages += pooler_messages(alias, behind_pooler(alias), connections[alias].settings_dict, cfg)
        messages += partitions_messages(alias, cfg)
        if cfg.REPLICATION_FACTOR == 1:
            continue
        req = requirement(ZeroLossMessageService(using=alias))
        if not req.ok:
            messages.append(
                Warning(
                    f"Database {alias!r}: {' '.join(req.problems)}",
                    hint="Attach streaming standbys, or lower ZEROLOSS['REPLICATION_FACTOR'] "
                    f"({see('replication', 'Running zeroloss on a primary with standbys')}).",
                    obj="settings.ZEROLOSS",
                    id="zeroloss.W010",
                )
            )
    return messages


def partitions_messages(alias: str, cfg: ZeroLossSettings) -> list[CheckMessage]:
    """W042: the partitions ahead of a partitioned ledger end soon (no sweep for days)."""

    conn = connections[alias]
    if not partitions.is_partitioned(conn):
        return []
    until = partitions.coverage(conn)
    left = (until - partitions.database_now(conn)).total_seconds() if until is not None else 0.0
    if left >= partitions_warn_before(cfg):
        return []
    return [
        Warning(
            f"Database {alias!r}: {partitions_warning(until.isoformat() if until else 'now')}.",
            hint="Run a worker (zeroloss_worker) or zeroloss_sweep --loop: each creates PARTITIONS_AHEAD "
            f"periods ahead once a minute ({see('scaling', 'Partitions that never run out')}).",
            obj="settings.ZEROLOSS",
            id="zeroloss.W042",
        )
    ]


@register()
def check_backend(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Checks that only need the configured backend, not a connection."""
    cfg, _ = _settings()
    messages: list[CheckMessage] = []
    for alias in _aliases(None):
        if alias in settings.DATABASES:
            conn = connections[alias]
            messages += backend_messages(alias, conn.vendor, conn.settings_dict.get("OPTIONS") or {}, cfg)
            engine = ENGINES.get(conn.vendor)
            if engine is not None and engine.is_server and cfg is not None:
                messages += pooler_messages(alias, None, conn.settings_dict, cfg)
                messages += driver_messages(alias, cfg)
    return messages


def driver_messages(alias: str, cfg: ZeroLossSettings) -> list[CheckMessage]:
    """psycopg2 runs everything, but cannot prepare statements: say so once, before anything runs."""
    # Deferred: psycopg is optional (SQLite needs no driver).
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if is_psycopg3 or not cfg.PREPARED_STATEMENTS:
        return []
    return [
        Info(
            f"Database {alias!r} uses psycopg2, which cannot prepare statements: zeroloss's hot-path "
            "statements are planned on every call (PREPARED_STATEMENTS has no effect), everything else "
            "works the same.",
            hint="Install psycopg 3 (pip install 'psycopg[binary]'): Django uses it whenever it is installed, "
            f"and it gives the measured throughput ({see('benchmarks')}). Or set "
            "ZEROLOSS['PREPARED_STATEMENTS'] = False.",
            obj="settings.DATABASES",
            id="zeroloss.I050",
        )
    ]


def backend_messages(
    alias: str, vendor: str, options: dict[str, Any], cfg: ZeroLossSettings | None
) -> list[CheckMessage]:
    engine = ENGINES.get(vendor)
    if engine is None:
        return [
            Error(
                f"Database {alias!r} is {vendor}; zeroloss supports PostgreSQL and SQLite.",
                obj="settings.DATABASES",
                id="zeroloss.E004",
            )
        ]
    messages: list[CheckMessage] = []
    if engine.supports_replication:
        return messages
    if engine.single_writer and str(options.get("transaction_mode")).upper() != "IMMEDIATE":
        messages.append(
            Warning(
                f"SQLite database {alias!r} does not use transaction_mode='IMMEDIATE': concurrent "
                "worker processes may fail with 'database is locked'.",
                hint='Add "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30} to the database.',
                obj="settings.DATABASES",
                id="zeroloss.W003",
            )
        )
    if cfg is not None and cfg.PERSISTENCE_LEVEL == "replicated":
        consequence = (
            "every persist would fail with ReplicationTimeout."
            if cfg.REPLICATION_FACTOR > 1
            else "with REPLICATION_FACTOR=1 'replicated' promises nothing beyond 'durable'."
        )
        messages.append(
            Error(
                f"PERSISTENCE_LEVEL is 'replicated' but database {alias!r} is SQLite, which cannot "
                f"replicate: {consequence}",
                hint="Use PostgreSQL with streaming standbys, or PERSISTENCE_LEVEL='durable'.",
                obj="settings.ZEROLOSS",
                id="zeroloss.E010",
            )
        )
    elif cfg is not None and cfg.REPLICATION_FACTOR > 1:
        messages.append(
            Warning(
                f"REPLICATION_FACTOR is {cfg.REPLICATION_FACTOR} but database {alias!r} is SQLite, which "
                "keeps one copy: integrity checks will report insufficient replication.",
                hint="Use PostgreSQL with streaming standbys, or REPLICATION_FACTOR=1.",
                obj="settings.ZEROLOSS",
                id="zeroloss.W011",
            )
        )
    return messages


@register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E050-E058: every invalid ``ZEROLOSS["SCHEDULES"]`` entry, naming the schedule and the field."""

    raw = (
        settings.ZEROLOSS.get("SCHEDULES") if isinstance(getattr(settings, "ZEROLOSS", None), dict) else None
    )
    return [
        Error(
            str(exc),
            hint="A schedule is a dict with 'cron' (five fields) or 'every' (seconds), and 'queue' (with "
            "'payload') or 'task' (with 'args', 'kwargs'); the message above names the key to fix "
            f"({see('schedules')}).",
            obj="settings.ZEROLOSS",
            id=exc.check_id,
        )
        for exc in schedule_errors(raw)
    ]


# E020-E023 and W020 live with the task backend; imported here so they are registered.
from ...integrations.tasks_backend.checks import check_tasks, tasks_messages  # noqa: E402, F401

# E060 lives with the time limits.
from .time_limits import check_time_limits  # noqa: E402

register()(check_time_limits)

# E070 lives with the Celery transport's choice of app.
from ...integrations.celery.app import check_celery_app  # noqa: E402

register()(check_celery_app)
