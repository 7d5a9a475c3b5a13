"""The PostgreSQL engine: data-modifying CTEs, ``unnest`` batches, prepared hot paths, NOTIFY."""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from django.db import InternalError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from .engine import MOVED_FROM, Engine, Move, Params, Rows, from_epoch

# Timestamps handed back as epoch seconds: a float loads far cheaper than a timestamptz through
# Django's time-zone-aware loader (measured: 15% of a no-op worker's time went there).
_EPOCH = {
    name: f"extract(epoch FROM {name})::float8"
    for name in ("lease_expires_at", "updated_at", "available_at", "created_at")
}
#: How far :meth:`PostgresEngine.period` widens its bound (epoch seconds are floats).
_PERIOD_SLACK = dt.timedelta(milliseconds=1)
# libpq's PGRES_TUPLES_OK (psycopg.pq.ExecStatus.TUPLES_OK; psycopg is imported only when used).
_TUPLES_OK = 2
#: SQLSTATE read_only_sql_transaction: a hot standby, or ``default_transaction_read_only``.
_READ_ONLY = "25006"


def _refused_write(exc: InternalError) -> NoReturn:
    """Raise ``exc``; a server that takes no writes as the ``OperationalError`` documented for a
    database that cannot take a message (docs/guarantees.md), not psycopg's InternalError: the
    loops' outage handling reconnects on it, which after a failover reaches the new primary."""
    if getattr(exc.__cause__, "sqlstate", None) == _READ_ONLY:
        raise OperationalError(
            f"the database is read-only (a hot standby, or default_transaction_read_only): {exc}"
        ) from exc
    raise exc


def _raise_wrapped(conn: BaseDatabaseWrapper) -> NoReturn:
    """Re-raise the exception being handled as Django's own cursor would (its classes, the
    connection marked as having failed); a refused write as :func:`_refused_write` says."""
    try:
        with conn.wrap_database_errors:
            raise
    except InternalError as exc:
        _refused_write(exc)


# libpq's CONNECTION_BAD and PQTRANS_INERROR: both drivers report libpq's own numbers
# (psycopg 3 as IntEnums, psycopg2 as ints), so neither driver is imported to read them.
_CONNECTION_BAD = 1
_TRANSACTION_INERROR = 3


@functools.cache
def _is_psycopg3() -> bool:
    """Which driver Django's PostgreSQL backend uses (it prefers psycopg 3 when both are there)."""
    # Deferred: psycopg is optional (SQLite needs no driver).
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


class _ChunkReader:
    """What psycopg2's ``copy_expert`` reads from: the chunks of COPY text, as a file."""

    def __init__(self, chunks: Iterable[str]) -> None:
        self._chunks = iter(chunks)
        self._rest = ""
        #: What the chunks raised (a bad item met mid-stream): psycopg2 reports it as
        #: QueryCanceled; the caller re-raises the original, as psycopg 3 does.
        self.error: BaseException | None = None

    def read(self, size: int = -1) -> str:
        while size < 0 or len(self._rest) < size:
            try:
                chunk = next(self._chunks, None)
            except BaseException as exc:
                self.error = exc
                raise
            if chunk is None:
                break
            self._rest += chunk
        if size < 0:
            out, self._rest = self._rest, ""
        else:
            out, self._rest = self._rest[:size], self._rest[size:]
        return out

    def readline(self, size: int = -1) -> str:
        return self.read(size)


