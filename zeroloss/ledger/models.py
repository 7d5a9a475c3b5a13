"""The ledger. Only :mod:`zeroloss.ledger.service` writes these rows; everything else reads them."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..core.states import ACTIVE_STATUSES, LIVE_STATUSES, Reason, Status
from .querysets import MessageQuerySet
from .side_tables import (
    DedupKey,
    DroppedPeriod,
    MaintenanceTurn,
    MessageKey,
    NodeRole,
    OrderingHead,
    PurgeRecord,
    QueueControl,
    RateBucket,
    ReplicationNode,
)

__all__ = [
    "ACTIVE_STATUSES",
    "LIVE_STATUSES",
    "DedupKey",
    "Dependency",
    "DroppedPeriod",
    "FanIn",
    "MaintenanceTurn",
    "Message",
    "MessageEvent",
    "MessageKey",
    "NodeRole",
    "OrderingHead",
    "PurgeRecord",
    "QueueControl",
    "RateBucket",
    "Reason",
    "ReplicationNode",
    "Status",
    "Workflow",
]


class Message(models.Model):
    """One message and its current state. Its history is in :class:`MessageEvent`."""

    # Unique through Meta.constraints, not unique=True: on PostgreSQL that would add a second,
    # varchar_pattern_ops index for LIKE queries nothing runs, paid for on every insert.
    message_id = models.CharField(_("message id"), max_length=255)
    queue_name = models.CharField(_("queue name"), max_length=100)
    payload = models.JSONField(_("payload"))
    checksum = models.CharField(
        _("checksum"), max_length=64, help_text=_("SHA-256 of the canonical JSON payload.")
    )
    #: Metadata sent with the payload (trace and correlation ids): ``send(..., headers=...)``. Not
    #: part of the checksum; NULL when a message has none (the common case costs nothing).
    headers = models.JSONField(_("headers"), null=True, blank=True)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    max_attempts = models.PositiveIntegerField(_("max attempts"))
    #: Claims take higher priority first (-100..100, Django's task priority range).
    # Database defaults too: rows written by a 0.1 process during a rolling upgrade stay valid.
    priority = models.SmallIntegerField(_("priority"), default=0, db_default=0)
    #: Messages of one queue sharing a non-empty key are handled one at a time, in order.
    ordering_key = models.CharField(_("ordering key"), max_length=255, blank=True, default="", db_default="")
    available_at = models.DateTimeField(
        _("available at"),
        null=True,
        blank=True,
        help_text=_(
            "Not claimable before this time; empty while waiting behind an earlier message of its key."
        ),
    )
    lease_token = models.UUIDField(_("lease token"), null=True, blank=True)
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    claimed_by = models.CharField(_("claimed by"), max_length=255, blank=True, default="")
    started_at = models.DateTimeField(
        _("started at"), null=True, blank=True, help_text=_("When the current attempt started.")
    )
    last_error = models.TextField(_("last error"), blank=True, default="")
    #: What the handler (or task) returned, as JSON; set with the acknowledgement.
    result = models.JSONField(_("result"), null=True, blank=True)
    replication_targets = models.JSONField(_("replication targets"), default=list, blank=True)
    commit_lsn = models.BigIntegerField(
        _("commit lsn"),
        null=True,
        blank=True,
        help_text=_("PostgreSQL WAL position at or after this message's commit."),
    )
    dispatched_at = models.DateTimeField(
        _("dispatched at"), null=True, blank=True, help_text=_("Last publish to the broker.")
    )
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"))
    completed_at = models.DateTimeField(_("completed at"), null=True, blank=True)
    dead_at = models.DateTimeField(_("dead at"), null=True, blank=True)
    #: Set by an operator's abort of a processing message: its handler is asked to stop, and
    #: whatever it returns, the message ends ``cancelled`` (docs/control.md).
    abort_requested_at = models.DateTimeField(_("abort requested at"), null=True, blank=True)
    #: A workflow's step (docs/workflows.md): its workflow's id ("" for a message of its own),
    #: its name there, how many groups of its dependencies are still unsettled, and what it
    #: does when a dependency ends dead or cancelled (``wait``, ``cancel``, ``run``).
    workflow_id = models.CharField(_("workflow"), max_length=255, blank=True, default="", db_default="")
    step_name = models.CharField(_("step"), max_length=255, blank=True, default="", db_default="")
    waiting_on = models.PositiveIntegerField(_("waiting on"), default=0, db_default=0)
    on_upstream_failure = models.CharField(
        _("on upstream failure"), max_length=8, blank=True, default="", db_default=""
    )

    objects = MessageQuerySet.as_manager()

    class Meta:
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        indexes = [
            # Claims: highest priority, then oldest available pending message of a queue.
            # Partial, so retained completed rows and messages waiting for their ordering
            # key's head never enter it.
            models.Index(
                fields=["queue_name", "-priority", "available_at", "id"],
                name="zeroloss_msg_claim_idx",
                condition=Q(status=Status.PENDING, available_at__isnull=False),
            ),
            # The next message of an ordering key, promoted when its head finishes.
            models.Index(
                fields=["queue_name", "ordering_key", "id"],
                name="zeroloss_msg_waiting_idx",
                condition=Q(status=Status.PENDING, available_at__isnull=True),
            ),
            # The sweep: processing messages by lease expiry.
            models.Index(
                fields=["lease_expires_at"],
                name="zeroloss_msg_lease_idx",
                condition=Q(status=Status.PROCESSING),
            ),
            models.Index(
                fields=["queue_name", "dead_at"],
                name="zeroloss_msg_dead_idx",
                condition=Q(status=Status.DEAD),
            ),
            # Cancelled messages: counted by the snapshot (with the other partial indexes), and
            # found by age for a purge.
            models.Index(
                fields=["queue_name", "updated_at"],
                name="zeroloss_msg_cancelled_idx",
                condition=Q(status=Status.CANCELLED),
            ),
            # Retention purge of completed messages.
            models.Index(
                fields=["completed_at"], name="zeroloss_msg_done_idx", condition=Q(status=Status.COMPLETED)
            ),
            models.Index(fields=["queue_name", "status"], name="zeroloss_msg_queue_status_idx"),
            models.Index(fields=["created_at"], name="zeroloss_msg_created_idx"),
            models.Index(
                fields=["workflow_id"], name="zeroloss_msg_workflow_idx", condition=~Q(workflow_id="")
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["message_id"], name="zeroloss_message_id_uniq"),
            # At most one head (claimable or processing message) per ordering key: the
            # database itself refuses a second, whatever the code does.
            models.UniqueConstraint(
                fields=["queue_name", "ordering_key"],
                name="zeroloss_ordering_head_uniq",
                condition=Q(status__in=list(ACTIVE_STATUSES), available_at__isnull=False)
                & ~Q(ordering_key=""),
            ),
        ]
        permissions = [
            ("requeue_message", _("Can requeue stuck messages")),
            ("force_requeue_message", _("Can revoke a live lease and requeue")),
            ("redrive_message", _("Can redrive dead letters")),
            ("deadletter_message", _("Can dead-letter messages by hand")),
            ("purge_message", _("Can purge completed messages")),
            ("cancel_message", _("Can cancel pending messages")),
            ("abort_message", _("Can abort running messages")),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} ({self.queue_name}, {self.status})"


class MessageEventQuerySet(models.QuerySet["MessageEvent"]):
    def for_message(self, message_id: str) -> MessageEventQuerySet:
        return self.filter(message__message_id=message_id).order_by("id")


class MessageEvent(models.Model):
    """Append-only audit trail: one row per transition, written in the transition's transaction."""

    # No database-level FK constraint: purges delete events and messages in one set-based
    # statement pair, and the conservation check (zeroloss_verify) reports any orphan.
    # db_index=False: the (message, id) index below serves every lookup by message.
    message = models.ForeignKey(
        Message,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="events",
        verbose_name=_("message"),
    )
    from_status = models.CharField(_("from status"), max_length=16, blank=True, default="")
    to_status = models.CharField(_("to status"), max_length=16)
    reason = models.CharField(_("reason"), max_length=40, choices=Reason.choices)
    actor = models.CharField(_("actor"), max_length=255)
    attempt = models.PositiveIntegerField(_("attempt"), default=0)
    detail = models.TextField(_("detail"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"))
    #: The message's ``created_at``, copied into each of its audit rows: the partition key of a
    #: partitioned ledger (docs/scaling.md), so that a message and its whole history sit in the
    #: same day's partitions. NULL on rows written before 0.3.
    message_created_at = models.DateTimeField(_("message created at"), null=True, blank=True)

    objects = MessageEventQuerySet.as_manager()

    class Meta:
        verbose_name = _("message event")
        verbose_name_plural = _("message events")
        indexes = [
            models.Index(fields=["message", "id"], name="zeroloss_event_msg_idx"),
            models.Index(fields=["created_at"], name="zeroloss_event_created_idx"),
            models.Index(fields=["reason", "created_at"], name="zeroloss_event_reason_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.from_status or '-'} -> {self.to_status} ({self.reason}) by {self.actor}"


from .workflow_models import Dependency, FanIn, Workflow  # noqa: E402  (the app's models, one module)
