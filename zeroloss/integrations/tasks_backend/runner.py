"""Running one task message in a worker: the handler of every task queue.

The worker claims, leases, renews and records a task exactly as a handler's message
(:func:`zeroloss.runtime.processing.run_handler` calls :func:`run_task`); this only turns the payload
back into a call, sends the framework's signals, and returns the JSON result the ledger stores.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ...core.states import Status
from ...ledger.validation import canonical_json
from ...runtime.delivery import call_when_stored
from ...runtime.handlers import HandlerSpec
from .queues import any_queue, task_queues

if TYPE_CHECKING:
    from ...runtime.delivery import Delivery


def run_task(delivery: Delivery) -> Any:
    # deferred: django.tasks or django-tasks is optional (without either, no task is ever run)
    from .compat import (
        TaskContext,
        TaskError,
        TaskResultStatus,
        normalize_json,
        task_backends,
        task_finished,
        task_started,
    )

    payload = delivery.payload
    if not isinstance(payload, dict) or "task" not in payload:
        raise ValueError(
            f"Message {delivery.message_id!r} on task queue {delivery.queue_name!r} is not a task."
        )
    backend = task_backends[payload.get("backend", "default")]
    result = backend.get_result(delivery.message_id)  # RUNNING, this attempt's worker included
    task = result.task
    task_started.send(type(backend), task_result=result)
    error = None
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        value = normalize_json(value)
        canonical_json(value)  # a return value the ledger cannot store fails the attempt
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        kind = type(exc)
        error = TaskError(
            exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
            traceback="".join(traceback.format_exception(kind, exc, exc.__traceback__)),
        )
        raise
    finally:
        # Finished (SUCCESSFUL, or FAILED on its last attempt) once the ledger holds the outcome.
        def finished(outcome: str) -> None:
            if outcome == "retrying":
                return
            if error is not None:
                result.errors.append(error)
            status = TaskResultStatus.SUCCESSFUL if outcome == Status.COMPLETED else TaskResultStatus.FAILED
            object.__setattr__(result, "status", status)
            object.__setattr__(result, "finished_at", timezone.now())
            if outcome == Status.COMPLETED:
                object.__setattr__(result, "_return_value", value)
            task_finished.send(type(backend), task_result=result)

        call_when_stored(delivery.message_id, finished)
    return value


def task_spec(queue_name: str) -> HandlerSpec | None:
    """The handler of a task queue, or ``None`` if no zeroloss task backend lists ``queue_name``."""

    if queue_name not in task_queues() and not any_queue():
        return None
    return HandlerSpec(queue_name, run_task, store_result=True, describe=describe_task)


def describe_task(payload: Any) -> str:
    """``task module.function``: what a failure's log record names (not :func:`run_task`)."""
    name = payload.get("task") if isinstance(payload, dict) else None
    return f"task {name}" if isinstance(name, str) else "task (a message that is not a task)"


class TaskQueues:
    """The task backend's queues, as a :class:`zeroloss.runtime.handlers.QueueSource`."""

    def spec(self, queue_name: str) -> HandlerSpec | None:
        return task_spec(queue_name)

    def queues(self) -> list[str]:

        return sorted(task_queues())


TASK_QUEUES = TaskQueues()
