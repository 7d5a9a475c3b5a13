"""Bookkeeping for the Celery transport: which pending messages no broker message carries."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Part
from .operator import CHUNK
from .validation import seconds, validate_count


class Dispatch(Part):
    """The Celery transport's bookkeeping: what to publish, what was published."""

    def dispatch_candidates(self, *, limit: int = 1000, grace: float = 1.0) -> list[tuple[str, str, float]]:
        """Pending, available messages that no live broker message is known to carry.

        ``(message_id, queue_name, 0)`` for: never published (publish failed or was lost
        with the process) for longer than ``grace``; changed since the last publish (requeued
        by the sweep or an operator, backoff elapsed, released by its ordering key); or
        published more than ``REDISPATCH_AFTER`` ago and still unclaimed (the broker lost it).
        """
        validate_count(limit, "limit")
        rows, _ = self._run(
            "DISPATCH_CANDIDATES",
            {
                "grace": -seconds(grace, "grace"),
                "redispatch": -self.settings.REDISPATCH_AFTER,
                "limit": limit,
            },
        )
        return [(r[0], r[1], 0.0) for r in rows]

    def mark_dispatched(self, message_ids: Sequence[str], *, dispatched: bool = True) -> int:
        """Record that a broker message was (or, with ``dispatched=False``, was not) published.

        Bookkeeping for redispatch only: no state transition, no audit row.
        """
        name = "MARK_DISPATCHED" if dispatched else "MARK_UNDISPATCHED"
        ids = list(message_ids)
        count = 0
        for start in range(0, len(ids), CHUNK):
            count += self._run(name, {"mid": self.engine.column(ids[start : start + CHUNK])})[1]
        return count
