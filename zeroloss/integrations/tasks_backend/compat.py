"""Django's Tasks framework, wherever it lives: ``django.tasks`` (Django 6) or the ``django-tasks``
backport (``django_tasks``, Django 5.2: ``pip install zeroloss[tasks]``).

Everything else in :mod:`zeroloss.tasks_backend` imports the framework from here only, so the
two spellings (``InvalidTask`` / ``InvalidTaskError``, where ``normalize_json`` lives) are
settled once. Importing this module without either raises ``ImportError``.
"""

from __future__ import annotations

from typing import Any

FRAMEWORK: str
BaseTaskBackend: Any
DEFAULT_TASK_QUEUE_NAME: str
InvalidTaskError: Any
Task: Any
TaskContext: Any
TaskError: Any
TaskResult: Any
TaskResultDoesNotExist: Any
TaskResultStatus: Any
normalize_json: Any
task: Any
task_backends: Any
task_enqueued: Any
task_finished: Any
task_started: Any

try:  # Django 6: built in
    from django.tasks import (  # type: ignore[no-redef,unused-ignore]
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef,unused-ignore]
    from django.tasks.base import TaskError  # type: ignore[no-redef,unused-ignore]
    from django.tasks.exceptions import (  # type: ignore[no-redef,unused-ignore]
        InvalidTask as InvalidTaskError,
    )
    from django.tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef,unused-ignore]
    from django.tasks.signals import (  # type: ignore[no-redef,unused-ignore]
        task_enqueued,
        task_finished,
        task_started,
    )
    from django.utils.json import normalize_json  # type: ignore[no-redef,unused-ignore]

    FRAMEWORK = "django.tasks"
except ImportError:  # Django 5.2: the backport
    from django_tasks import (  # type: ignore[no-redef,unused-ignore]
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef,unused-ignore]
    from django_tasks.base import Task, TaskError  # type: ignore[no-redef,unused-ignore]
    from django_tasks.exceptions import (  # type: ignore[no-redef,unused-ignore]
        InvalidTaskError,
        TaskResultDoesNotExist,
    )
    from django_tasks.signals import (  # type: ignore[no-redef,unused-ignore]
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json  # type: ignore[no-redef,unused-ignore]

    FRAMEWORK = "django_tasks"


__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
