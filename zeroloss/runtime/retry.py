"""A handler's retry policy, and the three outcomes a handler may raise (docs/handlers.md).

::

    @zeroloss.handler(
        "webhooks",
        max_attempts=10,  # send(max_attempts=...) > this > ZEROLOSS["MAX_ATTEMPTS"]
        backoff=zeroloss.ExponentialBackoff(base=2, cap=600),  # else ZEROLOSS["RETRY_BACKOFF"]
        retry_on=(httpx.TransportError,),  # any other error: dead-lettered at once
        dont_retry_on=(PermissionError,),  # dead-lettered at once
    )
    def call(delivery):
        response = httpx.post(...)
        if response.status_code == 429:
            raise zeroloss.Retry(delay=float(response.headers["Retry-After"]))  # a failed attempt
        if response.status_code == 425:
            raise zeroloss.Snooze(delay=30)  # not a failure: the attempt is not counted
        if response.status_code == 410:
            raise zeroloss.Fail("the endpoint is gone")  # dead-lettered now
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = [
    "Backoff",
    "ExponentialBackoff",
    "Fail",
    "FixedBackoff",
    "HandlerOutcome",
    "Retry",
    "Snooze",
    "seconds_of",
]

#: The longest delay a backoff, ``Retry`` or ``Snooze`` may ask for (100 years, as the settings).
MAX_DELAY = 100 * 365 * 24 * 3600.0

#: A backoff: given the attempt that just failed (1 for the first), the seconds (or a
#: ``timedelta``) before the message may run again.
Backoff: TypeAlias = Callable[[int], "float | dt.timedelta"]


def seconds_of(value: Any, what: str) -> float:
    """A delay as seconds: a number or a ``timedelta``, from 0 to 100 years; ValueError otherwise."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a number of seconds or a timedelta, got {value!r}.")
    if not 0 <= value <= MAX_DELAY:
        raise ValueError(f"{what} must be from 0 to {MAX_DELAY:g} seconds (100 years), got {value!r}.")
    return float(value)


@dataclass(frozen=True)
class ExponentialBackoff:
    """``min(base * 2 ** (attempt - 1), cap)`` seconds after failed attempt ``attempt``; with
    ``jitter`` (full jitter) a delay drawn uniformly from 0 to that bound, so the messages one
    incident failed together do not all come back together. ``ZEROLOSS["RETRY_BACKOFF"]`` is
    this with ``base=1, cap=300``."""

    base: float = 1.0
    cap: float = 300.0
    jitter: bool = True

    def __post_init__(self) -> None:
        seconds_of(self.base, "ExponentialBackoff's base")
        seconds_of(self.cap, "ExponentialBackoff's cap")
        if self.cap < self.base:
            raise ValueError(f"ExponentialBackoff's cap ({self.cap}) must be >= its base ({self.base}).")
        if not isinstance(self.jitter, bool):
            raise ValueError(f"ExponentialBackoff's jitter must be True or False, got {self.jitter!r}.")

    def bound(self, attempt: int) -> float:
        # The exponent is capped so that a large attempt count cannot overflow a float.
        return float(min(self.base * (2 ** min(max(attempt - 1, 0), 60)), self.cap))

    def __call__(self, attempt: int) -> float:
        bound = self.bound(attempt)
        # Not for secrets: spreading retries over time only needs them to differ.
        return _jitter.uniform(0.0, bound) if self.jitter else bound


@dataclass(frozen=True)
class FixedBackoff:
    """The same ``delay`` seconds after every failed attempt."""

    delay: float

    def __post_init__(self) -> None:
        seconds_of(self.delay, "FixedBackoff's delay")

    def __call__(self, attempt: int) -> float:
        return float(self.delay)


_jitter = random.Random()


class HandlerOutcome(Exception):
    """Base of what a handler raises to choose its outcome (:class:`Retry`, :class:`Snooze`,
    :class:`Fail`). Not a :class:`~zeroloss.exceptions.ZeroLossError`: it is no error of zeroloss."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = str(reason)


class Retry(HandlerOutcome):
    """A failed attempt that runs again no sooner than ``delay`` seconds (a number or a
    ``timedelta``), instead of the backoff: a 429's ``Retry-After``. It counts an attempt, so
    with the attempts spent the message is dead-lettered."""

    def __init__(self, delay: float | dt.timedelta, reason: str = "") -> None:
        self.delay = seconds_of(delay, "Retry's delay")
        super().__init__(reason)

    def __str__(self) -> str:
        return _said(f"after {self.delay:g} s", self.reason)


class Snooze(HandlerOutcome):
    """Not a failure: run again after ``delay`` seconds without counting an attempt ("not ready
    yet, look again later"). ``ZEROLOSS["MAX_SNOOZES"]`` bounds how often one message may snooze;
    past it a snooze counts as a failed attempt (retried after ``delay``), so it cannot snooze for
    ever."""

    def __init__(self, delay: float | dt.timedelta, reason: str = "") -> None:
        self.delay = seconds_of(delay, "Snooze's delay")
        super().__init__(reason)

    def __str__(self) -> str:
        return _said(f"for {self.delay:g} s", self.reason)


class Fail(HandlerOutcome):
    """Dead-letter the message now, whatever attempts it has left: retrying cannot help."""

    def __str__(self) -> str:
        return self.reason


def _said(when: str, reason: str) -> str:
    """The text after the class in the error recorded (``zeroloss.Retry: after 30 s: rate limited``)."""
    return f"{when}: {reason}" if reason else when


# Recorded and shown by their public names (``zeroloss.Retry``), not this module's.
for _kind in (HandlerOutcome, Retry, Snooze, Fail):
    _kind.__module__ = "zeroloss"
