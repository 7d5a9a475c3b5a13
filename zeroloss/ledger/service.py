"""``ZeroLossMessageService``: the one owner of every message state transition.

State lives only in the database, so any number of service instances, in any number of
processes and hosts, share it. Every transition is a single conditional ``UPDATE`` (or
``INSERT``) whose ``WHERE`` clause re-checks the state it leaves, so two actors can never
both win; the audit row is written in the same statement (PostgreSQL) or the same
transaction (SQLite). The allowed moves are the table in :mod:`zeroloss.core.states`.

The service names the operations of parts with one job each (:mod:`zeroloss.ledger`), built
over one shared :class:`~zeroloss.ledger.base.LedgerContext`: ``service.store``,
``service.leases``, ...; each flat name is its part's method (:mod:`zeroloss.ledger.surface`).
"""

from __future__ import annotations

import time
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.backends.base.base import BaseDatabaseWrapper

from ..core.outage import refusing_for_storage
from .aborts import Aborts
from .base import LedgerContext
from .control import Control
from .deprecated import deprecated
from .dispatch import Dispatch
from .engine import Engine
from .integrity import Reads
from .keys import Keys
from .leases import Leases
from .nodes import Nodes
from .operator import Operator
from .outcomes import Outcomes
from .persist import PersistedMessage, Store
from .surface import from_context, operation
from .sweep import Recovery
from .types import (
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
from .validation import (
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
from .workflows import Workflows

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
    "Verdict",
    "ZeroLossMessageService",
    "canonical_json",
    "default_instance_id",
    "payload_checksum",
    "validate_message_id",
    "validate_queue_name",
    "wait_until",
]


class ZeroLossMessageService:
    """Every operation on the ledger. Cheap to construct; holds no message state.

    Keyword arguments override ``ZEROLOSS`` settings for this instance, by lower-case
    name: ``ZeroLossMessageService(ack_timeout=0.5, max_attempts=2)``. Each method is one
    part's operation (``service.claim`` is ``service.leases.claim``), declared below by name.
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
        self.workflows = ctx.workflows = Workflows(ctx)

    connection = from_context[BaseDatabaseWrapper](
        "connection", "The Django connection of ``using``, this thread's."
    )
    engine = from_context[Engine]("engine", "The engine (PostgreSQL or SQLite) of that connection.")

    database_now = operation(LedgerContext.database_now)
    promote_keys = operation(LedgerContext.promote_keys)
    # A full disk raises StorageFull, not the driver's error (zeroloss.core.outage).
    persist_message = operation(refusing_for_storage(Store.persist_message))
    persist_messages = operation(refusing_for_storage(Store.persist_messages))
    claim = operation(Leases.claim)
    next_available_in = operation(Leases.next_available_in)
    claim_message = operation(Leases.claim_message)
    renew_lease = operation(Leases.renew_lease)
    renew_leases = operation(Leases.renew_leases)
    busy_leases = operation(Leases.busy_leases)
    revive_leases = operation(Leases.revive_leases)
    release_unknown_claims = operation(Leases.release_unknown_claims)
    acknowledge = operation(Outcomes.acknowledge)
    fail = operation(Outcomes.fail)
    release = operation(Outcomes.release)
    record_outcomes = operation(Outcomes.record)
    lock_held = operation(Outcomes.lock_held)
    own_outcomes = operation(Outcomes.own_outcomes)
    aborts_requested = operation(Aborts.aborts_requested)
    pause_queue = operation(Control.pause_queue)
    resume_queue = operation(Control.resume_queue)
    limit_queue = operation(Control.limit_queue)
    clear_queue_limits = operation(Control.clear_queue_limits)
    queue_limits = operation(Control.queue_limits)
    queue_states = operation(Control.queue_states)
    next_token_in = operation(Control.next_token_in)
    sweep = operation(Recovery.sweep)
    repair_ordering_keys = operation(Recovery.repair_ordering_keys)
    ensure_partitions = operation(Recovery.ensure_partitions)
    requeue_messages = operation(Operator.requeue_messages)
    redrive_messages = operation(Operator.redrive_messages)
    redrive_or_requeue = operation(Operator.redrive_or_requeue)
    dead_letter_messages = operation(Operator.dead_letter_messages)
    cancel_messages = operation(Operator.cancel_messages)
    purge_messages = operation(Operator.purge_messages)
    apply_retention = operation(Operator.apply_retention)
    cleanup_completed_messages = operation(Operator.cleanup_completed_messages)
    blocked_keys = operation(Keys.blocked_keys)
    key_head = operation(Keys.key_head)
    skip_key_head = operation(Keys.skip_key_head)
    requeue_key_head = operation(Keys.requeue_key_head)
    dispatch_candidates = operation(Dispatch.dispatch_candidates)
    mark_dispatched = operation(Dispatch.mark_dispatched)
    get_message = operation(Reads.get_message)
    get_events = operation(Reads.get_events)
    aget_message = operation(Reads.aget_message)
    aget_events = operation(Reads.aget_events)
    verify_message_integrity = operation(Reads.verify_message_integrity)
    verify_message = operation(Reads.verify_message)
    replication_status = operation(Reads.replication_status)
    register_replication_node = operation(Nodes.register_replication_node)
    heartbeat_node = operation(Nodes.heartbeat_node)
    unregister_replication_node = operation(Nodes.unregister_replication_node)
    get_replication_targets = operation(Nodes.get_replication_targets)

    # The names renamed in 0.3 (docs/upgrading.md), warning until 0.4.
    claim_next = deprecated(Leases.claim)
    mark_processing = deprecated(Leases.claim_message)
    acknowledge_message = deprecated(Outcomes.acknowledge)
    mark_failed = deprecated(Outcomes.fail)
    release_lease = deprecated(Outcomes.release)
    complete = deprecated(Outcomes.record)
    recover_orphaned_messages = deprecated(Recovery.sweep)
    retry_message = deprecated(Operator.redrive_or_requeue)


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes (used by tools and tests)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
