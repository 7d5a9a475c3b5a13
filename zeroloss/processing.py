"""Running one claimed message's handler, and what a handler receives.

Shared by the built-in worker (:mod:`zeroloss.worker`) and the Celery delivery task, so both
follow the same path and the same guarantees. A handler's failure is anything it raises,
``SystemExit`` included (``sys.exit()`` or argparse inside a library): it is recorded as a
failed attempt, never allowed to end the worker thread.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .delivery import Delivery, LeaseLost
from .handlers import HandlerSpec
from .ledger.types import Completion, Lease, Verdict
from .ledger.validation import MAX_ERROR_LENGTH, canonical_json, clean_text

__all__ = ["Delivery", "HandlerRun", "LeaseLost", "Outcome", "describe_error", "run_handler"]

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
    head = f"{kind.__module__}.{kind.__qualname__}: {exc}".replace("builtins.", "", 1)
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
