"""The example project's Celery app: Celery is the transport, the ledger is the record."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["zeroloss"])


@app.on_after_finalize.connect
def _schedule_sweep(sender: Celery, **kwargs: object) -> None:
    from zeroloss.integrations.celery.beat import beat_schedule_entry

    sender.conf.beat_schedule = {**sender.conf.beat_schedule, **beat_schedule_entry()}
