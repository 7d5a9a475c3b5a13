"""The lease keeper's watch for aborts: which messages in hand an operator aborted.

Polled by the keeper's thread every ``ABORT_POLL_INTERVAL`` while it holds leases (one indexed
read of the held ids), not only at renewals: ``HEARTBEAT_INTERVAL`` may be longer than the
second an abort must take to reach its handler (``Delivery.abort_requested``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...ledger.service import ZeroLossMessageService


class AbortWatch:
    service: ZeroLossMessageService
    aborted: set[str]
    lost: set[str]
    _held: dict[str, Any]
    _lock: threading.Lock

    def is_abort_requested(self, message_id: str) -> bool:
        return message_id in self.aborted

    def poll_aborts(self) -> None:
        """Ask the ledger which messages in hand were aborted (they stay so until dropped)."""
        with self._lock:
            asking = [h.lease for m, h in self._held.items() if m not in self.aborted and m not in self.lost]
        if asking:
            found = self.service.aborts_requested(asking)
            with self._lock:
                self.aborted |= found & self._held.keys()
