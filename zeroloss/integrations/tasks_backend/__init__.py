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

The names below are imported lazily: only they need the Tasks framework (:mod:`.compat`), so
the rest of zeroloss (:mod:`.queues`, :mod:`.runner`) works without it installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["InvalidTask", "InvalidTaskArguments", "ZeroLossBackend", "ZeroLossTask"]

if TYPE_CHECKING:
    from .backend import InvalidTask, InvalidTaskArguments, ZeroLossBackend, ZeroLossTask


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import backend  # deferred: only these names need the Tasks framework

        return getattr(backend, name)
    raise AttributeError(f"module 'zeroloss.tasks_backend' has no attribute {name!r}")
