"""The task backend honours Django's Tasks contract where Django's own test suite found it did not
(issue 25, point 9): argument errors are TypeErrors, ``QUEUES: []`` is any queue, floats keep their
type, failed tasks keep their errors (long and multi-line messages, odd module paths), and the
signals fire when what they announce is true: ``task_enqueued`` after commit, ``task_finished``
after the outcome is stored. Real database, real worker threads."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from tests.infra import contract_tasks as ct
from tests.infra import task_functions as tf
from zeroloss.integrations.tasks_backend import InvalidTask, compat
from zeroloss.ledger.models import Message
from zeroloss.runtime.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

FAILED, SUCCESSFUL = compat.TaskResultStatus.FAILED, compat.TaskResultStatus.SUCCESSFUL


def run(queue: str = "default", n: int = 1) -> None:
    worker = Worker([queue], poll_interval=0.05, max_messages=n)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the worker did not finish in 60 s"


def once(task: Any) -> Any:
    return dataclasses.replace(task, max_attempts=1)


@pytest.mark.parametrize("args", [(object(),), ({1, 2},), ({1: "a"},)])
def test_arguments_that_are_not_json_raise_type_error(args):
    with pytest.raises(TypeError, match=r"must be JSON|dict keys must be strings") as info:
        tf.echo.enqueue(*args)
    assert isinstance(info.value, InvalidTask)  # still the framework's and zeroloss's error
    assert Message.objects.count() == 0


def test_empty_queues_means_any_queue():
    tasks = {"default": {"BACKEND": "zeroloss.tasks_backend.ZeroLossBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks):
        anywhere = tf.add.using(queue_name="anywhere.at-all")
        result = anywhere.enqueue(2, 3)
        assert Message.objects.get(message_id=result.id).queue_name == "anywhere.at-all"
        run("anywhere.at-all")
        assert anywhere.get_result(result.id).return_value == 5


def test_an_integral_float_comes_back_a_float():
    result = ct.returns.enqueue({"price": 1.0, "big": 1e16, "n": 1})
    assert result.args == [{"price": 1.0, "big": 1e16, "n": 1}]
    run()
    done = ct.returns.get_result(result.id)
    assert done.status == SUCCESSFUL
    [arg] = done.args
    assert {k: type(v) for k, v in arg.items()} == {"price": float, "big": float, "n": int}
    assert {k: type(v) for k, v in done.return_value.items()} == {"price": float, "big": float, "n": int}


@pytest.mark.parametrize("length", [6_000, 20_000])
def test_a_failed_task_with_a_long_message_has_its_error(length):
    result = once(ct.raise_value_error).enqueue("x" * length)
    run()
    failed = ct.raise_value_error.get_result(result.id)
    assert failed.status == FAILED
    [error] = failed.errors
    assert error.exception_class_path == "builtins.ValueError" and error.traceback


def test_an_exception_under_a_builtins_module_path_keeps_its_path():
    result = once(ct.raise_shadowed).enqueue()
    run()
    [error] = ct.raise_shadowed.get_result(result.id).errors
    assert error.exception_class_path == "mypkg.builtins.errors.ShadowedError"
    builtin = once(ct.raise_value_error).enqueue("builtins.are here")
    run()
    [error] = ct.raise_value_error.get_result(builtin.id).errors
    assert error.exception_class_path == "builtins.ValueError"


def test_a_multi_line_messages_traceback_starts_at_its_first_line():
    result = once(ct.raise_value_error).enqueue("first line\nsecond line\nthird")
    run()
    [error] = ct.raise_value_error.get_result(result.id).errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert error.traceback.rstrip().endswith("ValueError: first line\nsecond line\nthird")


def test_task_enqueued_fires_after_commit_only():
    sent: list[str] = []

    def on_enqueued(sender, task_result, **kwargs):
        sent.append(task_result.id)

    compat.task_enqueued.connect(on_enqueued)
    try:
        with transaction.atomic():
            tf.add.enqueue(1, 2)
            transaction.set_rollback(True)
        assert sent == []
        with transaction.atomic():
            committed = tf.add.enqueue(3, 4)
            assert sent == []  # not yet: the transaction may still roll back
        assert sent == [committed.id]
        outside = tf.add.enqueue(5, 6)  # autocommit: at once
        assert sent == [committed.id, outside.id]
    finally:
        compat.task_enqueued.disconnect(on_enqueued)


@pytest.mark.parametrize(
    ("task", "args", "status"), [(tf.add, (1, 2), "completed"), (ct.raise_value_error, ("no",), "dead")]
)
def test_task_finished_fires_after_the_outcome_is_stored(task, args, status):
    stored: list[tuple[str, str]] = []

    def on_finished(sender, task_result, **kwargs):
        # Read on another connection would be stricter; this one sees only committed rows too
        # (autocommit, outside the worker's transaction).
        stored.append((str(task_result.status), Message.objects.get(message_id=task_result.id).status))

    compat.task_finished.connect(on_finished)
    try:
        once(task).enqueue(*args)
        run()
    finally:
        compat.task_finished.disconnect(on_finished)
    assert stored == [(str(SUCCESSFUL if status == "completed" else FAILED), status)]
