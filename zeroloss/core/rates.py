"""Queue limits' values: a concurrency (``2``) and a rate (``"10/s"``, ``"600/m"``, ``"1000/h"``).

Parsed here once for the settings (:mod:`zeroloss.conf`), the ``zeroloss_queue`` command and
the ledger's control rows (:mod:`zeroloss.ledger.control`), so the three accept the same text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: Seconds in each period a rate may name.
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: The largest count a limit may name (the database columns are 32-bit).
MAX_LIMIT = 2**31 - 1
_RATE = re.compile(r"\s*(\d+)\s*/\s*([smh])\s*")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` claims started per ``period`` seconds, across every worker."""

    count: int
    period: float
    text: str

    @property
    def per_second(self) -> float:
        return self.count / self.period

    @property
    def burst(self) -> int:
        """The most claims one moment may start (the token bucket's size): a tenth of the
        count, at least 1. In any window of one period at most ``count + burst`` start; over
        longer windows the average is ``count`` per period."""
        return max(1, self.count // 10)

    def __str__(self) -> str:
        return self.text


def parse_rate(value: Any) -> Rate:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` (N from 1); :class:`ValueError` saying what to write."""
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f'must be "N/s", "N/m" or "N/h" (e.g. "10/s"), got {value!r}.')
    count = int(match.group(1))
    if not 1 <= count <= MAX_LIMIT:
        raise ValueError(f"must count from 1 to {MAX_LIMIT} per period, got {value!r}.")
    return Rate(count, PERIODS[match.group(2)], f"{count}/{match.group(2)}")


def parse_concurrency(value: Any) -> int:
    """An integer from 1; :class:`ValueError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"must be an integer from 1 to {MAX_LIMIT}, got {value!r}.")
    return value
