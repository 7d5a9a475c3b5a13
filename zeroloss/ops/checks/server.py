"""The checks of a database server: connection poolers in between, PostgreSQL's own settings
(W030-W032, E040, W040, W041; ids listed in :mod:`zeroloss.ops.checks`)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning
from django.db import connections

from ...core.doc_pages import see
from ...core.settings import ZeroLossSettings
from ...ledger import statements_reads
from ...ledger.base import engine_for

# -- connection poolers (docs/scaling.md, "Behind PgBouncer") ---------------------------------

#: PgBouncer's default listen port. PostgreSQL itself listens on 5432 unless told otherwise.
PGBOUNCER_DEFAULT_PORT = 6432


def behind_pooler(alias: str) -> bool:
    """Whether a protocol-level pooler (PgBouncer, ...) sits between Django and PostgreSQL.

    At connection start PostgreSQL sends the client its backend's process id (BackendKeyData);
    PgBouncer sends a random one of its own instead, since the client will be served by
    whichever server connection is free. So the pid the connection was given differs from the
    pid of the backend that runs our query. A TCP proxy or a port mapping forwards the real one.
    """
    conn = connections[alias]
    conn.ensure_connection()
    [(backend_pid,)], _ = engine_for(conn).run(conn, statements_reads, "BACKEND_PID")
    return bool(conn.connection.info.backend_pid != backend_pid)


def _ports(value: Any) -> list[str]:
    return [p.strip() for p in str(value or "").split(",") if p.strip()]


def pooler_messages(
    alias: str, measured: bool | None, settings_dict: dict[str, Any], cfg: ZeroLossSettings
) -> list[CheckMessage]:
    """W030 (``measured`` None: from the configured port only), W031 and W032 (measured)."""
    messages: list[CheckMessage] = []
    prepared = cfg.PREPARED_STATEMENTS
    if measured is None:
        if prepared and str(PGBOUNCER_DEFAULT_PORT) in _ports(settings_dict.get("PORT")):
            messages.append(
                Warning(
                    f"Database {alias!r} uses port {PGBOUNCER_DEFAULT_PORT}, PgBouncer's default, and "
                    "ZEROLOSS['PREPARED_STATEMENTS'] is True: behind PgBouncer before 1.21 in transaction "
                    "mode, zeroloss's prepared statements fail ('prepared statement \"_pg3_0\" already "
                    "exists' / 'does not exist').",
                    hint="Behind a transaction-pooling PgBouncer set ZEROLOSS['PREPARED_STATEMENTS'] = False "
                    "(and run zeroloss_worker with --no-listen). If port 6432 is PostgreSQL itself or a "
                    "session-pooling PgBouncer, add 'zeroloss.W030' to SILENCED_SYSTEM_CHECKS.",
                    obj="settings.DATABASES",
                    id="zeroloss.W030",
                )
            )
        return messages
    if not measured:
        return messages
    if prepared:
        messages.append(
            Warning(
                f"Database {alias!r} is reached through a connection pooler (the backend pid differs from "
                "the one the connection was given) and ZEROLOSS['PREPARED_STATEMENTS'] is True: in "
                "transaction pooling mode (PgBouncer before 1.21, or without max_prepared_statements) "
                "zeroloss's prepared statements fail.",
                hint="Set ZEROLOSS['PREPARED_STATEMENTS'] = False and run zeroloss_worker with --no-listen. "
                "Session pooling, or PgBouncer >= 1.21 with max_prepared_statements > 0, keeps prepared "
                "statements: then add 'zeroloss.W031' to SILENCED_SYSTEM_CHECKS.",
                obj="settings.ZEROLOSS",
                id="zeroloss.W031",
            )
        )
    if not settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        messages.append(
            Warning(
                f"Database {alias!r} is reached through a connection pooler and Django's server-side "
                "cursors are on: in transaction pooling mode a QuerySet.iterator() outside a transaction "
                "(zeroloss_verify uses one) declares a cursor on one server connection and fetches from "
                "another.",
                hint=f"Set DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = True. Under session pooling "
                "add 'zeroloss.W032' to SILENCED_SYSTEM_CHECKS.",
                obj="settings.DATABASES",
                id="zeroloss.W032",
            )
        )
    return messages


# -- PostgreSQL's own settings (docs/production.md) -------------------------------------------

#: The oldest PostgreSQL the ledger runs on: a partitioned ledger's purge detaches its periods
#: with ``DETACH PARTITION ... CONCURRENTLY`` (14); ``gen_random_uuid()`` and
#: ``pg_current_xact_id_if_assigned()`` are built in from 13.
MIN_POSTGRES_VERSION_NUM = 140000


def postgres_readings(alias: str) -> tuple[int, str, str]:
    """``server_version_num``, ``fsync`` and ``synchronous_commit`` as this alias's connection sees them
    (``synchronous_commit`` may be set per role, database or connection ``OPTIONS``)."""
    conn = connections[alias]
    [(version, fsync, synchronous_commit)], _ = engine_for(conn).run(
        conn, statements_reads, "SERVER_SETTINGS"
    )
    return int(version), str(fsync), str(synchronous_commit)


def postgres_messages(
    alias: str, version_num: int, fsync: str, synchronous_commit: str
) -> list[CheckMessage]:
    """E040/W040/W041 from what a PostgreSQL server reported."""
    messages: list[CheckMessage] = []
    if version_num < MIN_POSTGRES_VERSION_NUM:
        major = str(version_num // 10000)
        if version_num < 100000:  # 9.6 is 90600: its major version has two parts
            major += f".{version_num // 100 % 100}"
        messages.append(
            Error(
                f"Database {alias!r} is PostgreSQL {major} (server_version_num {version_num}); zeroloss "
                "needs PostgreSQL 14 or newer (DETACH PARTITION ... CONCURRENTLY, gen_random_uuid()).",
                hint="Upgrade the server to PostgreSQL 14 or newer.",
                obj="settings.DATABASES",
                id="zeroloss.E040",
            )
        )
    if fsync.lower() == "off":
        messages.append(
            Warning(
                f"Database {alias!r} runs with fsync = off: a crash of the server or its host can lose or "
                'corrupt committed messages, so "durable" is not.',
                hint="Set fsync = on in postgresql.conf and reload the server ("
                f"{see('production', 'PostgreSQL settings')}).",
                obj="settings.DATABASES",
                id="zeroloss.W040",
            )
        )
    if synchronous_commit.lower() == "off":
        messages.append(
            Warning(
                f"Database {alias!r}: synchronous_commit = off for zeroloss's connection: a commit returns "
                "before it is flushed, so a server crash can lose messages send() already returned, and "
                "acknowledgements (handlers then run again).",
                hint="Use synchronous_commit = on (or local, remote_write, remote_apply) for the role, the "
                "database and the connection OPTIONS zeroloss uses "
                f"({see('production', 'PostgreSQL settings')}).",
                obj="settings.DATABASES",
                id="zeroloss.W041",
            )
        )
    return messages
