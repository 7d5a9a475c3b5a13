"""``zeroloss.cancel``: stop a message before it runs, or (``abort=True``) while it runs."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS

from .service import ZeroLossMessageService
from .types import CancelOutcome, CancelResult

__all__ = ["CancelOutcome", "CancelResult", "cancel"]


def cancel(
    message_id: str, abort: bool = False, *, actor: str | None = None, using: str = DEFAULT_DB_ALIAS
) -> CancelResult:
    """Cancel one message; what happened is the result's ``outcome``.

    A pending message (claimable, delayed, or waiting behind its ordering key's head) becomes
    ``cancelled``. A processing one is left alone (``running``) unless ``abort=True``: then its
    handler sees ``delivery.abort_requested`` within a second, and the message ends
    ``cancelled`` when the handler returns or raises (a transactional handler's effects roll
    back). Completed, dead or cancelled messages are reported as such, unchanged.

    Raises :class:`~zeroloss.exceptions.InvalidMessage` for a malformed id and
    :class:`~zeroloss.exceptions.MessageNotFound` for an unknown one (nothing changed).
    ``using``: the database holding the message (``QUEUE_DATABASES``).
    """

    service = ZeroLossMessageService(using=using)
    return service.cancel_messages([message_id], abort=abort, actor=actor)[0]
