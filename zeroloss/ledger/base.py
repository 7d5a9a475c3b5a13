"""What every part of the ledger shares: one :class:`LedgerContext` (settings, the connection, its
engine, how to move rows, and the sibling parts), and :class:`Part`, the base each part is built on."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..core import settings as conf
from ..core.settings_delivery import RetryBackoff
from ..core.states import Status
from ..exceptions import InvalidLeaseToken, InvalidMessage
from . import events, statements, statements_partitions
from .catalogue import package_catalogues
from .engine import Engine, Move, Params, Rows
from .postgres import PostgresEngine
from .sqlite import SqliteEngine
from .statements_moves import MOVED_NAMES
from .validation import default_instance_id, validate_message_id

if TYPE_CHECKING:
    from .aborts import Aborts
    from .control import Control
    from .dispatch import Dispatch
    from .integrity import Reads
    from .keys import Keys
    from .leases import Leases
    from .nodes import Nodes
    from .operator import Operator
    from .outcomes import Outcomes
    from .persist import Store
    from .sweep import Recovery
    from .workflows import Workflows

logger = logging.getLogger("zeroloss")

_ENGINES: dict[str, Engine] = {"postgresql": PostgresEngine(), "sqlite": SqliteEngine()}


def engine_for(connection: BaseDatabaseWrapper) -> Engine:
    """The engine of a Django connection's database (PostgreSQL or SQLite)."""
    engine = _ENGINES.get(connection.vendor)
    if engine is None:
        raise ImproperlyConfigured(
            f"zeroloss supports PostgreSQL and SQLite; database {connection.alias!r} is {connection.vendor}."
        )
    return engine


#: How a statement of a template catalogue begins (its other named strings are fragments).
_STATEMENT_VERBS = frozenset(
    {
        "SELECT",
        "WITH",
        "INSERT",
        "UPDATE",
        "DELETE",
        "COPY",
        "CREATE",
        "DROP",
        "ALTER",
        "SET",
        "LOCK",
        "ANALYZE",
    }
)


def _is_statement(text: str) -> bool:
    words = text.split(None, 1)
    return bool(words) and words[0] in _STATEMENT_VERBS


def all_statements() -> Iterator[tuple[str, str, str]]:
    """Every statement the package runs, as each database runs it: ``(name, dialect, text)``.

    The whole statements of every ``.sql`` catalogue (:mod:`.catalogue`); the templates of
    :mod:`.statements` as each engine renders them, a moving statement as its transition runs
    it (PostgreSQL: its audit rows' CTE included, and a variant ``NAME+PROMOTE`` that also
    releases the next message of each key it finished); and PostgreSQL's partition DDL
    (:mod:`.statements_partitions`), as written: its identifiers are filled in per call.
    """
    for catalogue in package_catalogues():
        # A moving statement: as its transition runs it, below.
        yield from (statement for statement in catalogue if statement[0] not in statements.MOVES)
    for dialect, engine in _ENGINES.items():
        for name, text in engine.sql.items():
            if name in engine.moves:
                for run_name, run_text in engine.transition_texts(name).items():
                    yield run_name, dialect, run_text
            elif name not in engine.whole and _is_statement(text):
                yield name, dialect, text
    for name, template in vars(statements_partitions).items():
        if name.isupper() and isinstance(template, str) and _is_statement(template):
            yield name, "postgresql", template


