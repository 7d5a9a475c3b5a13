"""Wake idle workers the moment a message becomes claimable (PostgreSQL LISTEN/NOTIFY).

Inserts, promotions of an ordering key's next message and requeues send
``NOTIFY zeroloss_wakeup, '<queue>'`` in their own statement (delivered at commit); so do the
moves that put a message back to pending (a release, a failure's retry, the sweep's requeue, an
operator's requeue or redrive) and a change of a database schedule (:data:`SCHEDULES`). A
worker process keeps one extra connection that LISTENs and wakes its idle threads. While it
listens, an idle worker costs the database nothing: its threads sleep until a wake-up or the
earliest ``available_at`` of their queues, and look again at most every :data:`IDLE_POLL`
seconds. Polling every ``poll_interval`` remains the fallback (SQLite, a lost listener
connection, a pooler in transaction mode).
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from ..core.outage import Backoff, OutageMonitor
from ..ledger import statements_ops
from ..ledger.base import engine_for

logger = logging.getLogger("zeroloss")

#: The payload a change of the database schedules sends on the wake-up channel (never a queue
#: name: those have no ``*``): running schedulers read them again at once.
SCHEDULES = "*schedules"
#: Longest an idle, listening worker goes without a look at the ledger (a safety net: whatever
#: became available without a wake-up, e.g. a row changed by hand in SQL).
IDLE_POLL = 30.0


class Wakeup:
    def __init__(self, using: str, queues: Iterable[str], *, listen: bool = True) -> None:
        self.using = using
        self.queues = set(queues)
        #: Set by every wake-up (kept for callers that wait on it directly).
        self.event = threading.Event()
        #: Counts wake-ups: a thread notes it before it looks at the ledger and then waits for it
        #: to change, so no wake-up between its look and its wait is lost (each thread its own).
        self._count = 0
        self._changed = threading.Condition()
        #: Set when database schedules changed (or the listener reconnected): the scheduler reads them.
        self.schedules_changed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()
        self.enabled = listen

    @property
    def listens(self) -> bool:
        """Whether :meth:`listen` has anything to do (enabled, on PostgreSQL)."""
        return self.enabled and engine_for(connections[self.using]).has_listen_notify

    @property
    def _listen_sql(self) -> str:
        return engine_for(connections[self.using]).catalogue(statements_ops)["LISTEN"]

    def start(self) -> Wakeup:
        """Run :meth:`listen` on a thread of its own (outside a worker's supervisor)."""
        if self.listens:
            self._thread = threading.Thread(target=self.listen, name="zeroloss-listener", daemon=True)
            self._thread.start()
        return self

    def wake(self) -> None:
        """Wake every idle thread (a notification, a reconnection, the worker stopping)."""
        with self._changed:
            self._count += 1
            self._changed.notify_all()
        self.event.set()

    def seen(self) -> int:
        """The wake-ups so far: pass it to :meth:`wait` to miss none that comes after."""
        with self._changed:
            return self._count

    def wait(self, timeout: float, since: int | None = None) -> bool:
        """Sleep up to ``timeout`` seconds or until a wake-up after ``since`` (:meth:`seen`;
        None: one from now on). True if woken."""
        with self._changed:
            mark = self._count if since is None else since
            woke = self._changed.wait_for(lambda: self._count != mark, timeout)
        self.event.clear()
        return woke

    def listen(self) -> None:
        """LISTEN until stopped, reconnecting after a backoff when the connection fails."""
        # Deferred: psycopg is optional (SQLite needs no driver).
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        params = connections[self.using].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        monitor = OutageMonitor.for_alias(self.using)
        backoff = Backoff()
        session, driver_error = (
            (self._psycopg3, _psycopg3_error()) if is_psycopg3 else (self._psycopg2, _psycopg2_error())
        )

        def listening() -> None:
            self.listening.set()
            monitor.recovered()
            backoff.reset()
            # Anything sent, or any schedule changed, while we were not listening.
            self.schedules_changed.set()
            self.wake()

        while not self._stop.is_set():
            try:
                session(params, listening)
            except Exception as exc:  # idle threads poll meanwhile; reconnect after a backoff
                self.listening.clear()
                self.wake()  # idle threads poll from now on, until the listener is back
                if not isinstance(exc, driver_error):
                    logger.warning("wake-up listener stopped (%s); polling meanwhile", exc)
                else:
                    monitor.failed("the wake-up listener", exc)
                self._stop.wait(backoff.next())

    def _psycopg3(self, params: dict[str, Any], listening: Callable[[], None]) -> None:
        import psycopg  # deferred: psycopg is optional

        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute(self._listen_sql)
            listening()
            while not self._stop.is_set():
                for note in conn.notifies(timeout=0.5):
                    self._heard(note.payload)

    def _psycopg2(self, params: dict[str, Any], listening: Callable[[], None]) -> None:

        import psycopg2  # deferred: psycopg2 is optional

        conn = psycopg2.connect(**params)
        try:
            conn.autocommit = True
            with conn.cursor() as cursor:
                cursor.execute(self._listen_sql)
            listening()
            while not self._stop.is_set():
                if select.select([conn], [], [], 0.5)[0]:
                    conn.poll()
                    while conn.notifies:
                        self._heard(conn.notifies.pop(0).payload)
        finally:
            conn.close()

    def _heard(self, payload: str) -> None:
        if payload in self.queues:
            self.wake()
        elif payload == SCHEDULES:
            self.schedules_changed.set()

    def stop(self) -> None:
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _psycopg3_error() -> type[Exception]:
    import psycopg  # deferred: psycopg is optional

    return psycopg.Error


def _psycopg2_error() -> type[Exception]:
    import psycopg2  # deferred: psycopg2 is optional

    return psycopg2.Error
