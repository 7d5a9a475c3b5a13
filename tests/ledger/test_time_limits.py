"""Time limits with the thread pool (issue 27, part C): ``soft_time_limit`` raises
``zeroloss.SoftTimeLimitExceeded`` in sync and async handlers; one that catches it and returns
completes; the hard ``time_limit`` (a thread cannot be stopped) lets the lease go, so the
message goes to another run and this run's outcome is refused. Real worker threads, the real
database; a lease runs out when the test moves its expiry into the past (the database clock
decides leases)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from django.core.checks import Error

import zeroloss
from tests.support import count_keeper_passes, expire_leases, finish, register, run_worker
from tests.support.waiting import hold_for, never_done, suspend
from zeroloss.conf import get_settings
from zeroloss.exceptions import InvalidHandler, LeaseLostInterrupt, SoftTimeLimitExceeded
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until
from zeroloss.ops.checks.time_limits import check_time_limits, limits_messages
from zeroloss.runtime import handlers
from zeroloss.runtime.handlers import HandlerSpec
from zeroloss.runtime.processing import Delivery, run_handler
from zeroloss.runtime.timelimits import soft_limit

pytestmark = pytest.mark.django_db(transaction=True)


def one(message_id: str) -> Message:
    return Message.objects.get(message_id=message_id)


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"soft_time_limit": 0}, "soft_time_limit must be a positive number of seconds (or None), got 0"),
        ({"time_limit": -1}, "time_limit must be a positive number of seconds (or None), got -1"),
        ({"time_limit": True}, "time_limit must be a positive number of seconds (or None), got True"),
        ({"time_limit": "5"}, "time_limit must be a positive number of seconds (or None), got '5'"),
        ({"soft_time_limit": float("inf")}, "soft_time_limit must be a positive number"),
        (
            {"soft_time_limit": 5, "time_limit": 5},
            "soft_time_limit (5s) must be shorter than time_limit (5s)",
        ),
        (
            {"soft_time_limit": 9, "time_limit": 3},
            "soft_time_limit (9s) must be shorter than time_limit (3s)",
        ),
    ],
)
def test_bad_limits_are_refused_at_registration_and_nothing_is_registered(kwargs: dict[str, Any], says: str):
    def bad(delivery: Delivery) -> None:
        pass

    with pytest.raises(InvalidHandler) as caught:
        zeroloss.handler("tl.bad", **kwargs)(bad)
    assert says in str(caught.value)
    assert "tl.bad" not in handlers._registry


def test_e060_a_soft_limit_not_shorter_than_handler_timeout_is_a_check_error(settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "HANDLER_TIMEOUT": 2}

    def slow(delivery: Delivery) -> None:
        pass

    register("tl.e060", slow, soft_time_limit=3)
    try:
        spec = handlers.get_handler("tl.e060")
        expected = Error(
            f"Handler {spec.name} of queue 'tl.e060' has soft_time_limit 3s, not shorter than its hard "
            "bound HANDLER_TIMEOUT (2s): the soft limit would never fire.",
            hint="Lower soft_time_limit, raise ZEROLOSS['HANDLER_TIMEOUT'], or give the handler its own "
            "time_limit (zeroloss documentation: Guides > Control: pause, limits, cancel, time limits, section "
            '"Time limits and the process pool").',
            obj="tl.e060",
            id="zeroloss.E060",
        )
        assert [m for m in check_time_limits() if m.obj == "tl.e060"] == [expected]
        # Its own time_limit is its hard bound: then the soft limit is fine.
        assert (
            limits_messages([HandlerSpec("tl.e060", slow, soft_time_limit=3, time_limit=4)], get_settings())
            == []
        )
    finally:
        handlers._registry.pop("tl.e060", None)


# -- the soft limit -------------------------------------------------------------------------------


def busy(seconds: float) -> None:
    """Pure-Python work (short sleeps): an asynchronous exception lands between two of them."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)  # short: PyThreadState_SetAsyncExc lands between bytecodes, not in a sleep


