"""Async handlers (issue 25, point 1) and handlers that misbehave in their exceptions (issue 24,
defect 8): awaited to completion on the claim thread's event loop, several in flight, leases
renewed, ``HANDLER_TIMEOUT`` honoured; never acknowledged without having run."""

from __future__ import annotations

import asyncio
import threading
import warnings
from typing import Any

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.db import connections

import zeroloss
from tests.support import expire_leases, finish, register, run_worker
from tests.support.waiting import never_done, suspend, wait_for
from zeroloss.exceptions import InvalidHandler
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until
from zeroloss.runtime.handlers import HandlerSpec
from zeroloss.runtime.processing import Delivery, describe_error, run_handler
from zeroloss.runtime.worker.transport_runtime import DeliveryRuntime, deliver

pytestmark = pytest.mark.django_db(transaction=True)


def statuses() -> dict[str, str]:
    return dict(Message.objects.values_list("message_id", "status"))


def test_an_async_handler_runs_to_completion_before_it_is_acknowledged():
    done: list[str] = []

    async def handle(delivery: Delivery) -> None:
        await suspend()  # a real suspension: the effect happens after it
        done.append(delivery.message_id)

    register("a.basic", handle)
    ZeroLossMessageService().persist_messages([(f"a{i}", "a.basic", {"i": i}) for i in range(5)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        worker, thread = run_worker("a.basic", burst=True)
        thread.join(60)
    assert not worker.stats.crashed
    assert sorted(done) == [f"a{i}" for i in range(5)]
    assert set(statuses().values()) == {Status.COMPLETED}
    assert set(Message.objects.values_list("attempts", flat=True)) == {1}


def test_outcomes_due_while_async_handlers_are_in_flight_are_flushed_mid_batch(settings):
    """An outcome due (ACK_FLUSH_INTERVAL 0) while other handlers of its batch still run is
    flushed then, between two turns of the event loop: a flush inside the loop was refused by
    Django (SynchronousOnlyOperation) and stopped the worker."""
    settings.ZEROLOSS = {**settings.ZEROLOSS, "ASYNC_CONCURRENCY": 2, "ACK_FLUSH_INTERVAL": 0}

    async def handle(delivery: Delivery) -> None:
        for _ in range(int(delivery.payload["turns"])):  # unequal lengths: one ends, one runs on
            await suspend()

    register("a.midflush", handle)
    ZeroLossMessageService().persist_messages(
        [(f"m{i}", "a.midflush", {"turns": 1 + 3 * (i % 2)}) for i in range(6)]
    )
    worker, thread = run_worker("a.midflush", burst=True)
    thread.join(60)
    assert not worker.stats.crashed
    assert set(statuses().values()) == {Status.COMPLETED}
    acknowledged = MessageEvent.objects.filter(reason="acknowledged").values_list("created_at", flat=True)
    assert len(acknowledged) == 6 and len(set(acknowledged)) >= 2  # several flushes in one batch


def test_several_async_handlers_of_one_batch_are_in_flight_on_one_thread(settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "ASYNC_CONCURRENCY": 4}
    in_flight = 0
    most = 0
    threads: set[int] = set()
    four_together = asyncio.Event()

    async def handle(delivery: Delivery) -> None:
        nonlocal in_flight, most
        threads.add(threading.get_ident())
        in_flight += 1
        most = max(most, in_flight)
        if in_flight >= 4:
            four_together.set()
        # The first four wait for each other: they can only all arrive if they overlap.
        await asyncio.wait_for(four_together.wait(), 20)
        in_flight -= 1

    register("a.overlap", handle)
    ZeroLossMessageService().persist_messages([(f"o{i}", "a.overlap", {}) for i in range(10)])
    worker, thread = run_worker("a.overlap", burst=True, concurrency=1)
    thread.join(60)
    assert worker.stats.outcomes["completed"] == 10
    assert most == 4  # four at once, never more than ASYNC_CONCURRENCY
    assert len(threads) == 1


def test_an_async_handler_past_handler_timeout_is_cancelled_and_fails(settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "HANDLER_TIMEOUT": 0.3}
    cancelled = threading.Event()

    async def hangs(delivery: Delivery) -> None:
        try:
            await never_done()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    register("a.hang", hangs)
    ZeroLossMessageService().persist_message("h1", "a.hang", {}, max_attempts=1)
    _, thread = run_worker("a.hang", burst=True)
    thread.join(60)
    assert cancelled.is_set()
    message = Message.objects.get(message_id="h1")
    assert message.status == Status.DEAD
    assert message.last_error.startswith("zeroloss.processing.HandlerTimedOut: the async handler ran longer")
    assert "HANDLER_TIMEOUT (0.3s)" in message.last_error


def test_the_lease_of_a_running_async_handler_is_renewed(settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "HEARTBEAT_INTERVAL": 0.05}  # not ACK_TIMEOUT / 3
    claimed_until: dict[str, Any] = {}

    def lease_expiry(message_id: str) -> Any:
        return Message.objects.get(message_id=message_id).lease_expires_at

    async def slow(delivery: Delivery) -> None:
        first = claimed_until["first"] = await sync_to_async(lease_expiry)(delivery.message_id)

        def renewed() -> Any:
            now = lease_expiry(delivery.message_id)
            return now if now > first else None

        # until the keeper renewed the lease (at its next heartbeat)
        claimed_until["renewed"] = await sync_to_async(wait_for)("the lease renewed", renewed, 10, 0.025)

    register("a.renew", slow)
    ZeroLossMessageService().persist_message("r1", "a.renew", {})
    _, thread = run_worker("a.renew", burst=True)
    thread.join(60)
    # sync_to_async ran the queries on asgiref's one shared thread: close its connection.
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)
    assert claimed_until["renewed"] > claimed_until["first"]
    assert Message.objects.get(message_id="r1").status == Status.COMPLETED


def test_a_failing_async_handler_records_its_traceback():
    async def boom(delivery: Delivery) -> None:
        await suspend()
        raise ValueError("async failure")

    register("a.boom", boom)
    ZeroLossMessageService().persist_message("b1", "a.boom", {}, max_attempts=1)
    _, thread = run_worker("a.boom", burst=True)
    thread.join(60)
    message = Message.objects.get(message_id="b1")
    assert message.status == Status.DEAD
    assert message.last_error.startswith("ValueError: async failure")
    assert "in boom" in message.last_error


def test_transactional_is_refused_on_a_coroutine_function():
    async def book(delivery: Delivery) -> None: ...

    with pytest.raises(InvalidHandler, match="an async handler cannot be transactional"):
        zeroloss.handler("a.tx", transactional=True)(book)


def test_a_plain_handler_returning_an_awaitable_fails_and_is_never_acknowledged():
    async def real_work(delivery: Delivery) -> None:
        raise AssertionError("never awaited")

    def wrapper(delivery: Delivery) -> Any:  # a decorator that lost the coroutine function
        return real_work(delivery)

    register("a.returns", wrapper)
    ZeroLossMessageService().persist_message("w1", "a.returns", {}, max_attempts=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _, thread = run_worker("a.returns", burst=True)
        thread.join(60)
    message = Message.objects.get(message_id="w1")
    assert message.status == Status.DEAD
    assert message.last_error.startswith("zeroloss.processing.ReturnedAwaitable: handler ")
    assert "Declare the handler with 'async def'" in message.last_error
    assert "acknowledged" not in MessageEvent.objects.for_message("w1").values_list("reason", flat=True)


def test_the_celery_delivery_path_awaits_async_handlers():
    done: list[str] = []

    async def handle(delivery: Delivery) -> str:
        await suspend()
        done.append(delivery.message_id)
        return "ok"

    register("a.celery", handle)
    ZeroLossMessageService().persist_message("c1", "a.celery", {})
    try:
        assert deliver("c1") == "completed"  # what the Celery task calls
        assert done == ["c1"]
        assert wait_until(lambda: statuses()["c1"] == Status.COMPLETED, 30)
    finally:
        DeliveryRuntime.close_all()  # its keeper and flusher threads, and their connections


class Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ refuses")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ refuses")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_exception_whose_str_and_repr_raise_is_recorded_and_never_kills_the_thread(kind):
    def sync_handler(delivery: Delivery) -> None:
        raise Hostile()

    async def async_handler(delivery: Delivery) -> None:
        raise Hostile()

    queue = f"a.hostile.{kind}"
    register(queue, sync_handler if kind == "sync" else async_handler)
    service = ZeroLossMessageService()
    service.persist_message("x1", queue, {}, max_attempts=1)
    service.persist_message("x2", queue, {}, max_attempts=1)
    worker, thread = run_worker(queue, burst=True)
    thread.join(60)
    assert not worker.stats.crashed
    for message in Message.objects.all():
        assert message.status == Status.DEAD
        assert message.last_error.startswith(
            "tests.ledger.test_async_handlers.Hostile: <str() and repr() failed>"
        )
        assert "Traceback (most recent call last)" in message.last_error


def test_describe_error_never_raises_and_keeps_module_paths_that_contain_builtins():
    builtins_like = type("Error", (Exception,), {"__module__": "myapp.builtins.errors"})
    assert describe_error(builtins_like("x")).startswith("myapp.builtins.errors.Error: x")
    assert describe_error(ValueError("v")).startswith("ValueError: v")
    huge = describe_error(ValueError("y" * 100_000))
    assert huge.startswith("ValueError: yyy") and len(huge) <= 8192 * 4


def test_run_handler_awaits_an_async_callable_object_on_the_thread_loop():
    class Handler:
        async def __call__(self, delivery: Delivery) -> int:
            await suspend()
            return 7

    spec = HandlerSpec("a.obj", Handler(), store_result=True)
    assert spec.is_async
    service = ZeroLossMessageService()
    service.persist_message("obj1", "a.obj", {})
    lease = service.claim("a.obj")[0]
    run = run_handler(spec, Delivery(lease))
    assert run.ok and run.result == 7


def test_slow_async_handlers_keep_overlapping_batch_after_batch_on_one_reused_loop(settings):
    """Once the pace says "a second a message", a claim still covers ASYNC_CONCURRENCY messages:
    otherwise slow handlers would be claimed one at a time and never overlap again."""
    settings.ZEROLOSS = {**settings.ZEROLOSS, "ASYNC_CONCURRENCY": 5}
    waves = asyncio.Barrier(5)  # bound to the first loop that waits on it: one loop throughout
    loops: set[int] = set()

    async def slow(delivery: Delivery) -> None:
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.wait_for(waves.wait(), 20)  # five at a time, or this attempt fails
        await asyncio.sleep(0.2)  # slow: the pace alone would claim one message at a time

    register("a.slow", slow)
    ZeroLossMessageService().persist_messages([(f"s{i}", "a.slow", {}) for i in range(20)])
    worker, thread = run_worker("a.slow", burst=True, concurrency=1)
    thread.join(60)
    assert worker.stats.outcomes == {"completed": 20}
    assert len(loops) == 1
    assert set(Message.objects.values_list("attempts", flat=True)) == {1}


def test_an_async_handler_whose_lease_was_taken_over_is_cancelled(settings):
    # Its lease runs out (moved into the past, as a frozen worker's would), the sweep puts the
    # message back and another claim takes it: the worker cancels the old run within a keeper
    # pass and a poll (docs/control.md), rather than let it run beside the new one.

    settings.ZEROLOSS = {**settings.ZEROLOSS, "HEARTBEAT_INTERVAL": 0.05}
    started = threading.Event()
    cancelled = threading.Event()

    async def handle(delivery: Delivery) -> None:
        started.set()
        try:
            await never_done()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    register("async.taken_over", handle)
    service = ZeroLossMessageService()
    service.persist_message("to1", "async.taken_over", {})
    worker, thread = run_worker("async.taken_over", sweep=False)
    try:
        assert started.wait(30)
        assert expire_leases(["to1"]) == 1
        assert service.sweep().requeued == ["to1"]
        assert service.claim("async.taken_over")  # the next run's claim
        assert cancelled.wait(10), "the run whose lease was taken over still runs"
        assert wait_until(lambda: worker.stats.outcomes["lease_lost"] == 1, timeout=10), worker.stats
    finally:
        finish(worker, thread)


def test_hundreds_of_async_handlers_in_flight_complete_once_each(settings):
    # 300 in flight at once on one thread's loop (their lease checks every 0.25 s, not per
    # completion): every one completes, none is lost or run twice.
    runs: list[str] = []
    most = [0]
    now = [0]

    async def handle(delivery: Delivery) -> None:
        runs.append(delivery.message_id)
        now[0] += 1
        most[0] = max(most[0], now[0])
        await asyncio.sleep(0.5)
        now[0] -= 1

    settings.ZEROLOSS = {**settings.ZEROLOSS, "ASYNC_CONCURRENCY": 300}
    register("async.many", handle)
    service = ZeroLossMessageService()
    service.persist_messages([(f"am{i:03d}", "async.many", {}) for i in range(600)])
    worker, thread = run_worker("async.many", burst=True, concurrency=1, batch_size=300)
    try:
        wait_for(
            lambda: str(worker.stats),
            lambda: (
                Message.objects.filter(message_id__startswith="am", status=Status.COMPLETED).count() == 600
            ),
            120,
        )
    finally:
        finish(worker, thread)
    assert sorted(runs) == [f"am{i:03d}" for i in range(600)]  # each once
    assert most[0] >= 100, most  # they did run side by side
    assert worker.stats.outcomes["lease_lost"] == 0
