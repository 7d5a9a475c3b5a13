"""The ledger's side tables: what keeps the messages' ids and keys' heads unique, deduplication
windows, queue control and rate buckets, replication nodes, purge records and dropped periods,
maintenance turns. The messages and their audit rows are :mod:`.models`, which names these too."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..core.states import Status


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
