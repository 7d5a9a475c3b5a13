"""The raw-SQL limit: psycopg issuing, directly, the statements a careful ledger must issue.

Same tables, same indexes, same audit row in the same statement, same commit per transition,
server-side prepared statements, no framework. What zeroloss does beyond this is its overhead.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import psycopg

from .db import EVT, MSG

_EVENT = (
    f"INSERT INTO {EVT} (message_id, from_status, to_status, reason, actor, attempt, detail, created_at) "
    "SELECT id, %(from)s, status, %(reason)s, %(actor)s, attempts, '', updated_at FROM t"
)

INSERT_BARE = (
    f"INSERT INTO {MSG} (message_id, queue_name, payload, checksum, status, attempts, max_attempts, "
    "available_at, claimed_by, last_error, replication_targets, created_at, updated_at) "
    "VALUES (%(id)s, %(queue)s, %(payload)s::jsonb, %(checksum)s, 'pending', 0, 5, statement_timestamp(), "
    "'', '', '[]'::jsonb, statement_timestamp(), statement_timestamp()) ON CONFLICT (message_id) DO NOTHING "
    "RETURNING id, status, attempts, updated_at"
)

INSERT_AUDITED = f"WITH t AS ({INSERT_BARE}), ev AS ({_EVENT}) SELECT id FROM t"

CLAIM = (
    f"WITH t AS (UPDATE {MSG} SET status = 'processing', attempts = attempts + 1, "
    "lease_token = gen_random_uuid(), lease_expires_at = statement_timestamp() + interval '5 seconds', "
    "claimed_by = %(actor)s, updated_at = statement_timestamp() "
    f"WHERE id = ANY(ARRAY(SELECT id FROM {MSG} WHERE status = 'pending' AND queue_name = %(queue)s "
    "AND available_at <= statement_timestamp() ORDER BY available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)) "
    "AND status = 'pending' "
    "RETURNING id, message_id, status, attempts, updated_at, lease_token, payload), "
    f"ev AS ({_EVENT}) SELECT message_id, lease_token, payload FROM t"
)

ACK = (
    f"WITH t AS (UPDATE {MSG} SET status = 'completed', completed_at = statement_timestamp(), "
    "updated_at = statement_timestamp(), lease_token = NULL, lease_expires_at = NULL, last_error = '' "
    "WHERE message_id = %(id)s AND lease_token = %(token)s AND status = 'processing' "
    "AND lease_expires_at > statement_timestamp() RETURNING id, status, attempts, updated_at), "
    f"ev AS ({_EVENT}) SELECT id FROM t"
)


def payload(n: int) -> tuple[str, str]:
    encoded = json.dumps({"n": n}, sort_keys=True, separators=(",", ":"))
    return encoded, hashlib.sha256(encoded.encode()).hexdigest()


def insert_loop(url: str, *, queue: str, prefix: str, count: int, audited: bool = True) -> float:
    """``count`` single-row INSERTs, one commit each (autocommit). Returns elapsed seconds."""
    sql = INSERT_AUDITED if audited else INSERT_BARE
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        cur = conn.cursor()
        started = time.perf_counter()
        for n in range(count):
            encoded, checksum = payload(n)
            cur.execute(
                sql,
                {
                    "id": f"{prefix}-{n}",
                    "queue": queue,
                    "payload": encoded,
                    "checksum": checksum,
                    "from": "",
                    "reason": "persisted",
                    "actor": "raw",
                },
            )
            cur.fetchall()
        return time.perf_counter() - started


def drain_loop(conn: psycopg.Connection[Any], *, queue: str, batch: int, actor: str) -> int:
    """Claim ``batch`` at a time and acknowledge each (one commit per claim, one per ack)."""
    cur = conn.cursor()
    done = 0
    while True:
        cur.execute(
            CLAIM, {"actor": actor, "queue": queue, "limit": batch, "from": "pending", "reason": "claimed"}
        )
        rows = cur.fetchall()
        if not rows:
            return done
        for message_id, token, _payload in rows:
            cur.execute(
                ACK,
                {
                    "id": message_id,
                    "token": token,
                    "from": "processing",
                    "reason": "acknowledged",
                    "actor": actor,
                },
            )
            if cur.fetchall():
                done += 1
