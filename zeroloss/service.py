"""``ZeroLossMessageService``: the one owner of every message state transition.

State lives only in the database, so any number of service instances, in any number of
processes and hosts, share it. Every transition is a single conditional ``UPDATE`` (or
``INSERT``) whose ``WHERE`` clause re-checks the state it leaves, so two actors can never
both win; the audit row is written in the same statement (PostgreSQL) or the same
transaction (SQLite). The allowed moves are the table in :mod:`zeroloss.states`; each
concern lives in its own module of :mod:`zeroloss.ledger`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from . import telemetry
from .delivery import _when_stored, outcomes_stored
from .ledger.dispatch import Dispatching
from .ledger.integrity import Integrity
from .ledger.keys import Keys
from .ledger.leases import Leasing
from .ledger.nodes import Nodes
from .ledger.operator import OperatorActions
from .ledger.persist import PersistedMessage, Persisting
from .ledger.sweep import Sweeping
from .ledger.types import (
    CRITICAL,
    WARNING,
    Completion,
    CompletionReport,
    IntegrityFinding,
    IntegrityReport,
    KeyHead,
    KeyWhy,
    Lease,
    RecoveryReport,
    Verdict,
)
from .ledger.validation import (
    MAX_ERROR_LENGTH,
    MAX_MESSAGE_ID_LENGTH,
    MAX_QUEUE_NAME_LENGTH,
    QUEUE_NAME_RE,
    canonical_json,
    default_instance_id,
    payload_checksum,
    validate_message_id,
    validate_queue_name,
)
from .replication import ReplicationStatus

__all__ = [
    "CRITICAL",
    "MAX_ERROR_LENGTH",
    "MAX_MESSAGE_ID_LENGTH",
    "MAX_QUEUE_NAME_LENGTH",
    "QUEUE_NAME_RE",
    "WARNING",
    "Completion",
    "CompletionReport",
    "IntegrityFinding",
    "IntegrityReport",
    "KeyHead",
    "KeyWhy",
    "Lease",
    "PersistedMessage",
    "RecoveryReport",
    "ReplicationStatus",
    "Verdict",
    "ZeroLossMessageService",
    "canonical_json",
    "default_instance_id",
    "payload_checksum",
    "validate_message_id",
    "validate_queue_name",
    "wait_until",
]


class ZeroLossMessageService(
    Persisting, Leasing, Sweeping, Keys, OperatorActions, Dispatching, Integrity, Nodes
):
    """Every operation on the ledger. Cheap to construct; holds no message state.

    Keyword arguments override ``ZEROLOSS`` settings for this instance, by lower-case
    name: ``ZeroLossMessageService(ack_timeout=0.5, max_attempts=2)``.
    """

    def complete(self, completions: Iterable[Completion], *, locked: bool = False) -> CompletionReport:
        batch = list(completions)
        with telemetry.settle_span(batch):
            report = super().complete(batch, locked=locked)
        if _when_stored:  # something of this process waits for these outcomes (task_finished)
            outcomes_stored(self.using, report)
        return report


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes (used by tools and tests)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
