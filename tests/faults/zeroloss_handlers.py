"""The fault suite's handlers, loaded only where ``ZEROLOSS_EXTRA_APPS`` names ``tests.faults``.

Every run of either handler first appends one line to a per-process log file (one
``os.write`` of an ``O_APPEND`` file: it is in the kernel once the call returns, so a SIGKILL
an instant later does not lose it) — the suite's record of every handler *start*, re-runs
included. ``faults.tx`` then inserts one :data:`EFFECT_TABLE` row *in the acknowledgement's
transaction*: a row per committed run, with no uniqueness, so an effect committed twice
would show as two rows. ``faults.plain`` has no database effect; its re-runs are what the
at-least-once guarantee allows, and the checker must find a reason for each.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from django.db import connection

import zeroloss
from zeroloss.runtime.processing import Delivery

TX_QUEUE = "faults.tx"
PLAIN_QUEUE = "faults.plain"
EFFECT_TABLE = "faults_effect"
#: Directory of the run logs (``<dir>/runs/<pid>.log``); set by the suite for its processes.
DIR_ENV = "ZEROLOSS_FAULTS_DIR"

_log: tuple[int, int] | None = None  # (pid, fd): reopened in a forked child (Celery prefork)
_log_lock = threading.Lock()


def _fd() -> int:
    global _log
    pid = os.getpid()
    with _log_lock:
        if _log is None or _log[0] != pid:
            runs = Path(os.environ[DIR_ENV]) / "runs"
            runs.mkdir(parents=True, exist_ok=True)
            fd = os.open(runs / f"{pid}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            _log = (pid, fd)
        return _log[1]


def note(event: str, kind: str, delivery: Delivery) -> None:
    """``time event kind message_id attempt token pid thread`` as one appended line."""
    lease = delivery.lease
    line = (
        f"{time.time():.6f} {event} {kind} {lease.message_id} {lease.attempt} {lease.token} "
        f"{os.getpid()} {threading.get_ident()}\n"
    )
    os.write(_fd(), line.encode())


def _work(delivery: Delivery) -> None:
    payload = delivery.payload if isinstance(delivery.payload, dict) else {}
    pause = float(payload.get("sleep_ms", 0)) / 1000
    if pause:
        time.sleep(pause)  # a handler that takes this long: the faults land while it runs


@zeroloss.handler(TX_QUEUE, transactional=True)
def effect_tx(delivery: Delivery) -> None:
    """One effect row per committed run: it commits with the acknowledgement or not at all."""
    note("start", "tx", delivery)
    _work(delivery)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {EFFECT_TABLE} (message_id, attempt, pid, token) VALUES (%s, %s, %s, %s)",
            [delivery.message_id, delivery.attempt, os.getpid(), str(delivery.lease.token)],
        )
    note("end", "tx", delivery)


@zeroloss.handler(PLAIN_QUEUE)
def effect_plain(delivery: Delivery) -> None:
    """At-least-once: nothing but the run log records that it ran."""
    note("start", "plain", delivery)
    _work(delivery)
    note("end", "plain", delivery)


#: The workflow fault run (tests/faults/workflows.py): its steps, and the callback of its group.
WF_QUEUE = "faults.wf"
WF_CALLBACK_QUEUE = "faults.wf.callback"
#: Written (the worker's pid) by the callback's first attempt, which then waits to be killed.
CALLBACK_MARKER = "callback-first-attempt.pid"


@zeroloss.handler(WF_QUEUE)
def workflow_step(delivery: Delivery) -> None:
    """A step of the workflow run: at-least-once, recorded in the run log."""
    note("start", "wf", delivery)
    _work(delivery)
    note("end", "wf", delivery)


@zeroloss.handler(WF_CALLBACK_QUEUE, transactional=True)
def workflow_callback(delivery: Delivery) -> None:
    """The group's callback: its effect row commits with its acknowledgement, so it must exist
    exactly once however often the callback started."""
    note("start", "wf-callback", delivery)
    if delivery.attempt == 1 and isinstance(delivery.payload, dict) and delivery.payload.get("hang_first"):
        # The run kills this worker here, mid-handler (tests/faults/workflows.py); bounded all the same.
        marker = Path(os.environ[DIR_ENV]) / CALLBACK_MARKER
        marker.write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)
    _work(delivery)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {EFFECT_TABLE} (message_id, attempt, pid, token) VALUES (%s, %s, %s, %s)",
            [delivery.message_id, delivery.attempt, os.getpid(), str(delivery.lease.token)],
        )
    note("end", "wf-callback", delivery)
