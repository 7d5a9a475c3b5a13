"""Wake idle workers the moment a message becomes claimable (PostgreSQL LISTEN/NOTIFY).

Inserts, promotions of an ordering key's next message and requeues send
``NOTIFY zeroloss_wakeup, '<queue>'`` in their own statement (delivered at commit). A worker
process keeps one extra connection that LISTENs and sets an event its idle threads wait on;
polling every ``poll_interval`` remains the fallback (SQLite, a lost listener connection, a
pooler in transaction mode, messages that become available after a backoff).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from .ledger import statements_ops
from .ledger.base import engine_for
from .outage import Backoff, OutageMonitor

logger = logging.getLogger("zeroloss")


class Wakeup:
    def __init__(self, using: str, queues: Iterable[str], *, listen: bool = True) -> None:
        self.using = using
        self.queues = set(queues)
        self.event = threading.Event()
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

    def wait(self, timeout: float) -> bool:
        woke = self.event.wait(timeout)
        self.event.clear()
        return woke

    def listen(self) -> None:
        """LISTEN until stopped, reconnecting after a backoff when the connection fails."""
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
            self.event.set()  # anything sent while we were not listening

        while not self._stop.is_set():
            try:
                session(params, listening)
            except Exception as exc:  # idle threads poll meanwhile; reconnect after a backoff
                self.listening.clear()
                if not isinstance(exc, driver_error):
                    logger.warning("wake-up listener stopped (%s); polling meanwhile", exc)
                else:
                    monitor.failed("the wake-up listener", exc)
                self._stop.wait(backoff.next())

    def _psycopg3(self, params: dict[str, Any], listening: Callable[[], None]) -> None:
        import psycopg

        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute(self._listen_sql)
            listening()
            while not self._stop.is_set():
                for note in conn.notifies(timeout=0.5):
                    if note.payload in self.queues:
                        self.event.set()

    def _psycopg2(self, params: dict[str, Any], listening: Callable[[], None]) -> None:
        import select

        import psycopg2

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
                        if conn.notifies.pop(0).payload in self.queues:
                            self.event.set()
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self.event.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _psycopg3_error() -> type[Exception]:
    import psycopg

    return psycopg.Error


def _psycopg2_error() -> type[Exception]:
    import psycopg2

    return psycopg2.Error
