"""Wake idle workers the moment a message is persisted (PostgreSQL LISTEN/NOTIFY).

Persists send ``NOTIFY zeroloss_wakeup, '<queue>'`` in their own statement (delivered at
commit). A worker process keeps one extra connection that LISTENs and sets an event its
idle threads wait on; polling every ``poll_interval`` remains the fallback (SQLite, a lost
listener connection, messages that become available after a backoff or a requeue).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from django.db import connections

logger = logging.getLogger("zeroloss")

CHANNEL = "zeroloss_wakeup"


class Wakeup:
    def __init__(self, using: str, queues: Iterable[str]) -> None:
        self.using = using
        self.queues = set(queues)
        self.event = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()

    def start(self) -> Wakeup:
        if connections[self.using].vendor == "postgresql":
            self._thread = threading.Thread(target=self._listen, name="zeroloss-listen", daemon=True)
            self._thread.start()
        return self

    def wait(self, timeout: float) -> bool:
        woke = self.event.wait(timeout)
        self.event.clear()
        return woke

    def _listen(self) -> None:
        import psycopg

        params = connections[self.using].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        while not self._stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload in self.queues:
                                self.event.set()
            except Exception as exc:  # fall back to polling, reconnect shortly
                self.listening.clear()
                logger.warning("wake-up listener lost its connection (%s); polling meanwhile", exc)
                self._stop.wait(2)

    def stop(self) -> None:
        self._stop.set()
        self.event.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
