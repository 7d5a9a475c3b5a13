"""``ZeroLossMessageService``: the one owner of every message state transition.

State lives only in the database, so any number of service instances, in any number of
processes and hosts, share it. Every transition is a single conditional ``UPDATE`` (or
``INSERT``) whose ``WHERE`` clause re-checks the state it leaves, so two actors can never
both win; the audit row is written in the same statement (PostgreSQL) or the same
transaction (SQLite). The allowed moves are the table in :mod:`zeroloss.states`.

The service is a facade over parts with one job each (:mod:`zeroloss.ledger`), built over one
shared :class:`~zeroloss.ledger.base.LedgerContext`: ``service.store``, ``service.leases``, ...
"""

from __future__ import annotations

import time
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from .ledger.aborts import Aborts
from .ledger.base import LedgerContext
from .ledger.control import Control
from .ledger.deprecated import DeprecatedNames
from .ledger.dispatch import Dispatch
from .ledger.integrity import Reads
from .ledger.keys import Keys
from .ledger.leases import Leases
from .ledger.nodes import Nodes
from .ledger.operator import Operator
from .ledger.outcomes import Outcomes
from .ledger.persist import PersistedMessage, Store
from .ledger.sweep import Recovery
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


class ZeroLossMessageService(DeprecatedNames):
    """Every operation on the ledger. Cheap to construct; holds no message state.

    Keyword arguments override ``ZEROLOSS`` settings for this instance, by lower-case
    name: ``ZeroLossMessageService(ack_timeout=0.5, max_attempts=2)``. Each method delegates
    to one part, reachable by name for the new names (``service.leases.claim(...)``).
    """

    def __init__(self, *, using: str = DEFAULT_DB_ALIAS, instance_id: str | None = None, **overrides: Any):
        ctx = self.context = LedgerContext(using=using, instance_id=instance_id, **overrides)
        ctx.service = self  # the hooks' and signals' "service"
        self.settings, self.using, self.instance_id = ctx.settings, ctx.using, ctx.instance_id
        self.store = ctx.store = Store(ctx)
        self.leases = ctx.leases = Leases(ctx)
        self.outcomes = ctx.outcomes = Outcomes(ctx)
        self.aborts = ctx.aborts = Aborts(ctx)
        self.control = ctx.control = Control(ctx)
        self.recovery = ctx.recovery = Recovery(ctx)
        self.operator = ctx.operator = Operator(ctx)
        self.keys = ctx.keys = Keys(ctx)
        self.dispatch = ctx.dispatch = Dispatch(ctx)
        self.reads = ctx.reads = Reads(ctx)
        self.nodes = ctx.nodes = Nodes(ctx)


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes (used by tools and tests)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
