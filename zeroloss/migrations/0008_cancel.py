# Cancel and abort: the cancelled status, its reasons, abort requests, their index, the permissions.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("zeroloss", "0007_queue_control"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="message",
            options={
                "permissions": [
                    ("requeue_message", "Can requeue stuck messages"),
                    ("force_requeue_message", "Can revoke a live lease and requeue"),
                    ("redrive_message", "Can redrive dead letters"),
                    ("deadletter_message", "Can dead-letter messages by hand"),
                    ("purge_message", "Can purge completed messages"),
                    ("cancel_message", "Can cancel pending messages"),
                    ("abort_message", "Can abort running messages"),
                ],
                "verbose_name": "message",
                "verbose_name_plural": "messages",
            },
        ),
        migrations.AddField(
            model_name="message",
            name="abort_requested_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="abort requested at"),
        ),
        migrations.AlterField(
            model_name="message",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("processing", "Processing"),
                    ("completed", "Completed"),
                    ("dead", "Dead"),
                    ("cancelled", "Cancelled"),
                ],
                default="pending",
                max_length=16,
                verbose_name="status",
            ),
        ),
        migrations.AlterField(
            model_name="messageevent",
            name="reason",
            field=models.CharField(
                choices=[
                    ("persisted", "Persisted"),
                    ("claimed", "Claimed"),
                    ("acknowledged", "Acknowledged"),
                    ("failed", "Failed (will retry)"),
                    ("dead_lettered", "Dead-lettered (attempts spent)"),
                    ("lease_expired", "Lease expired"),
                    ("released", "Released unstarted"),
                    ("requeued_by_operator", "Requeued by an operator"),
                    ("redriven_by_operator", "Redriven by an operator"),
                    ("dead_lettered_by_operator", "Dead-lettered by an operator"),
                    ("cancelled_by_operator", "Cancelled by an operator"),
                    ("aborted", "Aborted"),
                    ("abort_requested", "Abort requested"),
                    ("duplicate_absorbed", "Duplicate absorbed"),
                ],
                max_length=40,
                verbose_name="reason",
            ),
        ),
        migrations.AlterField(
            model_name="purgerecord",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("processing", "Processing"),
                    ("completed", "Completed"),
                    ("dead", "Dead"),
                    ("cancelled", "Cancelled"),
                ],
                max_length=16,
                verbose_name="status",
            ),
        ),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                condition=models.Q(("status", "cancelled")),
                fields=["queue_name", "updated_at"],
                name="zeroloss_msg_cancelled_idx",
            ),
        ),
    ]