def test_a_sync_handler_past_its_soft_limit_fails_its_attempt_with_soft_time_limit_exceeded():
    ran: list[float] = []

    def handle(delivery: Delivery) -> None:
        ran.append(time.monotonic())
        busy(60)

    register("tl.sync_soft", handle, soft_time_limit=0.1)
    ZeroLossMessageService().persist_message("s1", "tl.sync_soft", {}, max_attempts=1)
    started = time.monotonic()
    worker, thread = run_worker("tl.sync_soft", burst=True)
    thread.join(60)
    assert not thread.is_alive() and not worker.stats.crashed
    message = one("s1")
    assert message.status == Status.DEAD  # its one attempt spent: dead-lettered like any exception
    assert message.last_error.startswith("zeroloss.exceptions.SoftTimeLimitExceeded")
    assert time.monotonic() - started < 30  # not the 60 s it would have run


def test_a_handler_that_catches_its_soft_limit_and_returns_completes():
    caught_after: list[float] = []

    def handle(delivery: Delivery) -> None:
        started = time.monotonic()
        try:
            busy(60)
        except SoftTimeLimitExceeded:
            caught_after.append(time.monotonic() - started)  # cleans up, returns: its outcome counts

    register("tl.sync_caught", handle, soft_time_limit=0.1, time_limit=30)
    ZeroLossMessageService().persist_message("c1", "tl.sync_caught", {})
    worker, thread = run_worker("tl.sync_caught", burst=True)
    thread.join(60)
    assert worker.stats.outcomes["completed"] == 1
    assert one("c1").status == Status.COMPLETED and one("c1").attempts == 1
    [after] = caught_after
    # raised at the soft limit: its timer starts just before the handler reads its own clock
    assert 0.08 <= after < 10


def test_the_soft_limit_is_never_raised_once_the_handler_has_returned():
    """The timer fires after the block ended, or while it ends: nothing reaches the code after."""
    raised = 0
    for _ in range(200):
        try:
            with soft_limit(0.0005):
                sum(range(50))
        except SoftTimeLimitExceeded:
            raised += 1  # inside the block: allowed (it ran to its limit)
        # Were an exception left pending, it would be raised here, outside any guard: pure
        # bytecode, where an asynchronous exception lands (past the 0.5 ms timer's firing).
        spin_until = time.monotonic() + 0.002
        while time.monotonic() < spin_until:
            pass
    assert raised < 200


def test_a_soft_limit_that_runs_out_before_its_timer_is_armed_is_raised_by_the_block():
    """A timer firing while Thread.start() still runs must not interrupt it (that surfaced as a
    KeyError from threading's bookkeeping): it marks itself due, and arming raises the limit."""
    from zeroloss.runtime.timelimits import ThreadGuard

    guard = ThreadGuard(threading.get_ident(), 3600)
    guard.fire(SoftTimeLimitExceeded)  # ran out before arm(): nothing is sent to the thread
    assert guard.due is SoftTimeLimitExceeded
    with pytest.raises(SoftTimeLimitExceeded):
        guard.arm()
    guard.disarm()
    guard.fire(LeaseLostInterrupt)  # a late firing after the block: nothing
    assert guard.sent == {SoftTimeLimitExceeded} and guard.state == "done"


def test_an_async_handler_past_its_soft_limit_gets_the_exception_in_its_task():
    seen: list[str] = []

    async def raises(delivery: Delivery) -> None:
        await never_done()

    async def catches(delivery: Delivery) -> str:
        try:
            await never_done()
        except SoftTimeLimitExceeded:
            seen.append(delivery.message_id)
            await suspend()  # it may still await while cleaning up
        return "cleaned up"

    register("tl.async_raises", raises, soft_time_limit=0.1)
    register("tl.async_catches", catches, soft_time_limit=0.1, time_limit=30, store_result=True)
    service = ZeroLossMessageService()
    service.persist_message("ar", "tl.async_raises", {}, max_attempts=1)
    service.persist_message("ac", "tl.async_catches", {})
    for queue in ("tl.async_raises", "tl.async_catches"):
        worker, thread = run_worker(queue, burst=True)
        thread.join(60)
        assert not thread.is_alive() and not worker.stats.crashed
    assert one("ar").status == Status.DEAD
    assert one("ar").last_error.startswith("zeroloss.exceptions.SoftTimeLimitExceeded")
    assert seen == ["ac"]
    assert one("ac").status == Status.COMPLETED and one("ac").result == "cleaned up"


