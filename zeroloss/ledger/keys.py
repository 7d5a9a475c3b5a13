"""Ordering keys as an operator sees them: which keys are blocked, by what, and moving their head.

A key is *blocked* when messages wait behind its head and the head cannot be claimed now: it
is processing (live or expired lease), waiting for a retry after a failure, or missing (a
promotion was lost; the sweep repairs it). Moving a head uses the existing operator
transitions, audited with the operator's name: *skip* dead-letters it (the key's next message
becomes the head), *requeue* puts a processing head back to pending at the head of its key.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..exceptions import InvalidMessage
from .base import Part
from .models import Status
from .types import KeyHead, KeyWhy
from .validation import validate_count, validate_message_id, validate_queue_name

#: Prefix of the dead-letter reason a skipped head gets (its ``last_error`` and audit detail).
SKIP_PREFIX = "key skipped: "


class Keys(Part):
    """Ordering keys: which are blocked, and moving a key's head (through ``ctx.operator``)."""

    def blocked_keys(self, queue: str | None = None, limit: int = 50) -> list[KeyHead]:
        """Keys with messages waiting behind a head that cannot be claimed now, longest blocked first.

        Reads the waiting messages (their partial index) and one probe per key of the one-head
        index: the cost follows the number of waiting messages, never completed history.
        """
        validate_count(limit, "limit")
        if queue is None:
            rows, _ = self._run("BLOCKED_KEYS", {"limit": limit})
        else:
            rows, _ = self._run(
                "BLOCKED_KEYS_OF_QUEUE", {"queue": validate_queue_name(queue), "limit": limit}
            )
        return [self._key_head(row) for row in rows]

    def key_head(self, queue: str, key: str) -> KeyHead | None:
        """The head of one ordering key, blocked or not; ``None`` if the key has no live message."""
        queue = validate_queue_name(queue)
        key = validate_message_id(key, "ordering_key")
        rows, _ = self._run("KEY_HEAD", {"queue": queue, "key": key})
        head = self._key_head(rows[0])
        return None if head.message_id is None and not head.behind else head

    def skip_key_head(
        self,
        queue: str,
        key: str,
        *,
        reason: str,
        actor: str | None = None,
        message_id: str | None = None,
    ) -> str | None:
        """Dead-letter the key's head (reason ``key skipped: <reason>``) so its next message proceeds.

        With ``message_id``, only if that message is still the head (an operator acting on what
        a page showed a moment ago). Returns the id dead-lettered, or ``None`` if the key has no
        head (or another one by now). Concurrent skips never dead-letter one message twice; a
        call that waited for a head another call skipped returns ``None``. A redrive later puts
        the message back *behind* the key's head.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidMessage("A reason is required to skip a key's head.")
        with transaction.atomic(using=self.using):
            head = self._locked_head(queue, key, message_id)
            if head is None:
                return None
            moved = self.ctx.operator.dead_letter_messages(
                [head[0]], reason=SKIP_PREFIX + reason.strip(), actor=actor
            )
        return moved[0] if moved else None

    def requeue_key_head(
        self,
        queue: str,
        key: str,
        *,
        actor: str | None = None,
        force: bool = False,
        message_id: str | None = None,
    ) -> str | None:
        """Requeue the key's processing head (it stays the head): a stuck one, or with ``force`` a
        live one, whose worker is then fenced off. Attempts restart at zero.

        Returns the id requeued, or ``None``: no head (or not ``message_id``), a head that is
        not processing (a retry backing off runs on its own; skip it to move on), or a live
        lease without ``force``.
        """
        with transaction.atomic(using=self.using):
            head = self._locked_head(queue, key, message_id)
            if head is None or head[1] != Status.PROCESSING:
                return None
            detail = "ordering key head requeued: " + ("live lease revoked" if force else "expired lease")
            moved = self.ctx.operator.requeue_messages([head[0]], actor=actor, force=force, detail=detail)
        return moved[0] if moved else None

    # -- helpers ----------------------------------------------------------------------

    def _locked_head(self, queue: str, key: str, message_id: str | None) -> tuple[str, str] | None:
        """``(message_id, status)`` of the key's head, locked until the caller's transaction ends
        (a row lock on PostgreSQL; on SQLite the ``IMMEDIATE`` transaction holds the write lock),
        so the head checked is the head moved. ``None`` without a head or when it is not
        ``message_id``."""
        queue = validate_queue_name(queue)
        key = validate_message_id(key, "ordering_key")
        if message_id is not None:
            validate_message_id(message_id)
        rows, _ = self._run("KEY_HEAD_LOCK", {"queue": queue, "key": key})
        if not rows or (message_id is not None and rows[0][0] != message_id):
            return None
        return rows[0][0], rows[0][1]

    def _key_head(self, row: tuple[Any, ...]) -> KeyHead:
        (queue, key, waiting, waiting_since, mid, status, attempts, max_attempts, claimed_by) = row[:9]
        started, updated, available, expires, last_error, now = row[9:15]
        at = self.engine.to_datetime
        now = self.engine.at(now)
        until = None
        if mid is None:
            why, since = KeyWhy.NO_HEAD, at(waiting_since)
        elif status == Status.PROCESSING:
            until = at(expires)
            why = KeyWhy.PROCESSING if until is not None and until > now else KeyWhy.LEASE_EXPIRED
            since = at(started) or at(updated)
        else:
            available_at = at(available)
            if available_at is not None and available_at > now:
                why, until = KeyWhy.RETRY_BACKOFF, available_at
            else:
                why = KeyWhy.CLAIMABLE
            since = at(updated)
        return KeyHead(
            queue_name=queue,
            ordering_key=key,
            message_id=mid,
            status=status,
            why=why,
            since=since,
            behind=int(waiting or 0),
            now=now,
            attempts=int(attempts or 0),
            max_attempts=int(max_attempts or 0),
            claimed_by=claimed_by or "",
            last_error=last_error or "",
            until=until,
        )
