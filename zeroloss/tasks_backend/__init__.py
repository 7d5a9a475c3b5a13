"""zeroloss as Django's task backend (``django.tasks`` on Django 6, the ``django-tasks`` backport on 5.2).

::

    TASKS = {
        "default": {
            "BACKEND": "zeroloss.tasks_backend.ZeroLossBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 5},
        }
    }

A task is a ledger message: ``enqueue`` stores it with :func:`zeroloss.send` in the caller's
transaction, and ``zeroloss_worker --queue default`` runs it with every guarantee a handler
has (lease, heartbeat, fencing, sweep, retries with backoff, dead letters). Results are read
back from the ledger and its audit trail. See ``docs/django-tasks.md``.

Importing this package imports the Tasks framework (:mod:`.compat`); the rest of zeroloss
finds task queues through :mod:`.queues`, which does not.
"""

from __future__ import annotations

from .backend import InvalidTask, ZeroLossBackend, ZeroLossTask

__all__ = ["InvalidTask", "ZeroLossBackend", "ZeroLossTask"]
