from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("zeroloss", "0003_batch_guard"),
    ]

    operations = [
        # Nullable, no default: adding it rewrites nothing (metadata only on PostgreSQL and SQLite),
        # and rows written without headers (0.2 processes during a rolling upgrade) stay valid.
        migrations.AddField(
            model_name="message",
            name="headers",
            field=models.JSONField(blank=True, null=True, verbose_name="headers"),
        ),
    ]
