"""A process-pool child (``zeroloss_worker --pool process``): runs one message at a time.

Outside :mod:`zeroloss.runtime.worker` on purpose: a spawned child imports this module to find its
entry point before ``django.setup()``, so it must import nothing that needs the app registry.

Started with the ``spawn`` context (never forked from a parent that has live database
connections and threads): it calls ``django.setup()``, opens its own connections, and
answers each lease its parent sends over the pipe with what the handler produced. It
records nothing itself: the parent's claim thread records the outcome, fenced and batched.

It never outlives its parent: ``PR_SET_PDEATHSIG`` (Linux) kills it with the parent's death,
a watch on its parent's pid backs that up elsewhere, and an EOF on the pipe ends it between
messages. SIGTERM and SIGINT (a supervisor signals the whole group) are ignored: the parent
decides when its child stops, after the message in hand. SIGUSR1 is the soft time limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

import django
from django.db import close_old_connections, connections

from ..exceptions import SoftTimeLimitExceeded

#: True while a sync handler runs: SIGUSR1 raises SoftTimeLimitExceeded only then.
_in_handler = False
#: Set by the parent to ask this child's running handler to stop (the abort hook: see
#: :meth:`zeroloss.runtime.worker.pool.ChildSlot.abort`); read with :func:`abort_requested`.
_abort: Event | None = None

PR_SET_PDEATHSIG = 1


def abort_requested() -> bool:
    """In a child: True once the parent set this slot's abort flag for the running message."""
    return _abort is not None and _abort.is_set()


def _on_soft_limit(signum: int, frame: Any) -> None:
    global _in_handler
    if _in_handler:  # between messages, or once the handler returned: nothing to stop
        _in_handler = False
        raise SoftTimeLimitExceeded("the handler ran past its soft_time_limit")


def _die_with_parent(parent_pid: int) -> None:
    # The signal follows the death of the parent *thread* that started this child: the claim
    # thread that owns the slot, which stops its child before it ends anyway.
    with contextlib.suppress(Exception):  # not Linux: the pid watch below still holds
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the line above: nothing will ever read our answers

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="zeroloss-parent-watch", daemon=True).start()


def _guarded(func: Any) -> Any:
    @functools.wraps(func)
    def run(delivery: Any) -> Any:
        global _in_handler
        _in_handler = True
        try:
            return func(delivery)
        finally:
            _in_handler = False

    return run


def main(conn: Connection, parent_pid: int, abort: Event, worker: str) -> None:
    global _abort
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, _on_soft_limit)
    _abort = abort
    django.setup()
    # Deferred: the handlers and their run need the app registry, set up just above.
    from . import handlers, processing

    specs: dict[str, Any] = {}
    conn.send(("ready", os.getpid()))
    try:
        while True:
            try:
                lease = conn.recv()
            except EOFError:
                return  # the parent closed the pipe: recycled, or stopping
            conn.send(("got",))  # the receipt: from here on, a death fails this message
            abort.clear()
            close_old_connections()
            spec = specs.get(lease.queue_name)
            if spec is None:
                spec = handlers.get_handler(lease.queue_name)
                # The parent enforces the hard limit by killing this process; a sync handler's
                # soft limit comes as SIGUSR1, an async one's from this loop's own timer.
                if spec.is_async:
                    spec = dataclasses.replace(spec, time_limit=None)
                else:
                    spec = dataclasses.replace(
                        spec, func=_guarded(spec.func), soft_time_limit=None, time_limit=None
                    )
                specs[lease.queue_name] = spec
            try:
                run = processing.run_handler(
                    spec, processing.Delivery(lease, abort_flag=abort.is_set), worker=worker
                )
            except SoftTimeLimitExceeded:  # arrived past every guard: the handler's outcome stands
                run = processing.HandlerRun(
                    False, 0.0, error="SoftTimeLimitExceeded after the handler returned"
                )
            conn.send(("done", run.ok, run.seconds, run.result, run.error, run.verdict.value, run.delay))
    finally:
        processing.close_thread_event_loop()
        connections.close_all()
        sys.stdout.flush()
