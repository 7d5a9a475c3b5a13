"""Reads: one message, its audit trail, its integrity (checksum, lease, attempts, replication)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils.translation import gettext as _

from ..exceptions import InvalidPayload
from .base import Part
from .hooks import replication
from .models import Message, MessageEvent, Status
from .types import CRITICAL, WARNING, IntegrityFinding, IntegrityReport
from .validation import canonical_json, payload_checksum, validate_message_id


class Reads(Part):
    """Reads of messages and their audit trail, and their integrity checks."""

    def get_message(self, message_id: str) -> Message | None:
        """The stored message, or None if there is none of that id."""
        validate_message_id(message_id)
        return Message.objects.using(self.using).filter(message_id=message_id).first()

    def get_events(self, message_id: str) -> list[MessageEvent]:
        """The message's audit trail, one row per transition, oldest first."""
        validate_message_id(message_id)
        return list(MessageEvent.objects.using(self.using).for_message(message_id))

    async def aget_message(self, message_id: str) -> Message | None:
        """:meth:`get_message` for async views."""
        validate_message_id(message_id)
        return await Message.objects.using(self.using).filter(message_id=message_id).afirst()

    async def aget_events(self, message_id: str) -> list[MessageEvent]:
        """:meth:`get_events` for async views."""
        validate_message_id(message_id)
        return [e async for e in MessageEvent.objects.using(self.using).for_message(message_id)]

    def verify_message_integrity(self, message_id: str) -> IntegrityReport:
        """Check one message: present, checksum, lease, attempts, and *measured* replication."""
        validate_message_id(message_id)
        message = self.get_message(message_id)
        if message is None:
            return IntegrityReport(
                message_id,
                False,
                [IntegrityFinding("not_found", CRITICAL, _("Message %r not found") % message_id)],
            )
        return self.verify_message(message)

    def verify_message(
        self,
        message: Message,
        now: dt.datetime | None = None,
        *,
        replication: bool = True,
        record: bool = True,
    ) -> IntegrityReport:
        """Check a loaded message (``now``: the database clock, read if not given).

        ``record=False`` measures replication without writing anything (read-only pages).
        """
        if now is None:
            now = self.database_now()
        findings: list[IntegrityFinding] = []
        try:
            actual = payload_checksum(canonical_json(message.payload))
        except InvalidPayload as exc:  # pragma: no cover - stored payloads are always JSON
            actual = f"unreadable: {exc}"
        if actual != message.checksum:
            findings.append(
                IntegrityFinding(
                    "checksum_mismatch",
                    CRITICAL,
                    _("Checksum mismatch: stored %(stored)s..., payload hashes to %(actual)s...")
                    % {"stored": message.checksum[:12], "actual": actual[:12]},
                )
            )
        if (
            message.status == Status.PROCESSING
            and message.lease_expires_at
            and message.lease_expires_at < now
        ):
            overdue = (now - message.lease_expires_at).total_seconds()
            findings.append(
                IntegrityFinding(
                    "stuck",
                    WARNING,
                    _(
                        "Stuck in processing: lease of %(worker)s expired %(overdue).1fs ago (the sweep will requeue it)"
                    )
                    % {"worker": message.claimed_by, "overdue": overdue},
                )
            )
        if message.attempts > message.max_attempts:
            findings.append(
                IntegrityFinding(
                    "attempts_exceeded",
                    CRITICAL,
                    _("Attempts beyond max: %(attempts)d/%(max)d")
                    % {"attempts": message.attempts, "max": message.max_attempts},
                )
            )
        status = self.replication_status(message, record=record) if replication else None
        if status is not None and not status.sufficient:
            findings.append(
                IntegrityFinding(
                    "replication_insufficient",
                    CRITICAL,
                    _("Insufficient replication: %(confirmed)s/%(required)s (%(detail)s)")
                    % {"confirmed": status.confirmed, "required": status.required, "detail": status.detail},
                )
            )
        return IntegrityReport(message.message_id, not findings, findings, message.status, status)

    def replication_status(self, message: Message | None = None, *, record: bool = True) -> Any:
        """Measured copies of ``message`` (a :class:`~zeroloss.integrations.replication.ReplicationStatus`);
        ``record=False`` never writes (see :func:`zeroloss.integrations.replication.measure`)."""

        return replication().measure(self.ctx.service, message, record=record)
