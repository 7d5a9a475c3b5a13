"""The service's methods renamed in 0.3 under their old names: each warns and delegates.

One verb per action (docs/upgrading.md lists old -> new); the old names go in 0.4.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterable
from typing import Any

from .facade import Facade
from .types import Completion, CompletionReport, Lease, RecoveryReport

#: Old name -> new name, for the service's methods; what docs/upgrading.md tabulates.
RENAMED = {
    "claim_next": "claim",
    "mark_processing": "claim_message",
    "acknowledge_message": "acknowledge",
    "mark_failed": "fail",
    "release_lease": "release",
    "complete": "record_outcomes",
    "recover_orphaned_messages": "sweep",
    "retry_message": "redrive_or_requeue",
}


def _warn(old: str) -> None:
    # stacklevel 3: attributed to the deprecated method's caller, so a "default" filter shows
    # it once per call site.
    warnings.warn(
        f"ZeroLossMessageService.{old}() is deprecated and will be removed in zeroloss 0.4; "
        f"use {RENAMED[old]}().",
        DeprecationWarning,
        stacklevel=3,
    )


class DeprecatedNames(Facade):
    """The old names of renamed methods (removed in 0.4)."""

    def claim_next(self, queue_name: str, limit: int = 1) -> list[Lease]:
        """Deprecated: :meth:`claim`."""
        _warn("claim_next")
        return self.claim(queue_name, limit)

    def mark_processing(self, message_id: str) -> Lease | None:
        """Deprecated: :meth:`claim_message`."""
        _warn("mark_processing")
        return self.claim_message(message_id)

    def acknowledge_message(
        self, message_id: str, lease_token: uuid.UUID | str, *, result: Any = None
    ) -> bool:
        """Deprecated: :meth:`acknowledge`."""
        _warn("acknowledge_message")
        return self.acknowledge(message_id, lease_token, result=result)

    def mark_failed(self, message_id: str, lease_token: uuid.UUID | str, error: str) -> bool:
        """Deprecated: :meth:`fail`."""
        _warn("mark_failed")
        return self.fail(message_id, lease_token, error)

    def release_lease(self, message_id: str, lease_token: uuid.UUID | str) -> bool:
        """Deprecated: :meth:`release`."""
        _warn("release_lease")
        return self.release(message_id, lease_token)

    def complete(self, completions: Iterable[Completion], *, locked: bool = False) -> CompletionReport:
        """Deprecated: :meth:`record_outcomes`."""
        _warn("complete")
        return self.record_outcomes(completions, locked=locked)

    def recover_orphaned_messages(
        self, *, batch_size: int | None = None, limit: int | None = None
    ) -> RecoveryReport:
        """Deprecated: :meth:`sweep`."""
        _warn("recover_orphaned_messages")
        return self.sweep(batch_size=batch_size, limit=limit)

    def retry_message(self, message_id: str, *, actor: str | None = None, force: bool = False) -> bool:
        """Deprecated: :meth:`redrive_or_requeue`."""
        _warn("retry_message")
        return self.redrive_or_requeue(message_id, actor=actor, force=force)
