"""Public path of the Celery beat entries (docs/celery.md), safe to import from a project's
``celery.py``: defined in :mod:`zeroloss.integrations.celery.beat`."""

from .integrations.celery.beat import beat_schedule_entry, scheduler_beat_entry

__all__ = ["beat_schedule_entry", "scheduler_beat_entry"]
