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

from .db import EVT, KEY, MSG

_EVENT = (
    f"INSERT INTO {EVT} (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, "
    "message_created_at) SELECT id, %(from)s, status, %(reason)s, %(actor)s, attempts, '', updated_at, created_at FROM t"
)

# The id claimed in the key table first, as zeroloss's own send does on PostgreSQL (the message
# table's unique index cannot be relied on: a partitioned one has none).
_KEY = (
    f"k AS (INSERT INTO {KEY} (message_id, created_at) VALUES (%(id)s, statement_timestamp()) "
    "ON CONFLICT DO NOTHING RETURNING message_id)"
)
_INSERT = (
    f"INSERT INTO {MSG} (message_id, queue_name, payload, checksum, status, attempts, max_attempts, "
    "available_at, claimed_by, last_error, replication_targets, created_at, updated_at) "
    "SELECT k.message_id, %(queue)s, %(payload)s::jsonb, %(checksum)s, 'pending', 0, 5, statement_timestamp(), "
    "'', '', '[]'::jsonb, statement_timestamp(), statement_timestamp() FROM k ON CONFLICT DO NOTHING "
    "RETURNING id, status, attempts, updated_at, created_at"
)
INSERT_BARE = f"WITH {_KEY} {_INSERT}"

INSERT_AUDITED = f"WITH {_KEY}, t AS ({_INSERT}), ev AS ({_EVENT}) SELECT id FROM t"

# In the claim index's order (no sort). The status is checked where the rows are chosen and
# locked, not again by the UPDATE, which a partition's stale statistics plan through its status
# index: every pending row (statements.CLAIM).
CLAIM = (
    f"WITH t AS (UPDATE {MSG} SET status = 'processing', attempts = attempts + 1, "
    "lease_token = gen_random_uuid(), lease_expires_at = statement_timestamp() + interval '5 seconds', "
    "claimed_by = %(actor)s, updated_at = statement_timestamp() "
    f"WHERE id = ANY(ARRAY(SELECT id FROM {MSG} WHERE status = 'pending' AND queue_name = %(queue)s "
    "AND available_at <= statement_timestamp() ORDER BY priority DESC, available_at, id LIMIT %(limit)s "
    "FOR UPDATE SKIP LOCKED)) "
    "RETURNING id, message_id, status, attempts, updated_at, lease_token, payload, created_at), "
    f"ev AS ({_EVENT}) SELECT message_id, lease_token, payload FROM t"
)

ACK = (
    f"WITH t AS (UPDATE {MSG} SET status = 'completed', completed_at = statement_timestamp(), "
    "updated_at = statement_timestamp(), lease_token = NULL, lease_expires_at = NULL, last_error = '' "
    "WHERE message_id = %(id)s AND lease_token = %(token)s AND status = 'processing' "
    "AND lease_expires_at > statement_timestamp() RETURNING id, status, attempts, updated_at, created_at), "
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


ACK_BATCH = (
    f"WITH t AS (UPDATE {MSG} SET status = 'completed', completed_at = statement_timestamp(), "
    "updated_at = statement_timestamp(), lease_token = NULL, lease_expires_at = NULL, last_error = '' "
    "FROM unnest(%(ids)s::text[], %(tokens)s::uuid[]) AS b(mid, tok) "
    f"WHERE {MSG}.message_id = b.mid AND {MSG}.lease_token = b.tok AND {MSG}.status = 'processing' "
    f"AND {MSG}.lease_expires_at > statement_timestamp() RETURNING {MSG}.id, {MSG}.status, {MSG}.attempts, "
    f"{MSG}.updated_at, {MSG}.created_at), ev AS ({_EVENT}) SELECT count(*) FROM t"
)


def drain_batched_loop(conn: psycopg.Connection[Any], *, queue: str, batch: int, actor: str) -> int:
    """Claim ``batch`` at a time, then acknowledge the whole batch in one fenced statement (with
    its audit rows): two commits per batch. The limit of a batched, fenced, audited worker."""
    cur = conn.cursor()
    done = 0
    while True:
        cur.execute(
            CLAIM, {"actor": actor, "queue": queue, "limit": batch, "from": "pending", "reason": "claimed"}
        )
        rows = cur.fetchall()
        if not rows:
            return done
        # Planned with the batch in hand, as zeroloss plans its fenced batches: a prepared
        # statement's generic plan unpacks the batch again for every lease held (quadratic).
        cur.execute(
            ACK_BATCH,
            {
                "ids": [r[0] for r in rows],
                "tokens": [r[1] for r in rows],
                "from": "processing",
                "reason": "acknowledged",
                "actor": actor,
            },
            prepare=False,
        )
        row = cur.fetchone()
        done += int(row[0]) if row else 0


def copy_messages(url: str, *, queue: str, prefix: str, count: int) -> float:
    """The bulk limit: ``COPY`` the message rows, then their audit rows in one set-based INSERT, in
    one transaction. Returns elapsed seconds (payload encoding and hashing included)."""
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        with conn.cursor() as cur:
            first = cur.execute(f"SELECT coalesce(max(id), 0) FROM {MSG}").fetchone()
            with cur.copy(
                f"COPY {MSG} (message_id, queue_name, payload, checksum, status, attempts, max_attempts, "
                "priority, ordering_key, available_at, claimed_by, last_error, replication_targets, created_at, "
                "updated_at) FROM STDIN"
            ) as copy:
                for n in range(count):
                    encoded, checksum = payload(n)
                    copy.write_row(
                        (
                            f"{prefix}-{n}",
                            queue,
                            encoded,
                            checksum,
                            "pending",
                            0,
                            5,
                            0,
                            "",
                            "now",
                            "",
                            "",
                            "[]",
                            "now",
                            "now",
                        )
                    )
            cur.execute(
                f"INSERT INTO {EVT} (message_id, from_status, to_status, reason, actor, attempt, detail, created_at, "
                f"message_created_at) SELECT id, '', 'pending', 'persisted', 'raw-copy', 0, '', created_at, created_at "
                f"FROM {MSG} WHERE id > %s AND queue_name = %s",
                [first[0] if first else 0, queue],
            )
            # The ids, as zeroloss's bulk send COPYs them (zeroloss_message_key).
            with cur.copy(f"COPY {KEY} (message_id, created_at) FROM STDIN") as copy:
                for n in range(count):
                    copy.write_row((f"{prefix}-{n}", "now"))
        conn.commit()
        return time.perf_counter() - started
