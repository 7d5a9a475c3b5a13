"""One engine per database: how the named statements are run and audited.

:class:`Engine` reads every statement of the catalogue (:mod:`.statements`: its ``.sql`` files)
as its subclass's database (:class:`~.postgres.PostgresEngine`, :class:`~.sqlite.SqliteEngine`)
spells it, and runs them on Django's connection (same transaction, same error wrapping).
Nothing outside the engines knows which database it talks to.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar, NamedTuple

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.dateparse import parse_datetime

from . import statements
from .catalogue import Catalogue
from .statements_moves import MOVED_NAMES, Moving

#: Set on a connection by :meth:`Engine.transition`: the monotonic time just before its moving
#: statement was sent, every lock the engine takes for it held (SQLite's whole-database write lock
#: is taken when the transaction begins, and waiting for it can take seconds). The statement's
#: clock reads no earlier, so a lease it sets lasts at least ACK_TIMEOUT from then.
MOVED_FROM = "_zeroloss_moved_from"

Rows = list[tuple[Any, ...]]
#: A statement's parameters: named (``%(name)s``, every statement of a ``.sql`` catalogue) or
#: positional (``%s``: the partition DDL, statements_partitions).
Params = Sequence[Any] | Mapping[str, Any]


@functools.lru_cache(maxsize=64)
def from_epoch(value: float) -> dt.datetime:
    """Epoch seconds (how PostgreSQL statements hand back their times) as an aware UTC datetime."""
    # Cached: a claim's rows share one expiry, converted once.
    return dt.datetime.fromtimestamp(value, dt.UTC)


class Move(NamedTuple):
    """One run of a moving statement of the catalogue (see :meth:`Engine.transition`): its
    declaration (``statements.MOVES[name]``) says everything else.

    A named tuple: one is built for every transition, and a frozen dataclass took about 1.5 us
    of client CPU to build (measured)."""

    name: str
    #: Its named parameters (the engine adds ``actor``).
    params: Mapping[str, Any]
    actor: str
    #: When a message of an ordering key finished (completed, dead or cancelled), release the
    #: next one of its key in the same transaction.
    promote: bool = False
    #: A hot path: run on the connection's reused psycopg cursor, prepared once (PostgreSQL).
    prepare: bool = True


class Engine:
    """The statements of one database, rendered, and how to run them."""

    vendor: ClassVar[str]
    #: Whether a claim locks the rows it chooses (PostgreSQL, ``FOR UPDATE SKIP LOCKED``); False
    #: where a claim locks by writing (SQLite: one writer at a time).
    locks_rows: ClassVar[bool] = False
    #: Batches of at least this many messages are stored through ``copy_in`` (``INSERT_STAGED``);
    #: 0: never (they go as batches of ``INSERT_MANY``).
    stage_from: ClassVar[int] = 0
    #: Whether its indexes keep the dead versions of rows a claim or sweep moved until nothing
    #: holds the xmin horizon (PostgreSQL): claims and sweeps then resume where the previous one
    #: ended rather than read every such version from the head.
    keeps_dead_index_entries: ClassVar[bool] = False
    #: Whether a write takes the whole database's one write lock (SQLite): the sweep then looks
    #: for work with a read first, and transactions must take the lock when they begin (or
    #: concurrent workers fail with "database is locked").
    single_writer: ClassVar[bool] = False
    #: Whether a move and its audit rows are one statement (PostgreSQL's CTE), atomic without a
    #: transaction around it; otherwise :meth:`transition` opens one.
    moves_in_one_statement: ClassVar[bool] = False
    #: Whether its message and audit tables may be range-partitioned by period (PostgreSQL;
    #: :mod:`.partitions`): partitions created ahead, whole periods dropped by the purge.
    partitions_by_period: ClassVar[bool] = False
    #: Whether a claim by queue runs in a transaction that first sets how it is planned
    #: (statements.PLAN_CLAIM; PostgreSQL).
    plans_claims: ClassVar[bool] = False

    def __init__(self) -> None:
        #: Every statement of the catalogue, as this database runs it, by name.
        self.sql: dict[str, str] = {}
        for catalogue in statements.WHOLE:
            self.sql.update(catalogue.texts(self.vendor))
        #: The names of :attr:`sql`: every one is read whole from a ``.sql`` catalogue.
        self.whole: set[str] = set(self.sql)
        #: Each moving statement's declaration; its text spells the RETURNING columns the
        #: declaration derives (``Moving.returning_sql``; a test keeps them equal).
        self.moves: dict[str, Moving] = statements.MOVES
        unwritten = set(self.moves) - self.whole
        if unwritten:
            raise LookupError(
                f"moving statements missing from the catalogue ({self.vendor}): {sorted(unwritten)}"
            )
        #: The positions of each declaration's ``result`` columns in its RETURNING columns.
        self.picks: dict[str, tuple[int, ...] | None] = {}
        for name, m in self.moves.items():
            names = [*MOVED_NAMES, *m.returning]
            self.picks[name] = None if m.result is None else tuple(names.index(c) for c in m.result)
        self.planned_per_call = statements.PLANNED_PER_CALL
        #: Moving statements written whole with their audit rows too (PostgreSQL's persisting
        #: statements, which open with CTEs of their own): run as written.
        self.complete = {name for name in self.moves if self.sql[name].startswith("WITH ")}
        self._composed: dict[tuple[Any, ...], str] = {}

    # -- spelled per database -----------------------------------------------------------

    def column(self, values: Iterable[Any]) -> Any:
        """A batch's column as one named parameter of a whole statement: an array PostgreSQL
        unnests (``unnest(%(ids)s::bigint[])``), a JSON array SQLite reads (``json_each``)."""
        raise NotImplementedError

    def batch(self, **columns: Sequence[Any]) -> dict[str, Any]:
        """A batch of rows as named parameters of a whole statement, one sequence per column
        (equal lengths): one array per column (PostgreSQL, ``unnest(%(name)s::text[], ...)``),
        or one JSON array of rows, each an object of its columns (SQLite,
        ``json_each(%(rows)s)``)."""
        raise NotImplementedError

    def token(self, value: uuid.UUID) -> Any:
        return value

    def period(self, created: Sequence[dt.datetime | None]) -> dict[str, Any]:
        """The bound of a lease holder's batch statement to its leases' creation times, as the
        statement names it (``created_from``; none where nothing is partitioned)."""
        return {}

    def session_of(self, conn: BaseDatabaseWrapper) -> int | None:
        """An id of the server session behind ``conn`` (None where a lost statement cannot
        outlive its client, as with SQLite, which runs in the client)."""
        return None

    def end_session(self, conn: BaseDatabaseWrapper, session: int, timeout: float = 30.0) -> bool:
        """End a session of ours the client lost, and wait until nothing of it can still commit."""
        return True

    def open_batch(self, conn: BaseDatabaseWrapper, bound_ms: int) -> int | None:
        """Begin a transactional batch inside the caller's transaction; its server session's id
        (for a watchdog that ends it), or None where the client is the database (SQLite).

        ``bound_ms`` (0: none) bounds, on the server, how long the batch's transaction may stay
        idle or run one statement, so that a stalled worker cannot hold it for ever."""
        return None

    def close_batch(self, conn: BaseDatabaseWrapper) -> bool:
        """Authorise the batch's commit; False when a handler already ended the batch's
        transaction (a raw COMMIT or ROLLBACK), so that what follows runs in another one."""
        raw = conn.connection
        return raw is not None and bool(getattr(raw, "in_transaction", True))

    def bound_transaction(self, conn: BaseDatabaseWrapper, seconds: float) -> None:
        """Inside a transaction of zeroloss's own: the server ends it if it stays idle longer
        than ``seconds`` (a worker frozen between two of its statements). SQLite: nothing to
        bound, the transaction lives in this process."""

    def abandon_batch(self, conn: BaseDatabaseWrapper) -> None:
        """The batch is rolling back: undo what :meth:`open_batch` set on the client."""

    def in_batch_transaction(self, conn: BaseDatabaseWrapper) -> bool:
        """After a handler returned: whether the batch's transaction is visibly still open
        (a cheap client-side look; :meth:`close_batch` is the server's word)."""
        raw = conn.connection
        return raw is not None and bool(getattr(raw, "in_transaction", True))

    def connection_lost(self, conn: BaseDatabaseWrapper) -> bool:
        """Whether ``conn``'s link to the server is broken, or the connection was closed (SQLite
        runs in the client: only by closing it)."""
        return conn.connection is None or conn.closed_in_transaction

    def transaction_failed(self, conn: BaseDatabaseWrapper) -> bool:
        """Whether ``conn``'s transaction met an error and accepts nothing but a rollback
        (SQLite has no such state: a failed statement leaves its transaction usable)."""
        return False

    def execute(
        self,
        conn: BaseDatabaseWrapper,
        sql: str,
        params: Params,
        *,
        prepare: bool = False,
        reuse_plan: bool = True,
    ) -> tuple[Rows, int]:
        """Run one statement; its rows (if any) and its row count."""
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return (list(cursor.fetchall()) if cursor.description else []), cursor.rowcount

    def wake(self, conn: BaseDatabaseWrapper, queues: Sequence[str]) -> None:
        """Tell idle workers of these queues, at commit, that messages became claimable."""

    def copy_in(self, conn: BaseDatabaseWrapper, sql: str, chunks: Iterable[str]) -> None:
        """Run ``COPY ... FROM STDIN`` with rows in its text format, in the current transaction."""
        raise NotImplementedError

    def transition(self, conn: BaseDatabaseWrapper, move: Move) -> Rows:
        """Run one moving statement and write one audit row per message it moved, atomically."""
        raise NotImplementedError

    def transition_texts(self, name: str) -> dict[str, str]:
        """The texts :meth:`transition` runs for the moving statement ``name``, by name (a
        variant that also releases the next message of a finished key: ``NAME+PROMOTE``)."""
        raise NotImplementedError

    # -- values coming back ---------------------------------------------------------------

    @staticmethod
    def to_datetime(value: Any) -> dt.datetime | None:
        if isinstance(value, float):  # epoch seconds (see PostgresEngine)
            return from_epoch(value)
        if isinstance(value, dt.datetime):
            # SQLite hands back naive UTC datetimes; the ledger always speaks aware UTC.
            return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        if value is None:
            return None
        parsed = parse_datetime(str(value))
        if parsed is None:
            raise ValueError(f"not a datetime: {value!r}")
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)

    @classmethod
    def at(cls, value: Any) -> dt.datetime:
        """A non-null database timestamp as an aware UTC datetime."""
        parsed = cls.to_datetime(value)
        if parsed is None:
            raise ValueError("expected a timestamp, got NULL")
        return parsed

    @staticmethod
    def to_uuid(value: Any) -> uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))

    @staticmethod
    def to_json(value: Any) -> Any:
        return json.loads(value) if isinstance(value, str | bytes) else value

    # -- shared helpers -------------------------------------------------------------------

    def composed(self, key: tuple[Any, ...], build: Any) -> str:
        """Memoised SQL text built from a statement (the text stays identical, so prepared once)."""
        sql = self._composed.get(key)
        if sql is None:
            sql = self._composed[key] = build()
        return sql

    # -- the other areas' catalogues, and what a database can do --------------------------

    def catalogue(self, module: ModuleType) -> dict[str, str]:
        """An area's statement catalogue (a module with a ``CATALOGUE``: its ``.sql`` file), as this
        database runs it."""
        cache: dict[str, dict[str, str]] = self.__dict__.setdefault("_catalogues", {})
        texts = cache.get(module.__name__)
        if texts is None:
            whole: Catalogue = module.CATALOGUE
            texts = cache[module.__name__] = whole.texts(self.vendor)
        return texts

    def run(
        self, conn: BaseDatabaseWrapper, module: ModuleType, name: str, params: Params = ()
    ) -> tuple[Rows, int]:
        """Run the named statement of an area's catalogue; its rows (if any) and its row count."""
        return self.execute(
            conn, self.catalogue(module)[name], params if isinstance(params, Mapping) else list(params)
        )

    #: Whether it can keep synchronous replicas (``REPLICATION_FACTOR`` above 1) and has
    #: standbys to discover.
    supports_replication: ClassVar[bool] = False
    #: Whether it keeps planner statistics that estimate a table's rows and a column's values
    #: (the admin's and the snapshot's cheap counts).
    has_statistics: ClassVar[bool] = False
    #: Whether it can wake idle workers at commit (``LISTEN``/``NOTIFY``).
    has_listen_notify: ClassVar[bool] = False
    #: Whether the database is a server apart from this process (its own settings, sessions
    #: with TCP keepalives, poolers in between); False: it runs inside this process.
    is_server: ClassVar[bool] = False
