"""zeroloss as Django's task backend, in-process: enqueue in the caller's transaction, results read
from the ledger (status mapping, times, errors, workers, return value), async tasks and the async
API, signals, per-task options and bad input. Real database, real worker threads."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

import zeroloss
from tests.infra import task_functions as tf
from tests.support import expire_leases, make_available
from zeroloss.core.states import Status
from zeroloss.exceptions import InvalidMessage
from zeroloss.integrations.tasks_backend import InvalidTask, ZeroLossBackend, ZeroLossTask, compat
from zeroloss.integrations.tasks_backend.backend import STATUS_MAP
from zeroloss.ledger.models import Message, MessageEvent
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.runtime.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

READY, RUNNING, SUCCESSFUL, FAILED = (
    compat.TaskResultStatus.READY,
    compat.TaskResultStatus.RUNNING,
    compat.TaskResultStatus.SUCCESSFUL,
    compat.TaskResultStatus.FAILED,
)


def run(queue: str = "default", n: int = 1) -> Worker:
    """A real worker (threads, leases, keeper, sweep) that stops after ``n`` outcomes."""
    worker = Worker([queue], poll_interval=0.05, max_messages=n)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the worker did not finish in 60 s"
    return worker


def message(result) -> Message:
    return Message.objects.get(message_id=result.id)


def test_the_backend_is_zeroloss_and_its_capabilities_are_true():
    backend = compat.task_backends["default"]
    assert type(backend) is ZeroLossBackend
    assert backend.task_class is ZeroLossTask
    assert (
        backend.supports_defer,
        backend.supports_priority,
        backend.supports_get_result,
        backend.supports_async_task,
    ) == (True, True, True, True)
    assert backend.queues == {"default", "demo.tasks"}


def test_enqueue_stores_a_ledger_message():
    result = tf.echo.enqueue(1, "two", [3], flag=True)
    assert result.status == READY
    m = message(result)
    assert (m.queue_name, m.status, m.priority, m.max_attempts, m.attempts) == (
        "demo.tasks",
        "pending",
        -5,
        5,
        0,
    )
    assert m.payload == {
        "task": "tests.infra.task_functions.echo",
        "backend": "default",
        "args": [1, "two", [3]],
        "kwargs": {"flag": True},
        "run_after": None,
    }
    assert result.enqueued_at == m.created_at
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None, None, None)
    assert (result.args, result.kwargs, result.errors, result.worker_ids) == (
        [1, "two", [3]],
        {"flag": True},
        [],
        [],
    )
    assert list(MessageEvent.objects.filter(message=m).values_list("reason", flat=True)) == ["persisted"]
    again = tf.echo.get_result(result.id)
    assert (again.id, again.status, again.args, again.kwargs, again.enqueued_at) == (
        result.id,
        READY,
        [1, "two", [3]],
        {"flag": True},
        m.created_at,
    )
    assert again.task.priority == -5 and again.task.queue_name == "demo.tasks"


def test_a_rolled_back_transaction_enqueues_nothing():
    class Abort(Exception):
        pass

    enqueued = []

    def request() -> None:
        with transaction.atomic():
            enqueued.append(tf.add.enqueue(1, 2))
            assert message(enqueued[0]).status == "pending"  # stored, in the caller's transaction
            raise Abort

    with pytest.raises(Abort):
        request()
    [result] = enqueued
    assert Message.objects.count() == 0
    with pytest.raises(compat.TaskResultDoesNotExist):
        tf.add.get_result(result.id)
    run_worker_finds_nothing = Worker(["default"], burst=True, poll_interval=0.05).run()
    assert run_worker_finds_nothing.handled == 0


def test_a_committed_enqueue_runs_and_stores_its_return_value():
    with transaction.atomic():
        result = tf.add.enqueue(2, 3)
    run()
    done = tf.add.get_result(result.id)
    m = message(result)
    assert done.status == SUCCESSFUL and done.return_value == 5 and m.result == 5
    assert done.finished_at == m.completed_at
    assert done.started_at is not None and done.started_at == done.last_attempted_at
    assert done.enqueued_at <= done.started_at <= done.finished_at
    assert done.worker_ids == [MessageEvent.objects.get(message=m, reason="claimed").actor]
    assert done.attempts == 1 and done.errors == []


def test_run_after_is_the_messages_availability_time():
    when = timezone.now() + dt.timedelta(hours=1)
    result = tf.add.using(run_after=when).enqueue(1, 1)
    m = message(result)
    assert m.available_at is not None
    assert abs((m.available_at - when).total_seconds()) < 2
    assert ZeroLossMessageService().claim("default") == []  # not before its time
    assert tf.add.get_result(result.id).task.run_after == when


def test_priority_higher_first_then_oldest():
    low = tf.add.using(priority=-10).enqueue(0, 0)
    mid = tf.add.enqueue(0, 1)
    high = tf.add.using(priority=100).enqueue(0, 2)
    mid2 = tf.add.enqueue(0, 3)
    leases = ZeroLossMessageService().claim("default", limit=4)
    assert [x.message_id for x in leases] == [high.id, mid.id, mid2.id, low.id]
    assert [x.priority for x in leases] == [100, 0, 0, -10]


def test_status_mapping_through_every_ledger_state():
    """pending -> READY, processing -> RUNNING, a failed attempt awaiting its retry -> READY with its
    error, dead -> FAILED with every attempt's error."""
    failing = dataclasses.replace(tf.always_fails, max_attempts=2)
    result = failing.enqueue("boom")
    assert failing.get_result(result.id).status == READY

    service = ZeroLossMessageService(instance_id="observer")
    [lease] = service.claim("default")
    running = failing.get_result(result.id)
    assert running.status == RUNNING and running.worker_ids == ["observer"]
    assert running.started_at == running.last_attempted_at and running.finished_at is None
    assert service.release(lease.message_id, lease.token)  # unstarted: the attempt is not counted
    assert failing.get_result(result.id).worker_ids == []

    run()
    retrying = failing.get_result(result.id)
    assert retrying.status == READY and message(result).attempts == 1
    [error] = retrying.errors
    assert error.exception_class_path == "builtins.ValueError" and error.exception_class is ValueError
    assert "Traceback (most recent call last)" in error.traceback and "ValueError: boom" in error.traceback
    with pytest.raises(ValueError, match="not finished"):
        _ = retrying.return_value

    make_available([result.id])  # end the retry backoff now, as time would
    run()
    failed = failing.get_result(result.id)
    m = message(result)
    assert failed.status == FAILED and m.status == "dead" and m.attempts == 2
    assert [e.exception_class_path for e in failed.errors] == ["builtins.ValueError", "builtins.ValueError"]
    assert failed.finished_at == m.dead_at and len(failed.worker_ids) == 2 == failed.attempts
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value


