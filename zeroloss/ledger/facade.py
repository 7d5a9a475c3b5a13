"""The service's stable surface: every public method, each an explicit delegation to one part.

:class:`zeroloss.service.ZeroLossMessageService` is this facade. It builds one
:class:`~.base.LedgerContext` and the parts over it, and names them: ``service.store``,
``service.leases``, ``service.outcomes``, ``service.aborts``, ``service.control``,
``service.recovery``, ``service.operator``, ``service.keys``, ``service.dispatch``,
``service.reads``, ``service.nodes``. The renamed methods' old names are :mod:`.deprecated`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import ZeroLossSettings
from ..models import Message, MessageEvent, ReplicationNode, Status
from ..outage import refused_for_storage
from ..rates import Rate
from .aborts import Aborts
from .base import LedgerContext
from .control import Control
from .dispatch import Dispatch
from .engine import Engine
from .integrity import Reads
from .keys import Keys
from .leases import Leases
from .limits import QueueLimits, QueueState
from .nodes import Nodes
from .operator import Operator
from .outcomes import Outcomes
from .persist import PersistedMessage, Store
from .sweep import Recovery
from .types import (
    CancelResult,
    Completion,
    CompletionReport,
    IntegrityReport,
    KeyHead,
    Lease,
    RecoveryReport,
)


class Facade:
    """Every public method of the service, each delegating to the part that does it."""

    # Set by the service's constructor (zeroloss.service): its context and its parts.
    context: LedgerContext
    settings: ZeroLossSettings
    using: str
    instance_id: str
    store: Store
    leases: Leases
    outcomes: Outcomes
    aborts: Aborts
    control: Control
    recovery: Recovery
    operator: Operator
    keys: Keys
    dispatch: Dispatch
    reads: Reads
    nodes: Nodes

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return self.context.connection

    @property
    def engine(self) -> Engine:
        return self.context.engine

    def database_now(self) -> dt.datetime:
        """The database clock, which decides every lease."""
        return self.context.database_now()

    def promote_keys(self, keys: Iterable[tuple[str, str]]) -> list[str]:
        """Make the next message of each ``(queue, ordering_key)`` claimable if the key has no head."""
        return self.context.promote_keys(keys)

    # -- store ---------------------------------------------------------------------------
    def persist_message(
        self,
        message_id: str,
        queue_name: str,
        data: Any,
        max_attempts: int | None = None,
        *,
        delay: float | dt.timedelta | None = None,
        actor: str | None = None,
        dispatched: bool = False,
        priority: int = 0,
        ordering_key: str = "",
        dedup_key: str = "",
        dedup_window: float | dt.timedelta | None = None,
        headers: dict[str, Any] | None = None,
    ) -> PersistedMessage:
        """Store a message (a full disk raises :class:`~zeroloss.exceptions.StorageFull`)."""
        try:
            return self.store.persist_message(
                message_id,
                queue_name,
                data,
                max_attempts,
                delay=delay,
                actor=actor,
                dispatched=dispatched,
                priority=priority,
                ordering_key=ordering_key,
                dedup_key=dedup_key,
                dedup_window=dedup_window,
                headers=headers,
            )
        except OperationalError as exc:
            refused_for_storage(exc, message_id, self.using)
            raise

    def persist_messages(
        self,
        items: Iterable[tuple[Any, ...]],
        *,
        max_attempts: int | None = None,
        delay: float | dt.timedelta | None = None,
        actor: str | None = None,
        dispatched: bool = False,
        priority: int = 0,
        ordering_key: str = "",
    ) -> list[PersistedMessage]:
        """Store many ``(message_id, queue_name, data[, headers])`` messages: all or nothing (a
        full disk raises :class:`~zeroloss.exceptions.StorageFull`)."""
        try:
            return self.store.persist_messages(
                items,
                max_attempts=max_attempts,
                delay=delay,
                actor=actor,
                dispatched=dispatched,
                priority=priority,
                ordering_key=ordering_key,
            )
        except OperationalError as exc:
            refused_for_storage(exc, None, self.using)
            raise

    # -- leases --------------------------------------------------------------------------
    def claim(self, queue_name: str, limit: int = 1) -> list[Lease]:
        """Claim up to ``limit`` available messages of a queue (highest priority, then oldest)."""
        return self.leases.claim(queue_name, limit)

    def next_available_in(self, queue_names: Sequence[str]) -> float | None:
        """Seconds until the earliest pending message of these queues is available (0 or less:
        one is now; None: none is pending), by the database clock. Idle workers sleep that long."""
        return self.leases.next_available_in(queue_names)

    def claim_message(self, message_id: str) -> Lease | None:
        """Claim one pending, available message."""
        return self.leases.claim_message(message_id)

    def renew_lease(self, message_id: str, lease_token: uuid.UUID | str) -> bool:
        """Extend a live lease by ``ACK_TIMEOUT``."""
        return self.leases.renew_lease(message_id, lease_token)

    def renew_leases(self, leases: Iterable[Lease]) -> set[str]:
        """Renew many live leases in one statement; returns the ids whose lease was renewed."""
        return self.leases.renew_leases(leases)

    def busy_leases(self, leases: Iterable[Lease]) -> set[str]:
        """Of leases a renewal skipped, those still held and unexpired (their rows locked elsewhere)."""
        return self.leases.busy_leases(leases)

    def release_unknown_claims(self, held: Iterable[Lease] = ()) -> list[str]:
        """After a claim whose commit outcome was lost: give back this instance's other leases."""
        return self.leases.release_unknown_claims(held)

    # -- outcomes ------------------------------------------------------------------------
    def acknowledge(self, message_id: str, lease_token: uuid.UUID | str, *, result: Any = None) -> bool:
        """Complete the message, only for the holder of the current, unexpired lease (fencing)."""
        return self.outcomes.acknowledge(message_id, lease_token, result=result)

    def fail(self, message_id: str, lease_token: uuid.UUID | str, error: str) -> bool:
        """Record a failed attempt: back to pending after a backoff, or dead when attempts are spent."""
        return self.outcomes.fail(message_id, lease_token, error)

    def release(self, message_id: str, lease_token: uuid.UUID | str) -> bool:
        """Give back a claimed message that was never started (clean shutdown)."""
        return self.outcomes.release(message_id, lease_token)

    def record_outcomes(self, completions: Iterable[Completion], *, locked: bool = False) -> CompletionReport:
        """Record many outcomes: one fenced statement per kind, all in one transaction."""
        return self.outcomes.record(completions, locked=locked)

    def lock_held(self, leases: Sequence[Lease]) -> set[str]:
        """Inside ``transaction.atomic``: lock the rows of ``leases`` still held (fenced, unexpired)."""
        return self.outcomes.lock_held(leases)

    def own_outcomes(self, leases: Sequence[Lease]) -> dict[str, str]:
        """Which of these leases' outcomes this instance recorded (message id -> reason)."""
        return self.outcomes.own_outcomes(leases)

    # -- aborts --------------------------------------------------------------------------
    def aborts_requested(self, leases: Iterable[Lease]) -> set[str]:
        """The ids of ``leases`` (still held) whose abort an operator requested."""
        return self.aborts.aborts_requested(leases)

    # -- control -------------------------------------------------------------------------
    def pause_queue(self, queue_name: str, *, actor: str | None = None) -> None:
        """Stop claims of the queue (every worker within 1 s); sends are accepted and wait."""
        return self.control.pause_queue(queue_name, actor=actor)

    def resume_queue(self, queue_name: str, *, actor: str | None = None) -> None:
        """Let the queue be claimed again (a paused queue's waiting messages go at once)."""
        return self.control.resume_queue(queue_name, actor=actor)

    def limit_queue(
        self,
        queue_name: str,
        *,
        concurrency: int | None = None,
        rate: str | Rate | None = None,
        actor: str | None = None,
    ) -> None:
        """Override the queue's limits (None: no override, the setting's applies)."""
        return self.control.limit_queue(queue_name, concurrency=concurrency, rate=rate, actor=actor)

    def clear_queue_limits(self, queue_name: str, *, actor: str | None = None) -> None:
        """Remove the queue's overrides: its ``ZEROLOSS["QUEUES"]`` limits (if any) apply again."""
        return self.control.clear_queue_limits(queue_name, actor=actor)

    def queue_limits(self, queue_name: str, concurrency: int | None = None, rate: str = "") -> QueueLimits:
        """The limits in effect, given the queue's overrides (its control row's columns)."""
        return self.control.queue_limits(queue_name, concurrency, rate)

    def queue_states(self) -> list[QueueState]:
        """Every queue with a control row or a limit in the settings, by name."""
        return self.control.queue_states()

    def next_token_in(self, queue_name: str) -> float | None:
        """Seconds until the queue's rate allows its next claim, if this process's last claim of it found no
        token (None otherwise); read once.
        """
        return self.control.next_token_in(queue_name)

    # -- recovery ------------------------------------------------------------------------
    def sweep(self, *, batch_size: int | None = None, limit: int | None = None) -> RecoveryReport:
        """Requeue (or dead-letter) every processing message whose lease expired, exactly once."""
        return self.recovery.sweep(batch_size=batch_size, limit=limit)

    def repair_ordering_keys(self, *, limit: int = 1000) -> list[str]:
        """Release the next message of every ordering key that has waiting messages but no head."""
        return self.recovery.repair_ordering_keys(limit=limit)

    def ensure_partitions(self) -> list[str]:
        """A partitioned ledger (PostgreSQL): create the periods missing from now's to
        ``PARTITIONS_AHEAD`` ahead (the sweep does it once a minute); the partitions created."""
        return self.recovery.ensure_partitions()

    # -- operator ------------------------------------------------------------------------
    def requeue_messages(
        self, message_ids: Sequence[str], *, actor: str | None = None, force: bool = False, detail: str = ""
    ) -> list[str]:
        """Operator requeue of processing messages whose lease expired (stuck), exactly once."""
        return self.operator.requeue_messages(message_ids, actor=actor, force=force, detail=detail)

    def redrive_messages(
        self, message_ids: Sequence[str], *, actor: str | None = None, detail: str = ""
    ) -> list[str]:
        """Move dead letters back to pending with attempts reset."""
        return self.operator.redrive_messages(message_ids, actor=actor, detail=detail)

    def redrive_or_requeue(self, message_id: str, *, actor: str | None = None, force: bool = False) -> bool:
        """An operator's requeue of one dead or stuck message."""
        return self.operator.redrive_or_requeue(message_id, actor=actor, force=force)

    def dead_letter_messages(
        self, message_ids: Sequence[str], *, reason: str, actor: str | None = None
    ) -> list[str]:
        """Dead-letter pending or processing messages by hand (a live lease is revoked)."""
        return self.operator.dead_letter_messages(message_ids, reason=reason, actor=actor)

    def cancel_messages(
        self, message_ids: Sequence[str], *, abort: bool = False, actor: str | None = None, detail: str = ""
    ) -> list[CancelResult]:
        """Cancel pending messages; with ``abort=True`` also ask running ones to stop."""
        return self.operator.cancel_messages(message_ids, abort=abort, actor=actor, detail=detail)

    def purge_messages(
        self,
        *,
        status: str = Status.COMPLETED,
        older_than: float | dt.timedelta,
        queue_name: str | None = None,
        batch_size: int = 1000,
        actor: str | None = None,
        limit: int | None = None,
    ) -> int:
        """Delete completed or dead messages (and their audit rows) older than ``older_than``."""
        return self.operator.purge_messages(
            status=status,
            older_than=older_than,
            queue_name=queue_name,
            batch_size=batch_size,
            actor=actor,
            limit=limit,
        )

    def apply_retention(
        self, *, actor: str | None = None, batch_size: int = 1000, deadline: float | None = None
    ) -> dict[str, int]:
        """Remove the finished messages past ``RETENTION`` (and each queue's own), audited as
        a purge; the messages removed by status (docs/settings.md#retention)."""
        return self.operator.apply_retention(actor=actor, batch_size=batch_size, deadline=deadline)

    def cleanup_completed_messages(self, older_than: float | dt.timedelta | None = None) -> int:
        """Purge completed messages older than ``older_than`` (default ``COMPLETED_RETENTION``)."""
        return self.operator.cleanup_completed_messages(older_than)

    # -- keys ----------------------------------------------------------------------------
    def blocked_keys(self, queue: str | None = None, limit: int = 50) -> list[KeyHead]:
        """Keys with messages waiting behind a head that cannot be claimed now, longest blocked first."""
        return self.keys.blocked_keys(queue, limit)

    def key_head(self, queue: str, key: str) -> KeyHead | None:
        """The head of one ordering key, blocked or not; ``None`` if the key has no live message."""
        return self.keys.key_head(queue, key)

    def skip_key_head(
        self,
        queue: str,
        key: str,
        *,
        reason: str,
        actor: str | None = None,
        message_id: str | None = None,
    ) -> str | None:
        """Dead-letter the key's head (reason ``key skipped: <reason>``) so its next message proceeds."""
        return self.keys.skip_key_head(queue, key, reason=reason, actor=actor, message_id=message_id)

    def requeue_key_head(
        self,
        queue: str,
        key: str,
        *,
        actor: str | None = None,
        force: bool = False,
        message_id: str | None = None,
    ) -> str | None:
        """Requeue the key's processing head (it stays the head): a stuck one, or with ``force`` a live one,
        whose worker is then fenced off.
        """
        return self.keys.requeue_key_head(queue, key, actor=actor, force=force, message_id=message_id)

    # -- dispatch ------------------------------------------------------------------------
    def dispatch_candidates(self, *, limit: int = 1000, grace: float = 1.0) -> list[tuple[str, str, float]]:
        """Pending, available messages that no live broker message is known to carry."""
        return self.dispatch.dispatch_candidates(limit=limit, grace=grace)

    def mark_dispatched(self, message_ids: Sequence[str], *, dispatched: bool = True) -> int:
        """Record that a broker message was (or, with ``dispatched=False``, was not) published."""
        return self.dispatch.mark_dispatched(message_ids, dispatched=dispatched)

    # -- reads ---------------------------------------------------------------------------
    def get_message(self, message_id: str) -> Message | None:
        """Reads.get_message."""
        return self.reads.get_message(message_id)

    def get_events(self, message_id: str) -> list[MessageEvent]:
        """Reads.get_events."""
        return self.reads.get_events(message_id)

    async def aget_message(self, message_id: str) -> Message | None:
        """:meth:`get_message` for async views."""
        return await self.reads.aget_message(message_id)

    async def aget_events(self, message_id: str) -> list[MessageEvent]:
        """:meth:`get_events` for async views."""
        return await self.reads.aget_events(message_id)

    def verify_message_integrity(self, message_id: str) -> IntegrityReport:
        """Check one message: present, checksum, lease, attempts, and *measured* replication."""
        return self.reads.verify_message_integrity(message_id)

    def verify_message(
        self,
        message: Message,
        now: dt.datetime | None = None,
        *,
        replication: bool = True,
        record: bool = True,
    ) -> IntegrityReport:
        """Check a loaded message (``now``: the database clock, read if not given)."""
        return self.reads.verify_message(message, now, replication=replication, record=record)

    def replication_status(self, message: Message | None = None, *, record: bool = True) -> Any:
        """Measured copies of ``message`` (a :class:`~zeroloss.replication.ReplicationStatus`);
        ``record=False`` never writes (see :func:`zeroloss.replication.measure`).
        """
        return self.reads.replication_status(message, record=record)

    # -- nodes ---------------------------------------------------------------------------
    def register_replication_node(
        self, node_id: str, address: str = "", *, role: str = "node", metadata: dict[str, Any] | None = None
    ) -> ReplicationNode:
        """Register a node, or refresh it (idempotent upsert); counts as a heartbeat."""
        return self.nodes.register_replication_node(node_id, address, role=role, metadata=metadata)

    def heartbeat_node(self, node_id: str) -> bool:
        """Nodes.heartbeat_node."""
        return self.nodes.heartbeat_node(node_id)

    def unregister_replication_node(self, node_id: str) -> bool:
        """Nodes.unregister_replication_node."""
        return self.nodes.unregister_replication_node(node_id)

    def get_replication_targets(self) -> list[ReplicationNode]:
        """Live nodes, ordered by node id, at most ``REPLICATION_FACTOR`` of them."""
        return self.nodes.get_replication_targets()
