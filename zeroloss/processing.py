"""Running one claimed message's handler, and what a handler receives.

Shared by the built-in worker (:mod:`zeroloss.worker`) and the Celery delivery task, so both
follow the same path and the same guarantees. A handler's failure is anything it raises,
``SystemExit`` included (``sys.exit()`` or argparse inside a library): it is recorded as a
failed attempt, never allowed to end the worker thread.
"""

from __future__ import annotations

import itertools
import logging
import time
import traceback
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from django.db import connections

from .delivery import Delivery, LeaseLost
from .handlers import HandlerSpec
from .ledger.types import Completion, Lease, Verdict
from .ledger.validation import MAX_ERROR_LENGTH, canonical_json, clean_text

if TYPE_CHECKING:
    from .ledger.engine import Engine

__all__ = [
    "Delivery",
    "HandlerRun",
    "LeaseLost",
    "Outcome",
    "describe_error",
    "run_handler",
    "run_in_savepoint",
]

logger = logging.getLogger("zeroloss")


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"  # back to pending after a backoff, or dead: see the ledger
    LEASE_LOST = "lease_lost"  # the lease expired or was revoked: another run owns it now
    ABSORBED = "absorbed"  # a duplicate delivery: nothing claimable, handler not run
    RELEASED = "released"  # given back unstarted (shutdown, or behind a long handler)


@dataclass(frozen=True, slots=True)
class HandlerRun:
    """What one run of a handler produced."""

    ok: bool
    seconds: float
    result: Any = None
    error: str = ""

    def completion(self, lease: Lease) -> Completion:
        if self.ok:
            return Completion(lease, Verdict.ACKNOWLEDGE, result=self.result)
        return Completion(lease, Verdict.FAIL, error=self.error)


def describe_error(exc: BaseException) -> str:
    """``module.Class: message`` on the first line, then the traceback (most recent call last).

    Always storable: NUL characters and lone surrogates are escaped, and a long traceback keeps
    its first line and its end, within ``MAX_ERROR_LENGTH``.
    """
    kind = type(exc)
    # Builtins without their module (only a leading ``builtins`` module: ``mypkg.builtins.X`` stays).
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    head = f"{module}{kind.__qualname__}: {exc}"
    tb = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
    text = f"{head}\n{tb}"
    if len(text) > MAX_ERROR_LENGTH:
        keep = MAX_ERROR_LENGTH - len(head) - 40
        text = f"{head}\n[... traceback cut ...]\n{tb[-keep:]}"
    return clean_text(text)


def run_handler(spec: HandlerSpec, delivery: Delivery) -> HandlerRun:
    """Call the handler; every exception it raises is a failed attempt, not a crash."""
    started = time.monotonic()
    try:
        value = spec.func(delivery)
        result = None
        if spec.store_result and value is not None:
            canonical_json(value)  # a result that cannot be stored fails the attempt, visibly
            result = value
    except KeyboardInterrupt:
        raise  # only ever delivered to the main thread: the process is being stopped
    except BaseException as exc:
        logger.info("%s: handler failed (attempt %d): %s", delivery.message_id, delivery.attempt, exc)
        return HandlerRun(False, time.monotonic() - started, error=describe_error(exc))
    return HandlerRun(True, time.monotonic() - started, result=result)


_savepoint_names = itertools.count(1)

#: Why a handler that returned normally is still a failed attempt.
LEFT_TRANSACTION_FAILED = (
    "the handler returned, but left its transaction failed (it caught a database error without "
    "rolling back to a savepoint of its own, e.g. with transaction.atomic()): its writes are rolled back"
)


def run_in_savepoint(spec: HandlerSpec, delivery: Delivery, using: str, engine: Engine) -> HandlerRun:
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
        run = run_handler(spec, delivery)
    finally:
        connection.savepoint_ids.remove(sid)
    if run.ok and (connection.needs_rollback or engine.transaction_failed(connection)):
        logger.info("%s: %s", delivery.message_id, LEFT_TRANSACTION_FAILED)
        run = HandlerRun(False, run.seconds, error=LEFT_TRANSACTION_FAILED)
    if not run.ok:
        connection.needs_rollback = False  # Django refuses any statement, this rollback too, until reset
        with connection.cursor() as cursor:
            cursor.execute(connection.ops.savepoint_rollback_sql(sid))
        connection.run_on_commit = [entry for entry in connection.run_on_commit if sid not in entry[0]]
    return run
