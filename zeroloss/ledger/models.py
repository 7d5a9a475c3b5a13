"""The ledger. Only :mod:`zeroloss.ledger.service` writes these rows; everything else reads them."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from ..core.states import ACTIVE_STATUSES, LIVE_STATUSES, Reason, Status

__all__ = [
    "LIVE_STATUSES",
    "DedupKey",
    "DroppedPeriod",
    "Message",
    "MessageEvent",
    "MessageKey",
    "NodeRole",
    "OrderingHead",
    "PurgeRecord",
    "Reason",
    "ReplicationNode",
    "Status",
]


class MessageQuerySet(models.QuerySet["Message"]):
    def pending(self) -> MessageQuerySet:
        return self.filter(status=Status.PENDING)

    def ready(self) -> MessageQuerySet:
        """Pending and claimable now (database clock)."""
        return self.filter(status=Status.PENDING, available_at__lte=Now())

    def processing(self) -> MessageQuerySet:
        return self.filter(status=Status.PROCESSING)

    def stuck(self) -> MessageQuerySet:
        """Processing with an expired lease: the sweep will requeue them."""
        return self.filter(status=Status.PROCESSING, lease_expires_at__lt=Now())

    def leased(self) -> MessageQuerySet:
        """Processing under a live lease."""
        return self.filter(status=Status.PROCESSING, lease_expires_at__gte=Now())

    def completed(self) -> MessageQuerySet:
        return self.filter(status=Status.COMPLETED)

    def dead(self) -> MessageQuerySet:
        return self.filter(status=Status.DEAD)

    def cancelled(self) -> MessageQuerySet:
        return self.filter(status=Status.CANCELLED)


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


class PurgeRecord(models.Model):
    """How many messages a purge deleted, so the conservation check stays exact after purges."""

    queue_name = models.CharField(_("queue name"), max_length=100)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices)
    count = models.PositiveIntegerField(_("count"))
    actor = models.CharField(_("actor"), max_length=255)
    purged_at = models.DateTimeField(_("purged at"))

    class Meta:
        verbose_name = _("purge record")
        verbose_name_plural = _("purge records")

    def __str__(self) -> str:
        return f"{self.count} {self.status} from {self.queue_name}"


class MessageKey(models.Model):
    """A stored message id and the day its message lives in (PostgreSQL; docs/scaling.md).

    The unique index of message ids, apart from the message table: a partitioned table can have
    no unique index without its partition key, and a resend days later must still find the first
    message. Every send on PostgreSQL inserts here first, in the same statement, and stores the
    message only if that insert did. SQLite's message table keeps its own unique index and
    leaves this table empty.
    """

    message_id = models.CharField(_("message id"), max_length=255, primary_key=True)
    #: The message's ``created_at``: which partition holds it.
    created_at = models.DateTimeField(_("created at"))

    class Meta:
        db_table = "zeroloss_message_key"
        verbose_name = _("message key")
        verbose_name_plural = _("message keys")

    def __str__(self) -> str:
        return self.message_id


class DroppedPeriod(models.Model):
    """A period a partition drop took whose message ids are still leaving the key table
    (PostgreSQL; docs/scaling.md, "Retention by partition").

    The drop counts the period into ``PurgeRecord`` rows and drops its audit partition at once;
    its message partition, detached, stays as the list of ids to delete from
    ``zeroloss_message_key`` in short batches, then is dropped with this row. Meanwhile a key
    stored within ``[starts_at, ends_at)`` belongs to no message: a resend of its id takes it.
    """

    #: The detached message partition (``zeroloss_message_p20261201``).
    table_name = models.CharField(_("table name"), max_length=63, primary_key=True)
    starts_at = models.DateTimeField(_("starts at"))
    ends_at = models.DateTimeField(_("ends at"))
    #: The highest message ``id`` whose key is deleted.
    cleaned_to = models.BigIntegerField(_("cleaned to"), default=0)
    dropped_at = models.DateTimeField(_("dropped at"))

    class Meta:
        db_table = "zeroloss_dropped_period"
        verbose_name = _("dropped period")
        verbose_name_plural = _("dropped periods")

    def __str__(self) -> str:
        return self.table_name


class MaintenanceTurn(models.Model):
    """Whose turn it is to run a maintenance duty of the whole deployment (retention), and
    until when (database clock): a process takes the turn only once ``due_at`` has passed,
    holds it while it runs (renewed), and leaves it due again ``RETENTION_EVERY`` later. A
    process gone mid-way loses its turn when it runs out."""

    name = models.CharField(_("name"), max_length=64, primary_key=True)
    holder = models.CharField(_("holder"), max_length=255)
    due_at = models.DateTimeField(_("due at"))

    class Meta:
        db_table = "zeroloss_maintenance"
        verbose_name = _("maintenance turn")
        verbose_name_plural = _("maintenance turns")

    def __str__(self) -> str:
        return f"{self.name}: {self.holder} until {self.due_at}"


class OrderingHead(models.Model):
    """The one head (claimable or processing message) of an ordering key (PostgreSQL).

    The message table's unique index ``zeroloss_ordering_head_uniq`` allows one head per key;
    a partitioned table cannot have it (a unique index there must hold the partition key), so on
    PostgreSQL the statement that releases a key's next message also claims the key's row here,
    and the one that finishes a head hands the row on or deletes it: a second head of a key is
    refused by this table's unique index, whatever the layout. SQLite keeps the message table's
    index and leaves this table empty.
    """

    queue_name = models.CharField(_("queue name"), max_length=100)
    ordering_key = models.CharField(_("ordering key"), max_length=255)
    #: The head's ``Message.id``.
    message_pk = models.BigIntegerField(_("message pk"))
    #: When it became the head (a row that outlives its head is repaired only well after this).
    since = models.DateTimeField(_("since"))

    class Meta:
        db_table = "zeroloss_ordering_head"
        verbose_name = _("ordering head")
        verbose_name_plural = _("ordering heads")
        constraints = [
            models.UniqueConstraint(fields=["queue_name", "ordering_key"], name="zeroloss_head_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.queue_name}:{self.ordering_key} -> {self.message_pk}"


class DedupKey(models.Model):
    """A deduplication window: sends with this queue and key return ``message_id`` until ``expires_at``."""

    queue_name = models.CharField(_("queue name"), max_length=100)
    dedup_key = models.CharField(_("dedup key"), max_length=255)
    message_id = models.CharField(_("message id"), max_length=255)
    expires_at = models.DateTimeField(_("expires at"))
    created_at = models.DateTimeField(_("created at"))

    class Meta:
        verbose_name = _("dedup key")
        verbose_name_plural = _("dedup keys")
        constraints = [
            models.UniqueConstraint(fields=["queue_name", "dedup_key"], name="zeroloss_dedup_key_uniq"),
        ]
        indexes = [models.Index(fields=["expires_at"], name="zeroloss_dedup_expires_idx")]

    def __str__(self) -> str:
        return f"{self.queue_name}:{self.dedup_key} -> {self.message_id}"


class NodeRole(models.TextChoices):
    PRIMARY = "primary", _("Primary")
    STANDBY = "standby", _("Standby")
    NODE = "node", _("Node")


class ReplicationNode(models.Model):
    """A replication node shared by every instance; liveness comes from ``last_seen_at``."""

    node_id = models.CharField(_("node id"), max_length=255, unique=True)
    address = models.CharField(_("address"), max_length=255, blank=True, default="")
    role = models.CharField(_("role"), max_length=16, choices=NodeRole.choices, default=NodeRole.NODE)
    metadata = models.JSONField(_("metadata"), default=dict, blank=True)
    replay_lsn = models.BigIntegerField(
        _("replay lsn"),
        null=True,
        blank=True,
        help_text=_("Last WAL position the standby reported replayed."),
    )
    flush_lsn = models.BigIntegerField(_("flush lsn"), null=True, blank=True)
    state = models.CharField(_("state"), max_length=32, blank=True, default="")
    sync_state = models.CharField(_("sync state"), max_length=16, blank=True, default="")
    registered_at = models.DateTimeField(_("registered at"))
    last_seen_at = models.DateTimeField(_("last seen at"))

    class Meta:
        verbose_name = _("replication node")
        verbose_name_plural = _("replication nodes")
        ordering = ["node_id"]

    def __str__(self) -> str:
        return self.node_id


class QueueControl(models.Model):
    """A queue's runtime control (docs/control.md): paused, limit overrides, the rate's bucket.

    Written only through the ledger (:mod:`zeroloss.ledger.control`): ``zeroloss_queue``, the
    admin and ``service.pause_queue(...)`` set the operator's part; claims of a limited queue
    lock the row and keep the rate limiter's token bucket in it, timed by the database clock.
    """

    queue_name = models.CharField(_("queue name"), max_length=100, primary_key=True)
    paused = models.BooleanField(_("paused"), default=False)
    #: Overrides of ``ZEROLOSS["QUEUES"][q]``'s limits (None: the setting's, if any).
    concurrency = models.PositiveIntegerField(_("concurrency"), null=True, blank=True)
    rate = models.CharField(_("rate"), max_length=32, blank=True, default="")
    #: The rate limiter's token bucket: tokens left at ``refilled_at`` (None: a full bucket).
    tokens = models.FloatField(_("tokens"), default=0.0)
    refilled_at = models.DateTimeField(_("refilled at"), null=True, blank=True)
    changed_by = models.CharField(_("changed by"), max_length=255, blank=True, default="")
    changed_at = models.DateTimeField(_("changed at"))

    class Meta:
        verbose_name = _("queue control")
        verbose_name_plural = _("queue controls")
        ordering = ["queue_name"]

    def __str__(self) -> str:
        return self.queue_name


class RateBucket(models.Model):
    """One advisory slot's share of a queue's rate limit (docs/control.md, PostgreSQL).

    A rate large enough for slot claims keeps its token bucket in ``SLOTS`` shares, one per
    slot, each holding ``1/SLOTS`` of the burst and refilling at ``1/SLOTS`` of the rate: a slot
    claim spends from its own slot's share only (no row another slot's claim waits for), the
    exact path from all of them. No row: a full share. Written only through the ledger.
    """

    queue_name = models.CharField(_("queue name"), max_length=100)
    slot = models.PositiveSmallIntegerField(_("slot"))
    #: Tokens left at ``refilled_at`` (the database clock).
    tokens = models.FloatField(_("tokens"))
    refilled_at = models.DateTimeField(_("refilled at"))

    class Meta:
        db_table = "zeroloss_rate_bucket"
        verbose_name = _("rate bucket")
        verbose_name_plural = _("rate buckets")
        constraints = [
            models.UniqueConstraint(fields=["queue_name", "slot"], name="zeroloss_rate_bucket_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.queue_name}#{self.slot}"
