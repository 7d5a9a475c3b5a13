"""Running one claimed message's handler, and what a handler receives.

Shared by the built-in worker (:mod:`zeroloss.runtime.worker`) and the Celery delivery task, so both
follow the same path and the same guarantees. A handler's failure is anything it raises,
``SystemExit`` included (``sys.exit()`` or argparse inside a library): it is recorded as a
failed attempt, never allowed to end the worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import logging
import threading
import time
import traceback
from collections.abc import Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..ledger import events
from ..ledger.types import Completion, Lease, Verdict
from ..ledger.validation import MAX_ERROR_LENGTH, canonical_json, clean_text
from .delivery import Delivery, LeaseLost
from .handlers import HandlerSpec
from .retry import Fail, Retry, Snooze, seconds_of
from .timelimits import async_soft_limit, hard_limit, soft_limit

if TYPE_CHECKING:
    from ..ledger.engine import Engine

__all__ = [
    "Delivery",
    "HandlerRun",
    "HandlerTimedOut",
    "LeaseLost",
    "Outcome",
    "ReturnedAwaitable",
    "describe_error",
    "judge",
    "run_async_handler",
    "run_handler",
    "run_in_savepoint",
    "thread_event_loop",
]

logger = logging.getLogger("zeroloss")


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"  # back to pending after a backoff, or dead: see the ledger
    LEASE_LOST = "lease_lost"  # the lease expired or was revoked: another run owns it now
    ABSORBED = "absorbed"  # a duplicate delivery: nothing claimable, handler not run
    RELEASED = "released"  # given back unstarted (shutdown, or behind a long handler)
    CANCELLED = "cancelled"  # aborted by an operator while it ran: recorded cancelled


@dataclass(frozen=True, slots=True)
class HandlerRun:
    """What one run of a handler produced."""

    ok: bool
    seconds: float
    result: Any = None
    error: str = ""
    #: What a failure asks for (:func:`judge`): ``FAIL`` (retried after ``delay``, None: the
    #: settings' backoff), ``SNOOZE`` (after ``delay``, not counted) or ``FAIL_FINAL`` (dead now).
    verdict: Verdict = Verdict.FAIL
    delay: float | None = None
    #: Steps the handler added to its workflow (``delivery.workflow.step``).
    steps: tuple[Any, ...] = ()

    def completion(self, lease: Lease) -> Completion:
        if self.ok:
            return Completion(lease, Verdict.ACKNOWLEDGE, result=self.result, steps=self.steps)
        return Completion(lease, self.verdict, error=self.error, delay=self.delay)


def _safe_text(exc: BaseException) -> str:
    """``str(exc)``, whatever its ``__str__`` does (raise, return a non-string): never raises."""
    try:
        text = str(exc)
        if isinstance(text, str):
            return text
    except BaseException:  # a hostile __str__ must not cost the message its record
        pass
    try:
        return f"<str() failed; repr: {exc!r}>"
    except BaseException:
        return "<str() and repr() failed>"


def _class_path(kind: type) -> str:
    try:
        module = getattr(kind, "__module__", None) or "?"
        name = getattr(kind, "__qualname__", None) or getattr(kind, "__name__", "?")
        # Only Python's own exceptions are written without a module ("ValueError").
        return str(name) if module == "builtins" else f"{module}.{name}"
    except BaseException:
        return "?"


def describe_error(exc: BaseException) -> str:
    """``module.Class: message`` on the first line, then the traceback (most recent call last).

    Always storable and never raises, whatever the exception does (a ``__str__`` or ``__repr__``
    that raises is described as such): NUL characters and lone surrogates are escaped, and a
    long traceback keeps its first line and its end, within ``MAX_ERROR_LENGTH``.
    """
    kind = type(exc)
    head = f"{_class_path(kind)}: {_safe_text(exc)}"
    try:
        tb = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
    except BaseException:
        tb = "(the traceback could not be formatted)\n"
    text = f"{head}\n{tb}"
    if len(text) > MAX_ERROR_LENGTH:
        head = head[: MAX_ERROR_LENGTH // 2]
        keep = MAX_ERROR_LENGTH - len(head) - 40
        text = f"{head}\n[... traceback cut ...]\n{tb[-keep:]}"
    return clean_text(text)


class ReturnedAwaitable(TypeError):
    """A plain (``def``) handler returned an awaitable: it would never have run."""


class HandlerTimedOut(TimeoutError):
    """An async handler ran longer than its ``time_limit`` (else ``HANDLER_TIMEOUT``) and was cancelled."""


def log_extra(delivery: Delivery, worker: str) -> dict[str, Any]:
    """The structured fields of every log record about one message (docs/logging.md)."""
    return {
        "message_id": delivery.message_id,
        "queue": delivery.queue_name,
        "attempt": delivery.attempt,
        "worker": worker,
    }


def judge(spec: HandlerSpec, attempt: int, exc: BaseException) -> tuple[Verdict, float | None, str]:
    """What a handler's exception asks for, by its retry policy: the verdict, the delay before
    the message may run again (None: ``RETRY_BACKOFF``) and the error text to record."""
    error = describe_error(exc)
    if isinstance(exc, Snooze):
        return Verdict.SNOOZE, exc.delay, error
    if isinstance(exc, Fail):
        return Verdict.FAIL_FINAL, None, error
    if isinstance(exc, Retry):
        return Verdict.FAIL, exc.delay, error
    if not spec.retried(exc):
        rule = "dont_retry_on" if spec.dont_retry_on and isinstance(exc, spec.dont_retry_on) else "retry_on"
        head, _, rest = error.partition("\n")
        return Verdict.FAIL_FINAL, None, clean_text(f"{head}\n(not retried: {rule} of its handler)\n{rest}")
    if spec.backoff is None:
        return Verdict.FAIL, None, error
    try:
        return Verdict.FAIL, seconds_of(spec.backoff(attempt), "the handler's backoff"), error
    except Exception as bad:  # a broken backoff must not cost the message its retry
        note = f"(its backoff failed, RETRY_BACKOFF used instead: {_safe_text(bad)[:200]})"
        return Verdict.FAIL, None, clean_text(f"{error.rstrip()}\n{note}")


def _failed(
    spec: HandlerSpec, delivery: Delivery, exc: BaseException, started: float, worker: str
) -> HandlerRun:
    verdict, delay, error = judge(spec, delivery.attempt, exc)
    with contextlib.suppress(Exception):  # a broken log handler must not cost the message its record
        if verdict == Verdict.SNOOZE:
            logger.info(
                "%s: %s snoozed (attempt %d not counted): %s",
                delivery.message_id,
                spec.runs(delivery.payload),
                delivery.attempt,
                error.partition("\n")[0][:500],
                extra=log_extra(delivery, worker),
            )
        else:
            logger.warning(
                "%s: %s failed (attempt %d of %d): %s",
                delivery.message_id,
                spec.runs(delivery.payload),
                delivery.attempt,
                delivery.lease.max_attempts,
                error.partition("\n")[0][:500],
                exc_info=(type(exc), exc, exc.__traceback__),
                extra=log_extra(delivery, worker),
            )
    return HandlerRun(False, time.monotonic() - started, error=error, verdict=verdict, delay=delay)


def _discard(value: Any) -> None:
    """Close a coroutine nobody will await (no "never awaited" warning); cancel a future."""
    close = getattr(value, "close", None) if inspect.iscoroutine(value) else getattr(value, "cancel", None)
    if close is not None:
        with contextlib.suppress(Exception):  # only tidying up
            close()


def _returned_awaitable(spec: HandlerSpec, value: Any) -> ReturnedAwaitable:
    _discard(value)
    return ReturnedAwaitable(
        f"handler {spec.name} returned {type(value).__name__} (an awaitable) instead of doing its work: "
        "nothing was awaited, so the message is failed, not acknowledged. Declare the handler "
        "with 'async def' (zeroloss then awaits it), or await inside it."
    )


def _result(spec: HandlerSpec, value: Any, delivery: Delivery) -> Any:
    # A workflow's step always keeps its result: its dependents read it (delivery.upstream).
    if (spec.store_result or delivery.lease.workflow_id) and value is not None:
        canonical_json(value)  # a result that cannot be stored fails the attempt, visibly
        return value
    return None


def _started(delivery: Delivery, worker: str) -> Any:
    """The one place a handler run starts: the signal, then the telemetry's span and counters
    (the returned handle's ``end`` closes them)."""
    if events.wanted(events.Started):
        events.publish(None, [events.Started(delivery, worker)])
    try:
        return events.tracer().process(delivery, worker)
    except Exception:  # a broken tracer or exporter must not cost the message its run
        logger.exception("zeroloss: telemetry failed at a handler's start")
        return events.NO_PROCESS


def _ended(handle: Any, run: HandlerRun, exc: BaseException | None = None) -> HandlerRun:
    try:
        handle.end(run.ok, run.seconds, exc)
    except Exception:
        logger.exception("zeroloss: telemetry failed at a handler's end")
    return run


def run_handler(
    spec: HandlerSpec, delivery: Delivery, *, worker: str = "", timeout: float | None = None
) -> HandlerRun:
    """Call the handler; every exception it raises is a failed attempt, not a crash.

    An async handler runs to completion on this thread's event loop (:func:`thread_event_loop`),
    cancelled after its ``time_limit``, else ``timeout`` seconds (``HANDLER_TIMEOUT``). The
    handler's ``soft_time_limit`` raises SoftTimeLimitExceeded in it (:mod:`.timelimits`).
    """
    if spec.is_async:
        return run_coroutine(run_async_handler(spec, delivery, worker=worker, timeout=timeout))
    started = time.monotonic()
    handle = _started(delivery, worker)
    keeper = delivery.keeper  # stops the handler if its lease is lost (worker.stops)
    watch = None if keeper is None else functools.partial(keeper.running, delivery.message_id)
    try:
        with soft_limit(spec.soft_time_limit, watch=watch):
            value = spec.func(delivery)
        if inspect.isawaitable(value):
            raise _returned_awaitable(spec, value)
        result = _result(spec, value, delivery)
    except KeyboardInterrupt:
        _ended(handle, HandlerRun(False, time.monotonic() - started, error="KeyboardInterrupt"))
        raise  # only ever delivered to the main thread: the process is being stopped
    except BaseException as exc:
        return _ended(handle, _failed(spec, delivery, exc, started, worker), exc)
    return _ended(
        handle, HandlerRun(True, time.monotonic() - started, result=result, steps=delivery.added_steps())
    )


async def run_async_handler(
    spec: HandlerSpec, delivery: Delivery, *, worker: str = "", timeout: float | None = None
) -> HandlerRun:
    """Await an async handler: like :func:`run_handler`, never raises (but KeyboardInterrupt)."""
    started = time.monotonic()
    handle = _started(delivery, worker)
    timeout = hard_limit(spec, timeout)
    limit = asyncio.timeout(timeout)
    try:
        async with limit:
            value = await async_soft_limit(spec.func(delivery), spec.soft_time_limit)
        if inspect.isawaitable(value):
            raise _returned_awaitable(spec, value)
        result = _result(spec, value, delivery)
    except KeyboardInterrupt:
        _ended(handle, HandlerRun(False, time.monotonic() - started, error="KeyboardInterrupt"))
        raise
    except BaseException as exc:
        if isinstance(exc, TimeoutError) and limit.expired():
            bound = "its time_limit" if spec.time_limit is not None else "HANDLER_TIMEOUT"
            timed_out = HandlerTimedOut(
                f"the async handler ran longer than {bound} ({timeout:g}s) and was cancelled"
            )
            timed_out.__cause__ = exc
            exc = timed_out
        return _ended(handle, _failed(spec, delivery, exc, started, worker), exc)
    return _ended(
        handle, HandlerRun(True, time.monotonic() - started, result=result, steps=delivery.added_steps())
    )


_thread_state = threading.local()


def thread_event_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop for async handlers: made on first use, then reused."""
    loop: asyncio.AbstractEventLoop | None = getattr(_thread_state, "loop", None)
    if loop is None or loop.is_closed():
        loop = _thread_state.loop = asyncio.new_event_loop()
    return loop


def close_thread_event_loop() -> None:
    """Close this thread's event loop, if it made one (a worker thread on its way out)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_thread_state, "loop", None)
    _thread_state.loop = None
    if loop is not None and not loop.is_closed():
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def run_coroutine(coro: Coroutine[Any, Any, HandlerRun]) -> HandlerRun:
    """Run ``coro`` to completion on this thread's event loop."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None:
        coro.close()
        # Called from async code (a loop already runs in this thread): it cannot block here.
        raise RuntimeError(
            "an async zeroloss handler cannot be run from inside a running event loop; "
            "await zeroloss.processing.run_async_handler(...) instead"
        )
    return thread_event_loop().run_until_complete(coro)


_savepoint_names = itertools.count(1)

#: Why a handler that returned normally is still a failed attempt.
LEFT_TRANSACTION_FAILED = (
    "the handler returned, but left its transaction failed (it caught a database error without "
    "rolling back to a savepoint of its own, e.g. with transaction.atomic()): its writes are rolled back"
)


def run_in_savepoint(
    spec: HandlerSpec, delivery: Delivery, using: str, engine: Engine, *, worker: str = ""
) -> HandlerRun:
    """Run a transactional handler in a savepoint of its own, inside the caller's transaction.

    A failure rolls back to the savepoint: the handler's writes and the ``on_commit`` callbacks
    it registered are discarded, the rest of the transaction goes on. A success leaves the
    savepoint open rather than releasing it, one round trip less per message; the commit (or
    rollback) of the enclosing transaction ends every savepoint at once.

    A handler that returned after a database error it caught (the transaction now refuses every
    statement) fails too, so one handler's swallowed error cannot sink its batch's others.
    """
    connection = connections[using]
    sid = f"zl_handler_{next(_savepoint_names)}"
    with connection.cursor() as cursor:
        cursor.execute(connection.ops.savepoint_create_sql(sid))
    # Registered as Django's innermost savepoint while the handler runs, so the on_commit
    # callbacks it adds are tagged with it and can be dropped with its rollback.
    connection.savepoint_ids.append(sid)
    try:
        run = run_handler(spec, delivery, worker=worker)
    finally:
        connection.savepoint_ids.remove(sid)
    if run.ok and (connection.needs_rollback or engine.transaction_failed(connection)):
        logger.warning(
            "%s: %s", delivery.message_id, LEFT_TRANSACTION_FAILED, extra=log_extra(delivery, worker)
        )
        run = HandlerRun(False, run.seconds, error=LEFT_TRANSACTION_FAILED)
    if not run.ok and not engine.in_batch_transaction(connection):
        return run  # the handler ended the whole transaction: its savepoint went with it
    if not run.ok:
        connection.needs_rollback = False  # Django refuses any statement, this rollback too, until reset
        with connection.cursor() as cursor:
            cursor.execute(connection.ops.savepoint_rollback_sql(sid))
        connection.run_on_commit = [entry for entry in connection.run_on_commit if sid not in entry[0]]
    return run


# Recorded (``last_error``) and documented by their public path, not this module's.
for _kind in (ReturnedAwaitable, HandlerTimedOut):
    _kind.__module__ = "zeroloss.processing"