class PostgresEngine(Engine):
    vendor = "postgresql"
    locks_rows = True
    # Below this, the unnest batch costs less than creating, filling and dropping a temporary
    # table; above it, COPY saves psycopg's array dumping (about 20 us of client CPU a message).
    stage_from = 1000
    keeps_dead_index_entries = True
    moves_in_one_statement = True
    partitions_by_period = True
    plans_claims = True

    def session_of(self, conn: BaseDatabaseWrapper) -> int | None:
        raw = conn.connection
        return None if raw is None or raw.closed else int(raw.info.backend_pid)

    def connection_lost(self, conn: BaseDatabaseWrapper) -> bool:
        raw = conn.connection
        return (
            raw is None
            or conn.closed_in_transaction
            or bool(raw.closed)
            or int(raw.info.status) == _CONNECTION_BAD
        )

    def bound_transaction(self, conn: BaseDatabaseWrapper, seconds: float) -> None:
        # Unprepared: once a transaction, and the engine does not know whether this connection
        # may prepare (PREPARED_STATEMENTS is the ledger's setting).
        self.execute(conn, self.sql["BOUND_TRANSACTION"], {"bound": str(int(seconds * 1000))})

    def open_batch(self, conn: BaseDatabaseWrapper, bound_ms: int) -> int | None:
        rows, _ = self.execute(conn, self.sql["BATCH_OPEN"], {"bound_ms": bound_ms, "bound": str(bound_ms)})
        return int(rows[0][1])

    def close_batch(self, conn: BaseDatabaseWrapper) -> bool:
        rows, _ = self.execute(conn, self.sql["BATCH_CLOSE"], {})
        return rows[0][0] is not None

    def in_batch_transaction(self, conn: BaseDatabaseWrapper) -> bool:
        raw = conn.connection
        # libpq's PQTRANS_IDLE (0), as psycopg and psycopg2 both report it: no transaction open.
        return raw is not None and int(raw.info.transaction_status) != 0

    def transaction_failed(self, conn: BaseDatabaseWrapper) -> bool:
        raw = conn.connection
        return raw is not None and int(raw.info.transaction_status) == _TRANSACTION_INERROR

    def end_session(self, conn: BaseDatabaseWrapper, session: int, timeout: float = 30.0) -> bool:

        if session == self.session_of(conn):
            return True
        self.execute(conn, self.sql["END_SESSION"], {"pid": session})
        deadline = time.monotonic() + timeout
        while self.execute(conn, self.sql["SESSION_ALIVE"], {"pid": session})[0][0][0]:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def period(self, created: Sequence[dt.datetime | None]) -> dict[str, Any]:
        # ``created_from``: a lower bound alone (sql/outcomes.sql). With an upper one too, a
        # partition whose statistics predate its rows (a backlog sent since its last ANALYZE)
        # takes the pair for a narrow range and ANDs its creation-time index, every row of the
        # day, into each batch's lookup.
        if not created or any(at is None for at in created):
            return {"created_from": "-infinity"}
        # The UTC day of the batch's earliest message: the earlier periods' partitions are
        # pruned when the statement is planned. Not the batch's own span, nor an upper bound:
        # without statistics PostgreSQL takes any range of both bounds for a narrow one
        # (DEFAULT_RANGE_INEQ_SEL) and ANDs the creation-time index into the lookup: each
        # acknowledgement of 100 on a backlog sent since the partition's last ANALYZE read the
        # day's every row from it (measured: 50,100 index entries, 6.6 ms of server CPU against
        # 3.7 ms bounded below only). The periods to come are not pruned: PARTITIONS_AHEAD
        # empty ones. A millisecond of slack: the claim handed the times back as epoch seconds.
        first = (min(at for at in created if at is not None) - _PERIOD_SLACK).astimezone(dt.UTC)
        return {"created_from": dt.datetime.combine(first.date(), dt.time(), dt.UTC)}

    def column(self, values: Iterable[Any]) -> Any:
        return list(values)

    def batch(self, **columns: Sequence[Any]) -> dict[str, Any]:
        return {name: list(values) for name, values in columns.items()}

    def execute(
        self,
        conn: BaseDatabaseWrapper,
        sql: str,
        params: Params,
        *,
        prepare: bool = False,
        reuse_plan: bool = True,
    ) -> tuple[Rows, int]:
        """Hot paths run prepared on one reused psycopg cursor of Django's own connection.

        Django disables psycopg's prepared statements; zeroloss prepares its own fixed-shape
        statements once per connection. With ``reuse_plan=False`` the statement takes the same
        cursor unprepared: PostgreSQL plans it for this call's parameters. They still pass through Django's
        ``connection.execute_wrappers`` (APM and query-inspection hooks), and while Django logs
        queries (``DEBUG``, ``CaptureQueriesContext``) they take Django's logging cursor.
        """
        if not prepare or conn.queries_logged or not _is_psycopg3():
            # psycopg2 cannot prepare a statement: Django's own cursor, planned per call.
            try:
                return super().execute(conn, sql, params)
            except InternalError as exc:
                _refused_write(exc)
        raw = conn.connection
        if raw is None:
            conn.ensure_connection()
            raw = conn.connection
        if conn.in_atomic_block:
            conn.validate_no_broken_transaction()
        # One cursor per connection, reused: a new cursor starts with empty adapter caches
        # (about 40 us of client CPU per statement, measured). Kept on Django's per-thread
        # connection wrapper, with the connection it belongs to, and replaced when that
        # reconnects. Nothing else sees it, so nothing else closes it.
        held = conn.__dict__.get("_zeroloss_cursor")
        if held is not None and held[0] is raw:
            cur = held[1]
        else:
            if raw.prepare_threshold is None:
                # Django sets the threshold to None, which also turns off explicit
                # prepare=True. A threshold no query reaches re-enables them for these calls only.
                raw.prepare_threshold = 2**31 - 1
            import psycopg  # deferred: psycopg is optional (SQLite needs no driver)

            cur = psycopg.Cursor(raw)
            conn.__dict__["_zeroloss_cursor"] = (raw, cur)
        wrappers = conn.execute_wrappers
        try:
            if wrappers:

                def run(sql: str, params: Params, many: bool, context: dict[str, Any]) -> None:
                    cur.execute(sql, params, prepare=reuse_plan)

                executor: Any = run
                for wrapper in reversed(wrappers):
                    executor = functools.partial(wrapper, executor)
                executor(sql, params, False, {"connection": conn, "cursor": cur})
            else:
                cur.execute(sql, params, prepare=reuse_plan)
            # The result's status, not cur.description: that builds a Column object per
            # column on every call (about 1 us each, measured).
            res = cur.pgresult
            return (cur.fetchall() if res is not None and res.status == _TUPLES_OK else []), cur.rowcount
        except Exception:
            # Django's error wrapping (its exception classes, the connection marked as having
            # failed), entered only on the way out of a failure: the same as a ``with`` around
            # the block, without its two calls on every statement.
            _raise_wrapped(conn)

    @classmethod
    def at(cls, value: Any) -> dt.datetime:
        # Every statement here hands its times back as epoch seconds: the common case first.
        return from_epoch(value) if value.__class__ is float else super().at(value)

    def wake(self, conn: BaseDatabaseWrapper, queues: Sequence[str]) -> None:
        self.execute(conn, self.sql["WAKE"], {"queues": list(queues)})

    def copy_in(self, conn: BaseDatabaseWrapper, sql: str, chunks: Iterable[str]) -> None:
        # Django's cursor cannot COPY: psycopg's own, on the same connection and transaction.
        # Django's execute_wrappers do not see it (they wrap execute() calls only).
        conn.ensure_connection()
        if conn.in_atomic_block:
            conn.validate_no_broken_transaction()
        if not _is_psycopg3():
            # psycopg2 streams COPY from a file object: the same rows, read from the chunks.
            reader = _ChunkReader(chunks)
            try:
                with conn.wrap_database_errors, conn.connection.cursor() as cur:
                    cur.copy_expert(sql, reader)
            except InternalError as exc:
                _refused_write(exc)
            except Exception:
                if reader.error is not None:
                    raise reader.error from None
                raise
            return
        try:
            with conn.wrap_database_errors, conn.connection.cursor() as cur, cur.copy(sql) as copy:
                for chunk in chunks:
                    copy.write(chunk)
        except InternalError as exc:
            _refused_write(exc)

    def transition(self, conn: BaseDatabaseWrapper, move: Move) -> Rows:
        # The audit rows: one CTE inserting them from the moved rows (audit_wrapper).
        key = (move.name, move.promote)
        full = self._composed.get(key) or self.composed(
            key, lambda: self.audit_wrapper(move.name, move.promote)
        )
        conn.__dict__[MOVED_FROM] = time.monotonic()
        params = move.params
        rows, _ = self.execute(
            conn,
            full,
            {**params, "actor": move.actor},
            prepare=move.prepare,
            reuse_plan=move.name not in self.planned_per_call,
        )
        return rows

    def transition_texts(self, name: str) -> dict[str, str]:
        texts = {name: self.audit_wrapper(name, False)}
        if self.moves[name].finishes:
            texts[f"{name}+PROMOTE"] = self.audit_wrapper(name, True)
        return texts

    def audit_tail(self, name: str, promote: bool = False) -> str:
        """What follows the moved rows ``t`` in a moving statement as it runs: the CTE of their
        audit rows (``ev``), the release of a finished key's next message (``promote``: the
        catalogue's PROMOTE_FINISHED), and the columns handed back (times as epoch seconds)."""
        result = self.moves[name].result
        returned = ", ".join(_EPOCH.get(c, c) for c in result) if result else "*"
        promoted = f", {self.sql['PROMOTE_FINISHED']}" if promote else ""
        return f"ev AS ({self.sql['AUDIT_ROWS']}){promoted} SELECT {returned} FROM t"

    def audit_wrapper(self, name: str, promote: bool) -> str:
        """The moving statement ``name`` as it runs: the one place a statement's text is composed.

        Around the catalogue's statement (the moved rows, ``t``): :meth:`audit_tail`, derived
        from its declaration in ``MOVES``. One text per statement and variant, built once and
        kept (``composed``): written whole, the wrappers would double every moving statement of
        the catalogue, and again for each that may finish a key (``NAME+PROMOTE``). A statement
        that opens with CTEs of its own (the persisting ones: their ids into the key table
        first, sql/inserts.sql) is written whole with its audit rows, and runs as written."""
        if name in self.complete:
            if promote:
                raise ValueError(f"{name} is written with its audit rows: it has no +PROMOTE variant")
            return self.sql[name]
        return f"WITH t AS ({self.sql[name]}), {self.audit_tail(name, promote)}"

    # -- what this database can do (see Engine) -------------------------------------------

    supports_replication = True
    has_statistics = True
    has_listen_notify = True
    is_server = True
