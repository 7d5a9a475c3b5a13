"""The log records and signals of the ledger's events (:mod:`zeroloss.ledger.events`).

Subscribed from the app's ``ready()``; they run after the commit of what they tell (at once in
autocommit), so nothing is logged or signalled for a change that was rolled back. Dead letters
are logged at ERROR, sweep recoveries at WARNING, each with the structured fields of
docs/logging.md (``message_id``, ``queue``, ``attempt``, ``worker``). With no signal receiver
connected and nothing dead-lettered, none of this runs at all.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from django.dispatch import Signal

from .. import signals
from ..ledger.events import Cancelled, DeadLettered, Event, Finished, Recovered, Sent, Started

logger = logging.getLogger("zeroloss")


class LogNotices:
    """Dead letters (ERROR), and what the sweep put back or cancelled (WARNING)."""

    def wants(self, kind: type) -> bool:
        return kind in (DeadLettered, Recovered, Cancelled)

    def __call__(self, sender: type | None, events: Sequence[Event]) -> None:
        for e in events:
            if isinstance(e, DeadLettered) and e.by == "worker":
                first_line = (e.error or "").partition("\n")[0][:500]
                _log(
                    logging.ERROR,
                    "%s: dead-lettered after attempt %d of %d: %s",
                    (e.message_id, e.attempt, e.max_attempts, first_line),
                    e,
                )
            elif isinstance(e, DeadLettered):
                _log(
                    logging.ERROR,
                    "%s: dead-lettered by the sweep: the lease of its last attempt (%d) expired (held by %s)",
                    (e.message_id, e.attempt, e.worker),
                    e,
                )
            elif isinstance(e, Recovered):
                _log(
                    logging.WARNING,
                    "%s: recovered by the sweep: the lease of attempt %d expired (held by %s); pending again",
                    (e.message_id, e.attempt, e.worker),
                    e,
                )
            elif isinstance(e, Cancelled) and e.by == "sweep":
                _log(
                    logging.WARNING,
                    "%s: cancelled by the sweep: its abort was requested and the lease of attempt %d expired "
                    "(held by %s); not run again",
                    (e.message_id, e.attempt, e.worker),
                    e,
                )


def _log(level: int, msg: str, args: tuple[Any, ...], e: DeadLettered | Recovered | Cancelled) -> None:
    extra = {"message_id": e.message_id, "queue": e.queue_name, "attempt": e.attempt, "worker": e.worker}
    with contextlib.suppress(Exception):  # a broken log handler must not undo a recorded outcome
        logger.log(level, msg, *args, extra=extra)


#: The signal each kind of event sends, and the event's fields that are its arguments
#: (docs/signals.md).
_SIGNAL_OF: dict[type, tuple[Signal, tuple[str, ...]]] = {
    Sent: (signals.message_sent, ("message_id", "queue_name", "using")),
    Started: (signals.message_started, ("delivery", "worker")),
    Finished: (
        signals.message_finished,
        ("message_id", "queue_name", "attempt", "outcome", "error", "worker", "using"),
    ),
    DeadLettered: (
        signals.message_dead_lettered,
        ("message_id", "queue_name", "attempt", "error", "worker", "using", "by"),
    ),
    Recovered: (signals.message_recovered, ("message_id", "queue_name", "attempt", "worker", "using")),
}


class SignalNotices:
    """The signals of :mod:`zeroloss.signals`, sent by ``sender`` when the event names none."""

    def __init__(self, sender: type):
        self.sender = sender

    def wants(self, kind: type) -> bool:
        signal = _SIGNAL_OF.get(kind)
        return signal is not None and bool(signal[0].receivers)

    def __call__(self, sender: type | None, events: Sequence[Event]) -> None:
        by = sender or self.sender
        for e in events:
            sent = _SIGNAL_OF.get(type(e))
            if sent is not None:
                signal, arguments = sent
                signals.send(signal, by, **{name: getattr(e, name) for name in arguments})
