"""The benchmark's own PostgreSQL database, and fast set-based loaders for benchmark setup.

Loaders are setup, never the measured path: they write rows exactly as the service would
(real checksums, one audit row per transition) with ``INSERT ... SELECT generate_series``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg

MSG = "zeroloss_message"
EVT = "zeroloss_messageevent"
KEY = "zeroloss_message_key"
HEAD = "zeroloss_ordering_head"
#: Where the ``bench.kill`` handler writes its markers.
MARKER_DIR_ENV = "ZEROLOSS_BENCH_MARKERS"
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/postgres"


def server_url(explicit: str | None = None) -> str:
    """A URL of the server (any database on it): flag, ZEROLOSS_BENCH_POSTGRES_URL, the test URL."""
    for candidate in (
        explicit,
        os.environ.get("ZEROLOSS_BENCH_POSTGRES_URL"),
        os.environ.get("ZEROLOSS_TEST_POSTGRES_URL"),
    ):
        if candidate:
            return candidate
    return DEFAULT_SERVER


def with_database(url: str, name: str) -> str:
    parts = urlparse(url)
    return urlunparse(parts._replace(path=f"/{name}"))


@dataclass
class BenchDatabase:
    """Creates (fresh) and drops one database; nothing else on the server is touched."""

    server: str
    name: str

    @property
    def url(self) -> str:
        return with_database(self.server, self.name)

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(with_database(self.server, "postgres"), autocommit=True)

    def create(self) -> None:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def connect(self, autocommit: bool = True) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=autocommit)


@contextmanager
def connection(url: str) -> Iterator[psycopg.Connection[Any]]:
    conn = psycopg.connect(url, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


def _payload_sql() -> str:
    # canonical_json({"n": i}) is '{"n":i}'; the checksum is its SHA-256, as the service computes it.
    return "format('{\"n\":%%s}', g)"


def load_messages(conn: psycopg.Connection[Any], *, queue: str, prefix: str, count: int, state: str) -> None:
    """Insert ``count`` messages of ``queue`` in ``state`` with their audit rows, in one transaction.

    ``state``: ``pending`` (persisted), ``expired`` (processing, lease expired a minute ago:
    sweep food) or ``completed`` (persisted, claimed, acknowledged an hour ago: retention).
    """
    payload = _payload_sql()
    common = (
        f"INSERT INTO {MSG} (message_id, queue_name, payload, checksum, status, attempts, max_attempts, "
        "available_at, lease_token, lease_expires_at, claimed_by, last_error, replication_targets, "
        "created_at, updated_at, completed_at) "
        f"SELECT %(prefix)s || '-' || g, %(queue)s, ({payload})::jsonb, "
        f"encode(sha256(convert_to({payload}, 'UTF8')), 'hex'), "
    )
    if state == "pending":
        select = (
            "'pending', 0, 5, now() - interval '1 second', NULL, NULL, '', '', '[]'::jsonb, "
            "now() - interval '1 second', now() - interval '1 second', NULL"
        )
        events = [("", "pending", "persisted", 0, "0 seconds")]
    elif state == "expired":
        select = (
            "'processing', 1, 5, now() - interval '2 minutes', gen_random_uuid(), now() - interval '1 minute', "
            "'bench-dead-worker', '', '[]'::jsonb, now() - interval '2 minutes', now() - interval '2 minutes', NULL"
        )
        events = [
            ("", "pending", "persisted", 0, "2 minutes"),
            ("pending", "processing", "claimed", 1, "2 minutes"),
        ]
    elif state == "completed":
        select = (
            "'completed', 1, 5, now() - interval '1 hour', NULL, NULL, 'bench-old-worker', '', '[]'::jsonb, "
            "now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'"
        )
        events = [
            ("", "pending", "persisted", 0, "1 hour"),
            ("pending", "processing", "claimed", 1, "1 hour"),
            ("processing", "completed", "acknowledged", 1, "1 hour"),
        ]
    else:
        raise ValueError(state)
    params = {"prefix": prefix, "queue": queue, "count": count}
    with conn.transaction():
        row = conn.execute(f"SELECT coalesce(max(id), 0) FROM {MSG}").fetchone()
        assert row is not None
        conn.execute(f"{common}{select} FROM generate_series(1, %(count)s) AS g ORDER BY g", params)
        for from_status, to_status, reason, attempt, age in events:
            conn.execute(
                f"INSERT INTO {EVT} (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, "
                f"message_created_at) SELECT id, %s, %s, %s, 'bench-loader', %s, '', now() - interval '{age}', "
                f"created_at FROM {MSG} WHERE id > %s AND queue_name = %s ORDER BY id",
                [from_status, to_status, reason, attempt, row[0], queue],
            )
        # The ids, as every send records them on PostgreSQL (zeroloss_message_key).
        conn.execute(
            f"INSERT INTO {KEY} (message_id, created_at) SELECT message_id, created_at FROM {MSG} "
            "WHERE id > %s AND queue_name = %s",
            [row[0], queue],
        )


def analyze(conn: psycopg.Connection[Any], vacuum: bool = False) -> None:
    """What autovacuum would do in production, done now so every run starts from the same plan."""
    conn.execute(f"{'VACUUM (ANALYZE)' if vacuum else 'ANALYZE'} {MSG}, {EVT}")


def reset(conn: psycopg.Connection[Any], keep_up_to_id: int = 0) -> None:
    """Remove every message (and its audit rows) above ``keep_up_to_id``; 0 empties the ledger."""
    if keep_up_to_id:
        conn.execute(f"DELETE FROM {EVT} WHERE message_id > %s", [keep_up_to_id])
        conn.execute(
            f"DELETE FROM {KEY} WHERE message_id IN (SELECT message_id FROM {MSG} WHERE id > %s)",
            [keep_up_to_id],
        )
        conn.execute(f"DELETE FROM {HEAD} WHERE message_pk > %s", [keep_up_to_id])
        conn.execute(f"DELETE FROM {MSG} WHERE id > %s", [keep_up_to_id])
        analyze(conn, vacuum=True)
    else:
        conn.execute(f"TRUNCATE {MSG}, {EVT}, {KEY}, {HEAD}")
        analyze(conn)


def max_id(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(f"SELECT coalesce(max(id), 0) FROM {MSG}").fetchone()
    return int(row[0]) if row else 0
