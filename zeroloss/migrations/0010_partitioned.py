"""PostgreSQL: a new install's message and audit tables range-partitioned (docs/scaling.md).

Only empty tables are partitioned here; a populated ledger keeps its unpartitioned layout,
which every statement still serves. Django's model state is unchanged: the message table's
unique constraints are replaced on PostgreSQL by zeroloss_message_key and zeroloss_ordering_head
(migration 0009), and indexes of the same columns (zeroloss.ledger.partitions).
"""

from typing import Any

from django.db import migrations


def partition(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    from zeroloss.conf import get_settings
    from zeroloss.ledger import partitions

    settings = get_settings()
    partitions.partition_tables(connection, int(settings.PARTITION_PERIOD), settings.PARTITIONS_AHEAD)


class Migration(migrations.Migration):
    dependencies = [
        ("zeroloss", "0009_partition_ready"),
    ]

    operations = [
        migrations.RunPython(partition, migrations.RunPython.noop, elidable=False),
    ]
