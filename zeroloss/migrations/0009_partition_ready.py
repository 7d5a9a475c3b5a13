from typing import Any

from django.db import migrations, models

KEY_TABLE = "zeroloss_message_key"


def prepare_keys(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL: no LIKE index on the ids (Django adds one to a text primary key, at the end of
    the migration; nothing searches ids by prefix, and every send would pay for it); the id of
    every stored message recorded, and the head of every ordering key."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.deferred_sql = [
        sql for sql in schema_editor.deferred_sql if not (KEY_TABLE in str(sql) and "_like" in str(sql))
    ]
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {KEY_TABLE} (message_id, created_at) SELECT message_id, created_at "
            "FROM zeroloss_message ON CONFLICT DO NOTHING"
        )
        cursor.execute(
            "INSERT INTO zeroloss_ordering_head (queue_name, ordering_key, message_pk, since) "
            "SELECT queue_name, ordering_key, id, statement_timestamp() FROM zeroloss_message "
            "WHERE ordering_key <> '' AND status IN ('pending', 'processing') AND available_at IS NOT NULL "
            "ON CONFLICT DO NOTHING"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("zeroloss", "0008_cancel"),
    ]

    operations = [
        migrations.CreateModel(
            name="MessageKey",
            fields=[
                (
                    "message_id",
                    models.CharField(
                        max_length=255, primary_key=True, serialize=False, verbose_name="message id"
                    ),
                ),
                ("created_at", models.DateTimeField(verbose_name="created at")),
            ],
            options={
                "verbose_name": "message key",
                "verbose_name_plural": "message keys",
                "db_table": "zeroloss_message_key",
            },
        ),
        migrations.AddField(
            model_name="messageevent",
            name="message_created_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="message created at"),
        ),
        migrations.CreateModel(
            name="OrderingHead",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("queue_name", models.CharField(max_length=100, verbose_name="queue name")),
                ("ordering_key", models.CharField(max_length=255, verbose_name="ordering key")),
                ("message_pk", models.BigIntegerField(verbose_name="message pk")),
                ("since", models.DateTimeField(verbose_name="since")),
            ],
            options={
                "verbose_name": "ordering head",
                "verbose_name_plural": "ordering heads",
                "db_table": "zeroloss_ordering_head",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue_name", "ordering_key"), name="zeroloss_head_key_uniq"
                    )
                ],
            },
        ),
        migrations.RunPython(prepare_keys, migrations.RunPython.noop, elidable=False),
    ]
