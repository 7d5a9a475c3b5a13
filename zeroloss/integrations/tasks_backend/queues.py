"""Which ledger queues are task queues, read from ``settings.TASKS`` (no framework import needed).

A task queue is a ledger queue like any other: its messages are claimed, leased and retried
by the same worker code, whose handler for it is :func:`zeroloss.tasks_backend.runner.run_task`.
:func:`zeroloss.runtime.handlers.get_handler` asks here when no ``@zeroloss.handler`` owns a queue.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

#: The dotted path ``TASKS[...]["BACKEND"]`` names.
BACKEND_PATH = "zeroloss.tasks_backend.ZeroLossBackend"
DEFAULT_QUEUE = "default"
#: The options ``TASKS[alias]["OPTIONS"]`` accepts.
OPTION_KEYS = frozenset({"MAX_ATTEMPTS"})


def _is_ours(path: Any) -> bool:
    if path == BACKEND_PATH:
        return True
    if not isinstance(path, str):
        return False
    try:
        cls = import_string(path)
    except ImportError:
        return False
    return isinstance(cls, type) and getattr(cls, "is_zeroloss_backend", False) is True


def zeroloss_backends() -> dict[str, dict[str, Any]]:
    """``TASKS`` entries (alias -> params) whose backend is :class:`ZeroLossBackend` (or a subclass)."""
    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return {}
    return {
        alias: params
        for alias, params in tasks.items()
        if isinstance(params, dict) and _is_ours(params.get("BACKEND"))
    }


def queues_of(params: dict[str, Any]) -> list[str]:
    queues = params.get("QUEUES", [DEFAULT_QUEUE])
    if isinstance(queues, str) or not isinstance(queues, list | tuple | set | frozenset):
        return []
    return [q for q in queues if isinstance(q, str)]


def any_queue() -> bool:
    """Whether a zeroloss task backend says ``QUEUES: []``: Django's "any queue" (each queue no
    ``@zeroloss.handler`` owns is then a task queue; workers name theirs: ``--queue``)."""
    if not framework_available():
        return False
    return any(params.get("QUEUES") == [] for params in zeroloss_backends().values())


def task_queues() -> list[str]:
    """Every queue some zeroloss task backend lists, sorted; none without a Tasks framework
    (``TASKS`` is then inert: system check ``zeroloss.W020``)."""
    if not framework_available():
        return []
    return sorted({q for params in zeroloss_backends().values() for q in queues_of(params)})


@functools.cache
def framework_available() -> bool:
    """Whether a Tasks framework is installed (``django.tasks`` or the backport), without importing it."""

    for name in ("django.tasks", "django_tasks"):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):  # ValueError: present in sys.modules as None (blocked)
            continue
    return False