def test_an_async_handler_past_its_own_time_limit_is_cancelled():
    async def hangs(delivery: Delivery) -> None:
        await never_done()

    register("tl.async_hard", hangs, time_limit=0.1)
    spec = handlers.get_handler("tl.async_hard")
    ZeroLossMessageService().persist_message("ah", "tl.async_hard", {})
    lease = ZeroLossMessageService().claim("tl.async_hard")[0]
    run = run_handler(spec, Delivery(lease), timeout=None)  # no HANDLER_TIMEOUT: its own limit
    assert not run.ok
    assert "ran longer than its time_limit (0.1s) and was cancelled" in run.error


# -- the hard limit with the thread pool ------------------------------------------------------------


def lease_expiry(message_id: str) -> object:
    return Message.objects.values_list("lease_expires_at", flat=True).get(message_id=message_id)


def test_a_thread_past_its_hard_limit_keeps_its_concurrency_slot_until_it_returns(caplog, settings):
    # Concurrency 1, the thread pool, a handler blocked past its hard limit: its lease (its slot)
    # is still renewed, so the sweep puts nothing back and a second worker starts no second run
    # while the first still runs; the first run's outcome is recorded when it returns.
    settings.ZEROLOSS = {**settings.ZEROLOSS, "HEARTBEAT_INTERVAL": 0.05}
    release = threading.Event()
    running: list[int] = []
    most = [0]
    lock = threading.Lock()

    def handle(delivery: Delivery) -> None:
        with lock:
            running.append(delivery.attempt)
            most[0] = max(most[0], len(running))
        try:
            if delivery.attempt == 1:
                release.wait(60)  # a thread cannot be stopped: it runs on past its hard limit
        finally:
            with lock:
                running.remove(delivery.attempt)

    register("tl.thread_hard_limited", handle, time_limit=0.2)
    service = ZeroLossMessageService()
    service.limit_queue("tl.thread_hard_limited", concurrency=1)
    service.persist_messages([(f"hl{i}", "tl.thread_hard_limited", {}) for i in range(2)])
    caplog.set_level(logging.WARNING, logger="zeroloss")
    worker, thread = run_worker("tl.thread_hard_limited", sweep=False)
    passes = count_keeper_passes(worker.keeper)
    other = other_thread = None
    try:
        assert wait_until(lambda: running == [1], timeout=30)
        [first] = [m for m in ("hl0", "hl1") if one(m).status == Status.PROCESSING]
        assert wait_until(lambda: "its lease (its slot) is kept until the handler returns" in caplog.text, 30)
        expiry, seen = lease_expiry(first), len(passes)
        assert wait_until(lambda: len(passes) >= seen + 3, timeout=30), "the keeper stopped"
        assert lease_expiry(first) != expiry, "the lease is no longer renewed: its slot would go with it"
        assert service.sweep().requeued == []
        other, other_thread = run_worker("tl.thread_hard_limited", sweep=False, instance_id="other")
        hold_for(1.0, lambda: assert_most(most, 1), interval=0.05)  # the other worker starts nothing
        release.set()
        assert wait_until(
            lambda: Message.objects.filter(status=Status.COMPLETED, message_id__startswith="hl").count() == 2,
            60,
        )
    finally:
        release.set()
        if other is not None and other_thread is not None:
            finish(other, other_thread)
        finish(worker, thread)
    print(f"thread pool past its hard limit, concurrency 1: most runs at once {most[0]}")
    assert most[0] == 1
    assert one(first).attempts == 1  # the run that outlived its hard limit was recorded, not re-run


def assert_most(most: list[int], bound: int) -> None:
    assert most[0] <= bound, most