def test_a_dead_task_redriven_runs_again():
    result = tf.attempt_number.enqueue()
    service = ZeroLossMessageService()
    assert service.dead_letter_messages([result.id], reason="test: given up by hand") == [result.id]
    assert tf.attempt_number.get_result(result.id).status == FAILED
    assert service.redrive_messages([result.id]) == [result.id]
    assert tf.attempt_number.get_result(result.id).status == READY
    run()
    done = tf.attempt_number.get_result(result.id)
    assert done.status == SUCCESSFUL and done.return_value["attempt"] == 1


def test_takes_context_attempt_is_the_ledger_attempt():
    result = tf.attempt_number.enqueue()
    crashed = ZeroLossMessageService(instance_id="crashed-worker")
    assert len(crashed.claim("default")) == 1  # its worker dies holding the lease
    assert expire_leases([result.id]) == 1
    assert ZeroLossMessageService().sweep().requeued == [result.id]
    run()
    done = tf.attempt_number.get_result(result.id)
    assert done.status == SUCCESSFUL and message(result).attempts == 2
    assert done.return_value == {"attempt": 2, "id": result.id, "workers": done.worker_ids}
    assert done.worker_ids[0] == "crashed-worker" and len(done.worker_ids) == 2 == done.attempts
    assert done.errors == []  # a killed attempt raised nothing; its worker id is on record


def test_an_async_task_runs_on_an_event_loop_in_the_worker():
    result = tf.async_add.enqueue(20, 22)
    run()
    done = tf.async_add.get_result(result.id)
    assert done.status == SUCCESSFUL
    assert done.return_value["sum"] == 42 and done.return_value["loop"].endswith("EventLoop")


def test_aenqueue_and_aget_result():
    result = async_to_sync(tf.add.aenqueue)(4, 5)
    assert message(result).status == "pending"  # committed: aenqueue runs in its own transaction
    assert async_to_sync(tf.add.aget_result)(result.id).status == READY
    run()
    assert async_to_sync(tf.add.aget_result)(result.id).return_value == 9


def test_the_frameworks_signals_are_sent():
    seen: list[tuple[str, str, str]] = []

    def receiver(name):
        def on(sender, task_result, **kwargs):
            seen.append((name, sender.__name__, str(task_result.status)))

        return on

    receivers = {
        compat.task_enqueued: receiver("enqueued"),
        compat.task_started: receiver("started"),
        compat.task_finished: receiver("finished"),
    }
    for signal, fn in receivers.items():
        signal.connect(fn)
    try:
        tf.add.enqueue(1, 1)
        run()
        failing = dataclasses.replace(tf.always_fails, max_attempts=1)
        failing.enqueue("last attempt")
        run()
    finally:
        for signal, fn in receivers.items():
            signal.disconnect(fn)
    assert seen == [
        ("enqueued", "ZeroLossBackend", READY),
        ("started", "ZeroLossBackend", RUNNING),
        ("finished", "ZeroLossBackend", SUCCESSFUL),
        ("enqueued", "ZeroLossBackend", READY),
        ("started", "ZeroLossBackend", RUNNING),
        ("finished", "ZeroLossBackend", FAILED),
    ]


