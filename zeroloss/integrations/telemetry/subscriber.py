"""The ledger's events (:mod:`zeroloss.ledger.events`) as metrics and span events, after commit."""

from __future__ import annotations

from collections.abc import Sequence

from ...ledger.events import Cancelled, Claimed, DeadLettered, Event, Finished, Recovered, Sent
from . import active, cancelled, claimed, dead_lettered, finished_many, recovered, sent


class TelemetryEvents:
    """Each event to the backends :func:`zeroloss.integrations.telemetry.active` found; outcomes and sends
    counted once per batch (one counter update per queue and outcome)."""

    def wants(self, kind: type) -> bool:
        return kind in (Sent, Claimed, Finished, DeadLettered, Recovered, Cancelled) and active()

    def __call__(self, sender: type | None, events: Sequence[Event]) -> None:
        if not active():
            return
        counts: dict[tuple[str, str], int] = {}
        stored: list[str] = []
        for e in events:
            if isinstance(e, Finished):
                key = (e.queue_name, e.outcome)
                counts[key] = counts.get(key, 0) + 1
            elif isinstance(e, DeadLettered):
                dead_lettered(e.queue_name, e.message_id, e.attempt, e.by, e.headers)
            elif isinstance(e, Cancelled):
                cancelled(e.queue_name, e.message_id, e.by)
            elif isinstance(e, Recovered):
                recovered(e.queue_name, e.message_id, e.attempt)
            elif isinstance(e, Claimed):
                claimed(e.queue_name, e.leases)
            elif isinstance(e, Sent):
                stored.append(e.queue_name)
        if stored:
            sent(stored)
        if counts:
            finished_many(counts)
