"""``@task`` functions for the task backend tests (imported by real worker processes too)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from project.demo.models import OrderedRun
from tests.support.waiting import NEVER, suspend
from zeroloss.integrations.tasks_backend.compat import task


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="demo.tasks", priority=-5)
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task(takes_context=True)
def attempt_number(context) -> dict:
    return {
        "attempt": context.attempt,
        "id": context.task_result.id,
        "workers": context.task_result.worker_ids,
    }


@task()
def always_fails(text: str) -> None:
    raise ValueError(text)


@task()
def returns_a_set() -> set[int]:
    return {1, 2}


@task()
async def async_add(a: int, b: int) -> dict:
    await suspend()
    loop = asyncio.get_running_loop()
    return {"sum": a + b, "loop": type(loop).__name__}


@task(takes_context=True)
def slow_first_attempt(context, seconds: float) -> dict:
    """Records each start (committed at once); the first attempt then runs ``seconds`` long, so a
    test can SIGKILL its worker mid-task. Later attempts return at once."""
    OrderedRun.objects.create(
        message_id=context.task_result.id,
        ordering_key=f"attempt-{context.attempt}",
        worker=str(os.getpid()),
        started=time.time(),
    )
    if context.attempt == 1:
        NEVER.wait(seconds)  # busy until the test kills the worker
    return {"attempt": context.attempt}


def not_a_task() -> None:
    """A plain function, for the bad-input tests."""


def three_attempts() -> str:
    return "ok"


# Typed loosely: the stubs of one framework version do not know the other's keyword arguments.
_task: Any = task

try:  # the backport (and Django 6.1) pass extra @task keyword arguments to the backend's task class
    three_attempts = _task(max_attempts=3)(three_attempts)
except TypeError:  # Django 6.0's @task takes none: the field is set on the task object instead
    import dataclasses

    three_attempts = dataclasses.replace(_task()(three_attempts), max_attempts=3)


@task()
def raises_outcome(kind: str) -> None:
    """Raises ``zeroloss.Retry``, ``Snooze`` (each 60 s) or ``Fail``, as ``kind`` says."""
    import zeroloss

    if kind == "retry":
        raise zeroloss.Retry(delay=60, reason="try later")
    if kind == "snooze":
        raise zeroloss.Snooze(delay=60, reason="not yet")
    raise zeroloss.Fail("cannot be done")
