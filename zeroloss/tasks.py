"""The Celery tasks, where the project's ``app.autodiscover_tasks()`` looks for them (``<app>.tasks``):
defined in :mod:`zeroloss.integrations.celery.tasks`. Django's own task framework is served by
:mod:`zeroloss.tasks_backend`, a different thing."""

from .integrations.celery.tasks import deliver_message, schedule, sweep

__all__ = ["deliver_message", "schedule", "sweep"]
