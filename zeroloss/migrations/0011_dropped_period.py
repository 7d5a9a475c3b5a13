from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("zeroloss", "0010_partitioned"),
    ]

    operations = [
        migrations.CreateModel(
            name="DroppedPeriod",
            fields=[
                (
                    "table_name",
                    models.CharField(
                        max_length=63, primary_key=True, serialize=False, verbose_name="table name"
                    ),
                ),
                ("starts_at", models.DateTimeField(verbose_name="starts at")),
                ("ends_at", models.DateTimeField(verbose_name="ends at")),
                ("cleaned_to", models.BigIntegerField(default=0, verbose_name="cleaned to")),
                ("dropped_at", models.DateTimeField(verbose_name="dropped at")),
            ],
            options={
                "verbose_name": "dropped period",
                "verbose_name_plural": "dropped periods",
                "db_table": "zeroloss_dropped_period",
            },
        ),
    ]
