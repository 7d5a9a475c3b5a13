"""Django signals for a message's life (docs/signals.md says when each fires and with what).

Every signal is sent with ``sender=ZeroLossMessageService`` (the class) and keyword arguments
only. A receiver that raises never breaks a send, a worker or a sweep: the error is logged
(``zeroloss`` logger, ERROR, with its traceback) and the other receivers still run. With no
receiver connected, a signal costs one attribute check: its arguments are not even built.

- ``message_sent``: ``send`` or ``send_many`` stored a message, once the caller's transaction
  committed (never for a rollback). An idempotent resend of a stored message fires too.
- ``message_started``: a handler is about to run (every attempt, in the worker thread).
- ``message_finished``: an attempt's outcome was recorded and committed: ``outcome`` is
  ``"completed"``, ``"failed"`` (retried later), ``"dead"`` (attempts spent), ``"cancelled"``
  (aborted by an operator while it ran) or
  ``"lease_lost"`` (the lease was gone: nothing recorded, the message runs again).
- ``message_dead_lettered``: a message went ``dead`` (its last attempt failed, or the sweep
  found its last attempt's lease expired), after commit.
- ``message_recovered``: the sweep put a message whose lease expired back to pending.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("zeroloss")

__all__ = [
    "message_dead_lettered",
    "message_finished",
    "message_recovered",
    "message_sent",
    "message_started",
]

#: ``message_id``, ``queue_name``, ``using``.
message_sent = Signal()
#: ``delivery`` (:class:`zeroloss.delivery.Delivery`), ``worker`` (the instance id).
message_started = Signal()
#: ``message_id``, ``queue_name``, ``attempt``, ``outcome``, ``error`` ("" unless failed),
#: ``worker``, ``using``.
message_finished = Signal()
#: ``message_id``, ``queue_name``, ``attempt``, ``error``, ``worker``, ``using``, ``by``
#: (``"worker"``: its last attempt failed; ``"sweep"``: its last attempt's lease expired).
message_dead_lettered = Signal()
#: ``message_id``, ``queue_name``, ``attempt`` (the attempt whose lease expired), ``worker``
#: (who held the lease), ``using``.
message_recovered = Signal()


def listened(signal: Signal) -> bool:
    """The cheap check before building a signal's arguments (no receiver: nothing to do)."""
    return bool(signal.receivers)


def send(signal: Signal, sender: type, **kwargs: Any) -> None:
    """Send ``signal``; a receiver's exception is logged, never raised."""
    if not signal.receivers:
        return
    try:
        answers = signal.send_robust(sender=sender, **kwargs)
    except Exception:  # send_robust itself (a receiver that cannot even be called)
        logger.exception("a zeroloss signal receiver could not be called")
        return
    for receiver, answer in answers:
        if isinstance(answer, BaseException):
            logger.error(
                "zeroloss signal receiver %s raised %s; ignored",
                _name(receiver),
                type(answer).__name__,
                exc_info=(type(answer), answer, answer.__traceback__),
            )


def _name(receiver: Callable[..., Any]) -> str:
    return f"{getattr(receiver, '__module__', '?')}.{getattr(receiver, '__qualname__', repr(receiver))}"
