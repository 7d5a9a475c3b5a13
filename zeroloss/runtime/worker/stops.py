"""The lease keeper's stop for sync handlers whose lease is lost.

A sync handler runs on a worker thread under a :class:`~zeroloss.runtime.timelimits.ThreadGuard`, the
same guard as its soft time limit, handed to the keeper while it is armed (:meth:`running`).
Once the keeper knows the lease is lost — a renewal refused (another worker took the message
over while this one was frozen, or it was revoked), or its expiry passed by this process's
clock unrenewed — it fires :class:`~zeroloss.exceptions.LeaseLostInterrupt` into that thread:
pure-Python code stops at its next bytecode, a call blocked in C when it returns. Nothing is
done for a run whose lease is held: the check runs over the runs in hand only, and a guard is
fired once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ...exceptions import LeaseLostInterrupt
from ..timelimits import ThreadGuard


class HandlerStops:
    lost: set[str]
    _held: dict[str, Any]
    _lock: threading.Lock
    _guards: dict[str, ThreadGuard]

    def running(self, message_id: str, guard: ThreadGuard | None) -> None:
        """``message_id``'s handler runs under ``guard`` (None: it has ended)."""
        with self._lock:
            if guard is None:
                self._guards.pop(message_id, None)
            else:
                self._guards[message_id] = guard
                if message_id in self.lost:
                    guard.fire(LeaseLostInterrupt)  # due: raised when it is armed

    def _lose(self, message_id: str) -> None:
        """Mark the lease lost and stop its handler (called with ``_lock`` held)."""
        self.lost.add(message_id)
        guard = self._guards.get(message_id)
        if guard is not None:
            guard.fire(LeaseLostInterrupt)

    def stop_lapsed_runs(self) -> None:
        """Stop the handlers whose leases ran out here unrenewed (the database unreachable, or
        not renewed past the hard time limit): another worker may hold them by now."""
        if not self._guards:
            return
        now = time.monotonic()
        with self._lock:
            for mid, guard in self._guards.items():
                held = self._held.get(mid)
                if held is not None and now >= held.expires:
                    guard.fire(LeaseLostInterrupt)