class LedgerContext:
    """What the parts of one service share: its settings, database alias and instance id, how to
    run and move rows, and each sibling part (``ctx.operator.dead_letter(...)``: a part reaches
    another only through here, by its public methods).

    Cheap to construct; holds no message state (the database holds all of it). Keyword
    arguments override ``ZEROLOSS`` settings, by lower-case name (``ack_timeout=0.5``).
    """

    #: The service that composes the parts (zeroloss.ledger.service): the hooks' argument, and whose
    #: class sends the events' signals.
    service: Any
    # The parts, set by that service.
    store: Store
    leases: Leases
    outcomes: Outcomes
    aborts: Aborts
    control: Control
    recovery: Recovery
    operator: Operator
    keys: Keys
    dispatch: Dispatch
    reads: Reads
    nodes: Nodes
    workflows: Workflows

    def __init__(self, *, using: str = DEFAULT_DB_ALIAS, instance_id: str | None = None, **overrides: Any):
        if overrides:
            raw = dict(getattr(django_settings, "ZEROLOSS", None) or {})
            for name, value in overrides.items():
                if isinstance(value, RetryBackoff):
                    value = {"BASE": value.BASE, "MAX": value.MAX, "JITTER": value.JITTER}
                raw[name.upper()] = value
            self.settings = conf.parse_settings(raw)
        else:
            self.settings = conf.get_settings()
        if using not in connections.databases:
            raise InvalidMessage(
                f"Unknown database alias {using!r}; DATABASES has {', '.join(connections.databases)}."
            )
        self.using = using
        self.instance_id = (
            validate_message_id(instance_id, "instance_id") if instance_id else default_instance_id()
        )

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.using]

    @property
    def engine(self) -> Engine:
        return engine_for(self.connection)

    def run(self, name: str, params: Params, *, prepare: bool = False) -> tuple[Rows, int]:
        """Run the named statement (see :mod:`.statements`)."""
        engine = self.engine
        return engine.execute(
            self.connection,
            engine.sql[name],
            params,
            prepare=prepare and self.settings.PREPARED_STATEMENTS,
            reuse_plan=name not in statements.PLANNED_PER_CALL,
        )

    def move(
        self,
        name: str,
        params: Mapping[str, Any],
        *,
        detail: str = "",
        actor: str | None = None,
        keyed: bool = True,
        conn: BaseDatabaseWrapper | None = None,
    ) -> Rows:
        """Run the named moving statement with its audit rows; returns the moved rows.

        What it moves, from which status and why is its declaration's (``statements.MOVES``).
        ``detail``: the audit detail, for a statement whose declaration takes it as a parameter.
        ``keyed=False``: none of the moved messages has an ordering key (no promotion to run).
        ``conn``: the caller's lookup of :attr:`connection`, when it has one.
        """
        if actor is not None and actor != self.instance_id:  # the instance id was checked once
            validate_message_id(actor, "actor")
        conn = self.connection if conn is None else conn
        engine = engine_for(conn)
        declared = engine.moves[name]
        if declared.takes_detail:
            params = {**params, "detail": detail}
        rows = engine.transition(
            conn,
            Move(
                name,
                params,
                actor or self.instance_id,
                keyed and declared.finishes,
                declared.prepare and self.settings.PREPARED_STATEMENTS,
            ),
        )
        if rows and declared.wakes and declared.result is None and engine.has_listen_notify:
            # Back to pending (claimable now, or at its retry's time): idle workers sleep until
            # told (zeroloss.runtime.wakeup), so tell their queues, at this statement's commit.
            status, queue = MOVED_NAMES.index("status"), MOVED_NAMES.index("queue_name")
            queues = sorted({r[queue] for r in rows if r[status] == Status.PENDING.value})
            if queues:
                engine.wake(conn, queues)
        return rows

    def promote_keys(self, keys: Iterable[tuple[str, str]]) -> list[str]:
        """Make the next message of each ``(queue, ordering_key)`` claimable if the key has no head.

        Runs after every commit that may leave a key without one; safe to run any time and from
        anywhere (the database allows one head per key). Returns the ids made claimable.
        """
        pairs = sorted(set(keys))
        if not pairs:
            return []
        queues, names = zip(*pairs, strict=True)
        try:
            with transaction.atomic(using=self.using):
                rows, _ = self.run("PROMOTE", self.engine.batch(q=queues, k=names))
        except IntegrityError:
            # A concurrent promotion of the same key won: the key has its head.
            return []
        return [r[0] for r in rows]

    def token(self, lease_token: Any) -> Any:
        """A lease token as the engine stores it; :class:`InvalidLeaseToken` if it is no UUID."""
        if not isinstance(lease_token, uuid.UUID):
            try:
                lease_token = uuid.UUID(str(lease_token))
            except (ValueError, TypeError, AttributeError) as exc:
                raise InvalidLeaseToken(f"Lease token must be a UUID, got {lease_token!r}.") from exc
        return self.engine.token(lease_token)

    def after_commit(self, action: Callable[[], Any]) -> None:
        """Run ``action`` once the current transaction commits (at once outside one)."""
        if self.connection.in_atomic_block:
            transaction.on_commit(action, using=self.using)
        else:
            action()

    def emit(self, found: Sequence[events.Event]) -> None:
        """Publish ``found`` (:mod:`.events`) once the current transaction commits (at once
        outside one): never for a rollback."""
        if found:
            sender = type(self.service)
            self.after_commit(lambda: events.publish(sender, found))

    def promote_after_commit(self, keys: set[tuple[str, str]], message_ids: Sequence[str]) -> None:
        """Release the next message of each key once the current transaction commits.

        What committed (``message_ids``, the caller's rows) stays committed whatever happens
        here, so a failure is logged, never raised: a sender told "failed" would retry, and
        with a random id store a second message. The sweep's key repair (``REPAIR_KEYS``)
        releases a key whose promotion was lost (docs/ordering.md).
        """

        def promote() -> None:
            try:
                self.promote_keys(keys)
            except DatabaseError as exc:
                shown = ", ".join(repr(m) for m in message_ids[:5])
                more = f" and {len(message_ids) - 5} more" if len(message_ids) > 5 else ""
                logger.warning(
                    "message %s%s committed, but releasing the next message of its ordering key failed "
                    "(%s: %s); the sweep's key repair releases it",
                    shown,
                    more,
                    type(exc).__name__,
                    " ".join(str(exc).split()),
                )
                conn = self.connection
                if not conn.in_atomic_block and self.engine.connection_lost(conn):
                    conn.close()  # the caller's next query reconnects

        self.after_commit(promote)

    def database_now(self) -> dt.datetime:
        """The database clock, which decides every lease."""
        rows, _ = self.run("NOW", {}, prepare=True)
        return self.engine.at(rows[0][0])


class Part:
    """One part of the ledger: a plain class over the service's :class:`LedgerContext`.

    The short names below only delegate to the context, so each part's methods read as they
    did when the parts were one class; a part calls a sibling as ``self.ctx.<part>.<method>``.
    """

    def __init__(self, ctx: LedgerContext):
        self.ctx = ctx
        # Fixed for the service's life: copied, so the hot paths read an attribute, not a property.
        self.settings = ctx.settings
        self.using = ctx.using
        self.instance_id = ctx.instance_id
        self._run = ctx.run
        self._move = ctx.move
        self._token = ctx.token
        self._after_commit = ctx.after_commit
        self._promote_after_commit = ctx.promote_after_commit
        self.promote_keys = ctx.promote_keys
        self.database_now = ctx.database_now

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.using]

    @property
    def engine(self) -> Engine:
        return engine_for(connections[self.using])
