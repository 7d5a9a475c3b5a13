"""The few places where PostgreSQL and SQLite speak different SQL.

Everything that decides a lease uses :attr:`Dialect.now`, the *database* clock: on
PostgreSQL ``statement_timestamp()``, on SQLite the host clock of the one machine that
holds the file. No worker's clock is ever compared with a lease.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.dateparse import parse_datetime


class Dialect:
    vendor = "generic"
    now = "CURRENT_TIMESTAMP"
    new_token = ""
    json_cast = ""
    #: Data-modifying CTEs let a transition and its audit row be one statement.
    dml_cte = False
    skip_locked = ""
    #: Extra RETURNING column that wakes idle workers when a message becomes claimable.
    wakeup_sql = ""

    def now_plus(self, seconds: float) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def ids_in(self, subquery: str) -> str:
        return f"id IN ({subquery})"

    def token_param(self, token: uuid.UUID) -> Any:
        return token

    @staticmethod
    def to_datetime(value: Any) -> dt.datetime | None:
        if isinstance(value, dt.datetime):
            # SQLite hands back naive UTC datetimes; the ledger always speaks aware UTC.
            return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        if value is None:
            return None
        parsed = parse_datetime(str(value))
        if parsed is None:
            raise ValueError(f"not a datetime: {value!r}")
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        return parsed

    @classmethod
    def at(cls, value: Any) -> dt.datetime:
        """A non-null database timestamp as an aware UTC datetime."""
        parsed = cls.to_datetime(value)
        if parsed is None:
            raise ValueError("expected a timestamp, got NULL")
        return parsed

    @staticmethod
    def to_uuid(value: Any) -> uuid.UUID | None:
        if value is None or isinstance(value, uuid.UUID):
            return value
        return uuid.UUID(str(value))

    @classmethod
    def token(cls, value: Any) -> uuid.UUID:
        parsed = cls.to_uuid(value)
        if parsed is None:
            raise ValueError("expected a lease token, got NULL")
        return parsed

    @staticmethod
    def to_json(value: Any) -> Any:
        return json.loads(value) if isinstance(value, str | bytes) else value


class PostgresDialect(Dialect):
    vendor = "postgresql"
    now = "statement_timestamp()"
    new_token = "gen_random_uuid()"
    json_cast = "::jsonb"
    dml_cte = True
    skip_locked = " FOR UPDATE SKIP LOCKED"
    # Delivered at commit, collapsed per transaction and queue; idle workers LISTEN on it.
    wakeup_sql = ", pg_notify('zeroloss_wakeup', queue_name)"

    def now_plus(self, seconds: float) -> tuple[str, list[Any]]:
        return "(statement_timestamp() + %s * interval '1 second')", [float(seconds)]

    def ids_in(self, subquery: str) -> str:
        # ARRAY(...) evaluates the locking subquery exactly once; a plain IN (...) may be
        # re-planned as a join that re-runs it and locks more rows than LIMIT.
        return f"id = ANY(ARRAY({subquery}))"


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    # Django stores datetimes on SQLite as ISO text in UTC; this sorts and compares with them.
    now = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    new_token = "lower(hex(randomblob(16)))"

    def now_plus(self, seconds: float) -> tuple[str, list[Any]]:
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)", [f"{float(seconds):+.6f} seconds"]

    def token_param(self, token: uuid.UUID) -> Any:
        return token.hex


_DIALECTS: dict[str, Dialect] = {"postgresql": PostgresDialect(), "sqlite": SQLiteDialect()}


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    dialect = _DIALECTS.get(connection.vendor)
    if dialect is not None:
        return dialect
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"zeroloss supports PostgreSQL and SQLite; database {connection.alias!r} is {connection.vendor}."
    )
