"""A worker thread's claimed batch: its messages taken one at a time, the one running known to the keeper."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable

from ...ledger.types import Lease


class Batch:
    """The claimed messages of one worker thread, taken one at a time (thread-safe)."""

    def __init__(self, leases: Iterable[Lease]) -> None:
        self._lock = threading.Lock()
        self._waiting: deque[Lease] = deque(leases)
        self.running: Lease | None = None
        self.running_since = 0.0

    def next(self) -> Lease | None:
        with self._lock:
            self.running = self._waiting.popleft() if self._waiting else None
            self.running_since = time.monotonic()
            return self.running

    def start(self, lease: Lease) -> None:
        """``lease``'s handler starts now (one taken earlier, run again)."""
        with self._lock:
            self.running = lease
            self.running_since = time.monotonic()

    def done(self) -> None:
        with self._lock:
            self.running = None

    @property
    def has_more(self) -> bool:
        return bool(self._waiting)

    def take_unstarted(self, *, if_running_longer_than: float | None = None) -> list[Lease]:
        """Remove and return the messages not started yet (all, or only when the one running
        has run longer than the given seconds)."""
        with self._lock:
            if if_running_longer_than is not None and (
                self.running is None or time.monotonic() - self.running_since < if_running_longer_than
            ):
                return []
            taken = list(self._waiting)
            self._waiting.clear()
            return taken


__all__ = ["Batch"]