def test_a_task_failure_is_logged_under_the_tasks_name(caplog: pytest.LogCaptureFixture):
    failing = dataclasses.replace(tf.always_fails, max_attempts=1)
    result = failing.enqueue("logged")
    with caplog.at_level("WARNING", logger="zeroloss"):
        run()
    (record,) = [r for r in caplog.records if "failed (attempt" in r.getMessage()]
    assert record.getMessage().startswith(
        f"{result.id}: task tests.infra.task_functions.always_fails failed (attempt 1 of 1): ValueError: logged"
    )
    assert "run_task" not in record.getMessage() and record.name == "zeroloss"
    assert (record.message_id, record.queue) == (result.id, "default")  # type: ignore[attr-defined]


def test_max_attempts_per_task_and_from_options():
    three_attempts: Any = tf.three_attempts  # a Task, whatever the decorator's stubs say
    result = three_attempts.enqueue()
    assert message(result).max_attempts == 3
    if compat.FRAMEWORK == "django_tasks" or django.VERSION >= (6, 1):
        assert compat.task(max_attempts=4)(three_attempts.func).max_attempts == 4
    else:  # Django 6.0's @task takes no extra keyword arguments: OPTIONS, or replace() as in tf
        with pytest.raises(TypeError):
            compat.task(max_attempts=4)
    assert message(tf.add.enqueue(1, 1)).max_attempts == 5  # OPTIONS["MAX_ATTEMPTS"] in settings
    tasks: dict[str, dict[str, Any]] = {
        "default": {"BACKEND": "zeroloss.tasks_backend.ZeroLossBackend", "QUEUES": ["default"]}
    }
    with override_settings(TASKS=tasks, ZEROLOSS={"MAX_ATTEMPTS": 7}):
        assert message(tf.add.enqueue(1, 1)).max_attempts == 7  # ZEROLOSS["MAX_ATTEMPTS"]
    tasks["default"]["OPTIONS"] = {"MAX_ATTEMPTS": 0}
    with override_settings(TASKS=tasks), pytest.raises(InvalidTask, match="MAX_ATTEMPTS"):
        tf.add.enqueue(1, 1)
    with pytest.raises(InvalidTask, match="max_attempts"):
        dataclasses.replace(tf.add, max_attempts=0)


@pytest.mark.parametrize(
    ("args", "kwargs", "text"),
    [
        ((object(),), {}, "must be JSON"),
        (({1, 2},), {}, "must be JSON"),
        ((), {"when": dt.datetime(2026, 1, 1)}, "must be JSON"),
        (({1: "a"},), {}, "dict keys must be strings"),
        ((float("nan"),), {}, "must be JSON"),
        (("x" * 300_000,), {}, "limit is"),
    ],
)
def test_arguments_that_are_not_json_are_refused(args, kwargs, text):
    with pytest.raises(InvalidTask, match=text) as info:
        tf.echo.enqueue(*args, **kwargs)
    assert isinstance(info.value, compat.InvalidTaskError) and isinstance(info.value, InvalidMessage)
    assert Message.objects.count() == 0


def test_invalid_tasks_are_refused():
    with pytest.raises(InvalidTask, match="not valid for backend"):
        tf.add.using(queue_name="elsewhere")
    with pytest.raises(InvalidTask, match="priority"):
        tf.add.using(priority=101)
    with pytest.raises(InvalidTask, match="module level"):

        @compat.task()
        def local() -> None:
            pass

    hidden = compat.task()(tf.not_a_task)  # module level, but its name imports the plain function
    with pytest.raises(InvalidTask, match="cannot be found by its import path"):
        hidden.enqueue()
    assert Message.objects.count() == 0


def test_a_return_value_that_is_not_json_fails_the_attempt():
    result = dataclasses.replace(tf.returns_a_set, max_attempts=1).enqueue()
    run()
    failed = tf.returns_a_set.get_result(result.id)
    assert failed.status == FAILED
    [error] = failed.errors
    assert error.exception_class_path == "builtins.TypeError" and "Unsupported type" in error.traceback


def test_unknown_ids_do_not_exist():
    other = zeroloss.send("demo.record", {"task": "tests.infra.task_functions.add", "backend": "default"})
    for bad in ["nope", "", "\x00", "x" * 300, other.message_id]:
        with pytest.raises(compat.TaskResultDoesNotExist):
            tf.add.get_result(bad)


def test_zeroloss_worker_runs_a_task_queue_by_name(capsys):
    result = tf.add.enqueue(7, 8)
    call_command("zeroloss_worker", "--queue", "default", "--burst", "--poll-interval", "0.05")
    assert tf.add.get_result(result.id).return_value == 15


def test_each_ledger_status_maps_to_the_frameworks_from_its_traits():
    assert set(STATUS_MAP) == set(Status)
    assert STATUS_MAP[Status.PENDING] == compat.TaskResultStatus.READY
    assert STATUS_MAP[Status.PROCESSING] == compat.TaskResultStatus.RUNNING
    assert STATUS_MAP[Status.COMPLETED] == compat.TaskResultStatus.SUCCESSFUL
    assert STATUS_MAP[Status.DEAD] == STATUS_MAP[Status.CANCELLED] == compat.TaskResultStatus.FAILED
