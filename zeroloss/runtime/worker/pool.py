"""``zeroloss_worker --pool process``: handlers run in child processes, one per claim thread.

Each claim thread (:mod:`.loop`) owns one :class:`ChildSlot`. The thread claims, hands each
message's lease to its child over a pipe and waits for the answer, while the process's lease
keeper renews the lease; the outcome goes to the thread's completer, recorded fenced and
batched as with the thread pool. The slot enforces the limits, Celery's prefork semantics:

- past ``soft_time_limit``: SIGUSR1 to the child (SoftTimeLimitExceeded in a sync handler;
  an async handler's soft limit is the child's own event-loop timer);
- past the hard bound (``time_limit``, else ``HANDLER_TIMEOUT``): SIGKILL; the attempt fails
  (:class:`~zeroloss.exceptions.TimeLimitExceeded`) and a new child takes the slot;
- a child that dies on its own (segfault, ``os._exit``, the OOM killer) fails the message it
  was running (:class:`ChildDied`) and is replaced;
- ``--max-tasks-per-child``: a child is replaced after that many messages.

Children are started with the ``spawn`` context: forking a process with live database
connections and threads is unsafe. The abort hook: :meth:`ChildSlot.abort` sets the slot's
shared flag, read in the child by :func:`zeroloss.runtime.pool_child.abort_requested`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING

from ...exceptions import TimeLimitExceeded
from ...ledger.aborts import ABORT_POLL_INTERVAL
from ...ledger.types import Verdict
from ..handlers import HandlerSpec
from ..pool_child import main
from ..processing import HandlerRun, describe_error
from ..timelimits import hard_limit

if TYPE_CHECKING:
    from multiprocessing.context import SpawnProcess

    from ...ledger.types import Lease

logger = logging.getLogger("zeroloss")

__all__ = ["ChildDied", "ChildSlot", "refuse_transactional"]

#: How long a new child may take to import Django and the handlers.
STARTUP_TIMEOUT = 120.0


class ChildDied(RuntimeError):
    """The child process running the handler exited without answering."""


def refuse_transactional(specs: list[HandlerSpec]) -> None:
    """``--pool process`` does not run transactional handlers: their writes and the fenced
    acknowledgement share one transaction on the claim thread's connection, in the parent."""
    names = [f"{s.queue_name!r} ({s.name})" for s in specs if s.transactional]
    if names:
        raise ValueError(
            f"--pool process cannot run transactional handlers: {', '.join(names)}. Their writes commit "
            "in the acknowledgement's transaction, which the parent holds; run these queues in a worker "
            "with the thread pool (the default), and the others with --pool process."
        )


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class ChildSlot:
    """One child process and the pipe to it; used by one claim thread only."""

    def __init__(
        self, n: int, *, worker: str, handler_timeout: float | None, max_tasks: int | None = None
    ) -> None:
        self.n = n
        self.worker = worker
        self.handler_timeout = handler_timeout
        self.max_tasks = max_tasks
        self._ctx = multiprocessing.get_context("spawn")
        #: Shared with the child: set to ask its running handler to stop (the abort hook).
        self.abort_flag = self._ctx.Event()
        self.process: SpawnProcess | None = None
        self.conn: Connection | None = None
        self.tasks = 0
        #: Every child pid this slot started (tests, the log).
        self.started: list[int] = []

    # -- the child's life -------------------------------------------------------------------

    def start(self) -> None:

        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(
            target=main,
            args=(child_conn, os.getpid(), self.abort_flag, f"{self.worker}/c{self.n}"),
            name=f"zeroloss-child-{self.n}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        self.process, self.conn, self.tasks = process, parent_conn, 0
        if not parent_conn.poll(STARTUP_TIMEOUT):
            self._kill()
            raise ChildDied(f"child process {process.pid} did not start within {STARTUP_TIMEOUT:g}s")
        try:
            _kind, pid = parent_conn.recv()
        except EOFError:
            process.join(5)
            raise ChildDied(
                f"child process {process.pid} {_exit_reason(process.exitcode)} while starting "
                "(django.setup() or importing the handlers failed: see its output above)"
            ) from None
        self.started.append(pid)
        logger.info("zeroloss_worker: child process %d started (slot %d)", pid, self.n)

    def _kill(self) -> None:
        process, conn = self.process, self.conn
        self.process, self.conn = None, None
        if conn is not None:
            conn.close()
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)  # type: ignore[arg-type]
            process.join(10)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the child (between messages: it exits on the pipe's EOF)."""
        process, conn = self.process, self.conn
        self.process, self.conn = None, None
        if conn is not None:
            conn.close()
        if process is not None:
            process.join(timeout)
            if process.is_alive():
                self.process = process
                self._kill()

    def abort(self) -> None:
        """Ask the running handler to stop (the child reads it with ``abort_requested()``)."""
        self.abort_flag.set()

    # -- one message ------------------------------------------------------------------------

    def _hand_over(self, lease: Lease) -> bool:
        """Send the lease and wait for the child's receipt: False if the child is gone first."""
        assert self.process is not None and self.conn is not None
        try:
            self.conn.send(lease)
            while True:
                ready = wait([self.conn, self.process.sentinel], STARTUP_TIMEOUT)
                if self.conn in ready:
                    return bool(self.conn.recv() == ("got",))
                if self.process.sentinel in ready or not ready:
                    return False
        except (OSError, EOFError):
            return False

    def run(
        self,
        spec: HandlerSpec,
        lease: Lease,
        aborted: Callable[[], bool] | None = None,
        lost: Callable[[], bool] | None = None,
    ) -> HandlerRun:
        """Run ``lease``'s handler in the child; never raises for what the handler or the child did.

        ``aborted`` (the keeper's view of this message's abort request) is polled while the
        child runs; once true, the child's abort flag is set (its ``delivery.abort_requested``).
        ``lost`` (the keeper's view of the lease) too: once true the child is killed, since the
        message may already run elsewhere (its worker was frozen past its lease): its slot is
        not this run's any more."""
        if self.process is None or not self.process.is_alive():
            self._kill()
            self.start()
        if not self._hand_over(lease):
            # It died idle, just now (a child still exiting looks alive, and may even take the
            # message into its pipe): the handler has not started; a new child runs it.
            self._kill()
            self.start()
            if not self._hand_over(lease):
                died = ChildDied("two child processes in a row died before taking the message")
                return HandlerRun(False, 0.0, error=describe_error(died))
        assert self.process is not None and self.conn is not None
        process, conn = self.process, self.conn
        started = time.monotonic()
        hard = hard_limit(spec, self.handler_timeout)
        # The async handler's soft limit is the child's own loop timer; a sync one's a signal.
        soft = None if spec.is_async else spec.soft_time_limit
        while True:
            now = time.monotonic()
            deadlines = [
                d for d in ((started + soft) if soft else None, (started + hard) if hard else None) if d
            ]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            if aborted is not None or lost is not None:  # polled at the keeper's abort poll interval
                timeout = ABORT_POLL_INTERVAL if timeout is None else min(timeout, ABORT_POLL_INTERVAL)
            ready = wait([conn, process.sentinel], timeout)
            if lost is not None and conn not in ready and lost():
                self._kill()
                logger.warning(
                    "%s: its lease was lost while %s ran (the worker frozen or cut off past "
                    "ACK_TIMEOUT): its child process %s was killed; a new child takes its slot",
                    lease.message_id,
                    spec.runs(lease.payload),
                    process.pid,
                )
                gone = ChildDied(f"{spec.runs(lease.payload)} stopped: its lease was lost")
                return HandlerRun(False, time.monotonic() - started, error=describe_error(gone))
            if aborted is not None and aborted():
                self.abort()
                aborted = None  # once: the flag stays set until the next message
            if conn in ready:
                try:
                    answer = conn.recv()
                except (EOFError, OSError):  # it died: EOF, or a reset of the pipe
                    answer = None
                if answer is not None:
                    _kind, ok, seconds, result, error, verdict, delay = answer
                    self.tasks += 1
                    if self.max_tasks is not None and self.tasks >= self.max_tasks:
                        self.close()  # recycled: the next message starts a new child
                    return HandlerRun(
                        ok, seconds, result=result, error=error, verdict=Verdict(verdict), delay=delay
                    )
            if process.sentinel in ready or conn in ready:
                process.join(5)
                reason = _exit_reason(process.exitcode)
                self._kill()
                logger.warning(
                    "%s: child process %s running %s %s; a new child takes its slot",
                    lease.message_id,
                    process.pid,
                    spec.runs(lease.payload),
                    reason,
                )
                exc: BaseException = ChildDied(
                    f"the child process running {spec.runs(lease.payload)} {reason} before it answered"
                )
                return HandlerRun(False, time.monotonic() - started, error=describe_error(exc))
            now = time.monotonic()
            if soft is not None and now >= started + soft:
                soft = None  # once
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGUSR1)  # type: ignore[arg-type]
            if hard is not None and now >= started + hard:
                self._kill()
                logger.warning(
                    "%s: %s ran past its hard time limit (%gs): its child process %s was killed; "
                    "a new child takes its slot",
                    lease.message_id,
                    spec.runs(lease.payload),
                    hard,
                    process.pid,
                )
                exc = TimeLimitExceeded(
                    f"{spec.runs(lease.payload)} ran past its hard time limit ({hard:g}s: time_limit, else "
                    f"HANDLER_TIMEOUT); its child process {process.pid} was killed"
                )
                return HandlerRun(False, time.monotonic() - started, error=describe_error(exc))