def test_the_hard_limit_lets_the_lease_go_and_the_late_outcome_is_refused(caplog, settings):
    # Renewals every 50 ms: a few keeper passes without one take a fraction of a second.
    settings.ZEROLOSS = {**settings.ZEROLOSS, "HEARTBEAT_INTERVAL": 0.05}
    release = threading.Event()
    runs: list[int] = []

    def handle(delivery: Delivery) -> None:
        runs.append(delivery.attempt)
        if delivery.attempt == 1:
            release.wait(60)  # a thread cannot be stopped: it runs on past its hard limit

    register("tl.thread_hard", handle, time_limit=0.2)
    service = ZeroLossMessageService()
    service.persist_message("h1", "tl.thread_hard", {})
    caplog.set_level(logging.WARNING, logger="zeroloss")
    worker, thread = run_worker("tl.thread_hard", sweep=False)
    passes = count_keeper_passes(worker.keeper)
    try:
        assert wait_until(lambda: runs == [1], timeout=30)
        assert wait_until(
            lambda: "h1: its handler has run longer than its hard time limit (0.2s" in caplog.text, 30
        )
        # No renewal any more: the keeper passes by (twice: one may have begun before the
        # warning) and the lease's expiry stays where it was; then it runs out, as time would.
        expiry, seen = lease_expiry("h1"), len(passes)
        assert wait_until(lambda: len(passes) >= seen + 2, timeout=30), "the keeper stopped"
        assert lease_expiry("h1") == expiry, "the lease is still being renewed"
        assert expire_leases(["h1"]) == 1
        assert service.sweep().requeued == ["h1"]
        # The same worker's other thread is busy: a second worker takes the message and completes it.
        other, other_thread = run_worker("tl.thread_hard", sweep=False, instance_id="other")
        try:
            assert wait_until(lambda: one("h1").status == Status.COMPLETED, timeout=60)
        finally:
            finish(other, other_thread)
        release.set()  # the first run returns at last: its acknowledgement is fenced off
        assert wait_until(lambda: worker.stats.outcomes["lease_lost"] == 1, timeout=30), worker.stats
    finally:
        release.set()
        finish(worker, thread)
    assert runs == [1, 2]
    message = one("h1")
    assert message.status == Status.COMPLETED and message.attempts == 2
    acks = MessageEvent.objects.for_message("h1").filter(reason="acknowledged")
    assert acks.count() == 1  # the refused run left no second acknowledgement


def test_a_handler_whose_lease_was_taken_over_gets_lease_lost_interrupt_after_its_c_call(settings):
    # The lease is taken from a running worker (moved into the past, swept, claimed by another
    # service). Its keeper's next renewal is refused and LeaseLostInterrupt is raised in the
    # handler's thread: a handler blocked in one C call (a lock's wait) gets it when that call
    # returns, before its next line runs; the run's outcome is refused; `except Exception` in
    # the handler does not catch it.
    settings.ZEROLOSS = {**settings.ZEROLOSS, "HEARTBEAT_INTERVAL": 0.05}
    in_c_call = threading.Event()
    ended: list[str] = []

    def handle(delivery: Delivery) -> None:
        try:
            in_c_call.set()
            time.sleep(1.5)  # one C call: the interrupt waits for it
            ended.append("went on after the C call")
            while True:
                time.sleep(0.005)
        except Exception as exc:  # not this one: a BaseException
            ended.append(f"caught {type(exc).__name__}")
        except LeaseLostInterrupt:
            ended.append("LeaseLostInterrupt")
            raise

    register("tl.taken_over", handle)
    service = ZeroLossMessageService()
    service.persist_message("to1", "tl.taken_over", {})
    worker, thread = run_worker("tl.taken_over", sweep=False)
    try:
        assert in_c_call.wait(30)
        started = time.monotonic()
        assert expire_leases(["to1"]) == 1
        assert service.sweep().requeued == ["to1"]
        assert service.claim("tl.taken_over")  # another run holds it now
        assert wait_until(lambda: ended != [], timeout=30), worker.stats
        stopped_s = time.monotonic() - started
        assert wait_until(lambda: worker.stats.outcomes["lease_lost"] == 1, timeout=30), worker.stats
    finally:
        finish(worker, thread)
    print(f"lease taken over during a 1.5 s C call: the handler stopped {stopped_s:.2f} s later")
    assert ended == ["LeaseLostInterrupt"]  # right after the C call, not one line further
    assert 0.5 < stopped_s < 5  # the sleep ran to its end first
    assert one("to1").attempts == 2 and one("to1").status == Status.PROCESSING  # the new run's
