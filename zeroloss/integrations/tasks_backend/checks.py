"""System checks of zeroloss task backends: E020-E023 and W020 (ids listed in :mod:`zeroloss.ops.checks`).

Importable without the Tasks framework installed: W020 is for exactly that case.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

from ...exceptions import InvalidMessage
from ...ledger.validation import validate_attempts, validate_queue_name
from ...runtime.handlers import _registry
from .queues import DEFAULT_QUEUE, OPTION_KEYS, framework_available, zeroloss_backends


@register()
def check_tasks(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E020-E023 and W020: every ``TASKS`` entry whose backend is zeroloss's."""

    return tasks_messages(zeroloss_backends(), set(_registry), framework_available())


def tasks_messages(
    backends: dict[str, dict[str, Any]], handler_queues: set[str], framework: bool
) -> list[CheckMessage]:
    """The checks of zeroloss task backends (alias -> ``TASKS`` entry), as pure data."""

    messages: list[CheckMessage] = []
    if backends and not framework:
        messages.append(
            Warning(
                f"TASKS names zeroloss's backend ({', '.join(sorted(backends))}) but no Tasks framework is "
                "installed: Django 6 has django.tasks built in; on Django 5.2 install the django-tasks "
                "backport (pip install 'zeroloss[tasks]'). Until then @task and TASKS do nothing.",
                hint="pip install 'zeroloss[tasks]', or remove TASKS.",
                obj="settings.TASKS",
                id="zeroloss.W020",
            )
        )
    for alias, params in sorted(backends.items()):
        obj = "settings.TASKS"
        queues = params.get("QUEUES", [DEFAULT_QUEUE])
        if isinstance(queues, str) or not isinstance(queues, list | tuple):
            messages.append(
                Error(
                    f"TASKS[{alias!r}]['QUEUES'] must be a list of queue names ([] for any queue), "
                    f"got {queues!r}.",
                    hint='For example "QUEUES": ["default"].',
                    obj=obj,
                    id="zeroloss.E020",
                )
            )
            queues = []
        for queue in queues:
            try:
                validate_queue_name(queue)
            except InvalidMessage as exc:
                messages.append(
                    Error(
                        f"TASKS[{alias!r}]['QUEUES']: {exc}",
                        hint="Each task queue is a zeroloss queue: use a valid queue name.",
                        obj=obj,
                        id="zeroloss.E020",
                    )
                )
                continue
            if queue in handler_queues:
                messages.append(
                    Error(
                        f"TASKS[{alias!r}]['QUEUES'] lists {queue!r}, which is also the queue of a "
                        "@zeroloss.handler: a queue has one owner, and its handler would be given the "
                        "tasks' messages.",
                        hint="Give the task queue or the handler's queue another name.",
                        obj=obj,
                        id="zeroloss.E021",
                    )
                )
        options = params.get("OPTIONS", {})
        if not isinstance(options, dict):
            messages.append(
                Error(
                    f"TASKS[{alias!r}]['OPTIONS'] must be a dict, got {options!r}.",
                    hint=f"Known options: {', '.join(sorted(OPTION_KEYS))}.",
                    obj=obj,
                    id="zeroloss.E022",
                )
            )
            continue
        for key in sorted(set(options) - OPTION_KEYS, key=str):
            messages.append(
                Error(
                    f"TASKS[{alias!r}]['OPTIONS'] has an unknown option {key!r}.",
                    hint=f"Known options: {', '.join(sorted(OPTION_KEYS))}.",
                    obj=obj,
                    id="zeroloss.E022",
                )
            )
        if "MAX_ATTEMPTS" in options:
            try:
                validate_attempts(options["MAX_ATTEMPTS"], f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS']")
            except InvalidMessage as exc:
                messages.append(
                    Error(
                        str(exc),
                        hint="Leave it out to use ZEROLOSS['MAX_ATTEMPTS'].",
                        obj=obj,
                        id="zeroloss.E023",
                    )
                )
    return messages
