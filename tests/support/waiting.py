"""Bounded waits on readiness: the one poll loop the tests share.

A test waits for what it needs to be true (a row in the ledger, a log line, a socket accepting, a
process gone), never for a length of time; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Never set: ``NEVER.wait(seconds)`` blocks the calling thread for ``seconds`` (``None``: until the
#: process ends): the blocking call of a handler that must run into its time limit. An exception
#: raised by a signal handler (a pool child's SIGUSR1) interrupts it, as it interrupts any blocking
#: call.
NEVER = threading.Event()


async def never_done() -> None:
    """An await nothing completes: only what is thrown into it (a cancellation, a time limit's
    SoftTimeLimitExceeded) ends it."""
    await asyncio.Event().wait()


async def suspend() -> None:
    """A real suspension point: control goes back to the event loop once; no time passes."""
    await asyncio.sleep(0)  # asyncio's own spelling of "yield to the loop"


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T | None:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass
    (``None``). Polls once more at the deadline, so a slow machine's last chance is not lost."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(interval, left))  # the shared poll interval: what is polled has no event to wait on


def wait_for(
    what: str | Callable[[], str], predicate: Callable[[], T], timeout: float, interval: float = 0.05
) -> T:
    """:func:`wait_until`, failing the test with ``what`` (what was expected; a callable is asked
    at the deadline, for the state then) on timeout."""
    value = wait_until(predicate, timeout, interval)
    if not value:
        raise AssertionError(f"{what() if callable(what) else what}: not so after {timeout:g} s")
    return value


def pause(stop: threading.Event, seconds: float) -> bool:
    """A gap in a schedule (a fault plan's random pause, an outage's length, a send rate): wait
    ``seconds``, or less if ``stop`` is set meanwhile; True when it was.

    Unlike a sleep the gap is interruptible: the run's teardown (or a part of the run that failed)
    sets ``stop`` and every thread waiting out a gap goes on at once, instead of the teardown waiting
    for the longest gap still running."""
    return stop.wait(max(0.0, seconds))


def hold_for(seconds: float, check: Callable[[], object], interval: float = 0.05) -> None:
    """An observation window: call ``check`` every ``interval`` seconds for ``seconds`` seconds.

    For a promise that nothing happens for a while (a paused queue starts nothing, a renewed lease
    is never swept): ``check`` asserts the promise (or samples what is measured) each time, so a
    breach fails the test when it happens, with the state then, and not only at the window's end."""
    end = time.monotonic() + seconds

    def held() -> bool:
        check()
        return time.monotonic() >= end

    wait_until(held, seconds, interval)
