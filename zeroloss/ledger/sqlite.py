"""The SQLite engine: one writer at a time, so a transition and its audit rows share a transaction.

Batches travel as one JSON array (``json_each``), so every batch statement has one text
whatever its size. Times are ISO text in UTC, which is how Django stores them on SQLite,
so they sort and compare with the clock (``strftime('%Y-%m-%d %H:%M:%f', 'now')``).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from .engine import MOVED_FROM, Engine, Move, Params, Rows
from .sqlite_gate import gate_of
from .statements_moves import FINISHED, Edge, audit_row


def _refuse_transaction_control(action: int, *args: Any) -> int:
    """An authoriser that refuses COMMIT, ROLLBACK and BEGIN (savepoints stay allowed)."""
    return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_TRANSACTION else sqlite3.SQLITE_OK


class SqliteEngine(Engine):
    vendor = "sqlite"
    single_writer = True

    def column(self, values: Iterable[Any]) -> Any:
        return json.dumps(list(values), default=str)

    def batch(self, **columns: Sequence[Any]) -> dict[str, Any]:
        rows = [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]
        return {"rows": json.dumps(rows, default=str)}

    def open_batch(self, conn: BaseDatabaseWrapper, bound_ms: int) -> int | None:
        # SQLite runs in this process: there is no session to end and no server-side bound.
        # A handler's own COMMIT or ROLLBACK is refused while the batch runs.
        conn.ensure_connection()
        conn.connection.set_authorizer(_refuse_transaction_control)
        return None

    def close_batch(self, conn: BaseDatabaseWrapper) -> bool:
        raw = conn.connection
        if raw is None:
            return False
        raw.set_authorizer(None)
        return bool(raw.in_transaction)

    def abandon_batch(self, conn: BaseDatabaseWrapper) -> None:
        if not self.connection_lost(conn):
            conn.connection.set_authorizer(None)

    def execute(
        self,
        conn: BaseDatabaseWrapper,
        sql: str,
        params: Params,
        *,
        prepare: bool = False,
        reuse_plan: bool = True,
    ) -> tuple[Rows, int]:
        # A write outside a transaction (a lease renewal) takes the write gate for its statement;
        # one inside a transaction has it from BEGIN (sqlite_gate).
        gate = gate_of(conn)
        if gate is None or gate.held or conn.in_atomic_block or not conn.get_autocommit():
            return super().execute(conn, sql, params)
        if sql.lstrip()[:6].upper() == "SELECT" or conn.connection.in_transaction:
            return super().execute(conn, sql, params)
        gate.enter()
        try:
            return super().execute(conn, sql, params)
        finally:
            gate.leave()

    def token(self, value: Any) -> Any:
        return value.hex  # Django stores UUIDs on SQLite as 32 hex digits

    def transition(self, conn: BaseDatabaseWrapper, move: Move) -> Rows:
        # The audit rows: derived from each moved row's edge here, then one INSERT of them all.
        name = move.name
        full = self.sql[name]
        gate_of(conn)  # before BEGIN, so that this transaction waits its turn (sqlite_gate)
        with transaction.atomic(using=conn.alias):
            conn.__dict__[MOVED_FROM] = time.monotonic()  # the write lock is this transaction's now
            rows, _ = self.execute(conn, full, move.params)
            if rows:
                # id, message_id, status, attempts, updated_at, from_status, reason, detail, ...,
                # created_at: the edge's source and reason as the declaration's RETURNING columns
                # computed them.
                audit = [
                    audit_row(Edge(r[5], r[2], r[6]), r[0], r[3], r[4], move.actor, r[7], r[10]) for r in rows
                ]
                self.execute(conn, self.sql["AUDIT_ROWS"], {"rows": json.dumps(audit, default=str)})
                if move.promote:
                    keys = {(r[8], r[9]) for r in rows if r[9] and r[2] in FINISHED}
                    if keys:
                        q, k = zip(*sorted(keys), strict=True)
                        self.execute(conn, self.sql["PROMOTE"], self.batch(q=q, k=k))
        picks = self.picks[name]
        if picks is not None:
            rows = [tuple(r[i] for i in picks) for r in rows]
        return rows

    def transition_texts(self, name: str) -> dict[str, str]:
        # As written: the audit rows' one INSERT and the promotion are statements of their own.
        return {name: self.sql[name]}
