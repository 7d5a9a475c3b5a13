"""The validators of single ``ZEROLOSS`` values, each raising :class:`SettingError` with its check id.

:mod:`zeroloss.conf` composes them into :func:`~zeroloss.conf.parse_settings` (and re-exports
the public names: import them from there).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .durations import parse_duration_text
from .rates import parse_concurrency, parse_rate
from .states import Status


class SettingError(ImproperlyConfigured):
    """One invalid ``ZEROLOSS`` entry. ``check_id`` is the stable id ``manage.py check`` reports."""

    def __init__(self, key: str, message: str, check_id: str = "zeroloss.E003") -> None:
        super().__init__(f"ZEROLOSS[{key!r}]: {message}")
        self.key = key
        self.check_id = check_id
        self.hint = message


NUMBER_FIELDS = {
    "ACK_TIMEOUT": (False, 0.0),
    "REPLICATION_TIMEOUT": (False, 0.0),
    "NODE_TTL": (False, 0.0),
    "SWEEP_INTERVAL": (False, 0.0),
    "REDISPATCH_AFTER": (False, 0.0),
    "COMPLETED_RETENTION": (False, 0.0),
    "DEDUP_WINDOW": (False, 0.0),
    "PUBLISH_TIMEOUT": (False, 0.0),
    "ACK_FLUSH_INTERVAL": (True, 0.0),
    "CACHE_TIMEOUT": (True, 0.0),
    "SCHEDULE_INTERVAL": (False, 0.0),
}
INT_FIELDS = {
    "MAX_ATTEMPTS": 1,
    "MAX_SNOOZES": 0,
    "REPLICATION_FACTOR": 1,
    "SWEEP_BATCH_SIZE": 1,
    "ACK_BATCH_SIZE": 1,
    "ASYNC_CONCURRENCY": 1,
    "MAX_PAYLOAD_BYTES": 1,
    "MAX_HEADERS_BYTES": 1,
    "HEALTH_MAX_STUCK": 0,
    "HEALTH_MAX_DEAD": 0,
    "PARTITIONS_AHEAD": 1,
}


#: Longest duration any setting may name (100 years): both databases can add it to "now".
MAX_SECONDS = 100 * 365 * 24 * 3600.0
#: Upper bounds of the integer settings (the database columns are 32-bit; payloads must fit jsonb).
INT_MAX = {
    "MAX_ATTEMPTS": 1_000_000,
    "MAX_SNOOZES": 1_000_000,
    "MAX_PAYLOAD_BYTES": 256 * 1024 * 1024,
    "MAX_HEADERS_BYTES": 1024 * 1024,
}
DEFAULT_INT_MAX = 2**31 - 1


def parse_number(key: str, value: Any, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SettingError(key, f"must be a number of seconds, got {value!r}.")
    if value < 0 or (value == 0 and not allow_zero):
        raise SettingError(key, f"must be {'>= 0' if allow_zero else '> 0'} seconds, got {value!r}.")
    if value > MAX_SECONDS:
        raise SettingError(key, f"must be at most 100 years ({MAX_SECONDS:g} seconds), got {value!r}.")
    return float(value)


def parse_partition_period(key: str, value: Any) -> float:
    """Whole hours dividing a day, or whole days: every period starts at an hour, and a day's
    periods start at midnight UTC."""
    seconds = parse_number(key, value, allow_zero=False)
    hours = seconds / 3600
    if hours != int(hours) or not (24 % int(hours) == 0 or int(hours) % 24 == 0):
        raise SettingError(
            key,
            f"must be whole hours dividing a day (3600, 7200, ..., 43200) or whole days (86400, ...), got {value!r}.",
        )
    return seconds


def is_printable(text: str) -> bool:
    """No control characters (a trailing newline from an environment variable) and valid UTF-8."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_integer(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingError(key, f"must be an integer, got {value!r}.")
    maximum = INT_MAX.get(key, DEFAULT_INT_MAX)
    if not minimum <= value <= maximum:
        raise SettingError(key, f"must be from {minimum} to {maximum}, got {value!r}.")
    return value


def limit_parser(parse: Any) -> Any:
    """A :data:`QUEUE_OPTIONS` parser from a :mod:`zeroloss.rates` one (E007 on bad input)."""

    def parser(key: str, value: Any) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise SettingError(key, str(exc), "zeroloss.E007") from None

    return parser


#: The statuses a retention names, and how long each is kept by default (seconds; None: for ever).
DEFAULT_RETENTION: dict[str, float | None] = {
    Status.COMPLETED.value: 7 * 86400.0,
    Status.CANCELLED.value: 7 * 86400.0,
    Status.DEAD.value: 30 * 86400.0,
}
_RETENTION_EXAMPLE = '{"completed": "7d", "cancelled": "7d", "dead": "30d"}'


def parse_retention(key: str, value: Any) -> dict[str, float | None]:
    """``RETENTION`` or a queue's ``retention``: status -> seconds, a ``timedelta`` or a
    duration text (``90s``, ``15m``, ``2h``, ``7d``); None keeps them for ever. The statuses
    given (E008 otherwise); the caller fills in the others."""
    if value is None:
        return dict.fromkeys(DEFAULT_RETENTION, None)
    if not isinstance(value, dict):
        raise SettingError(
            key,
            f"must be a dict of status -> duration like {_RETENTION_EXAMPLE}, got {value!r}.",
            "zeroloss.E008",
        )
    unknown = sorted((k for k in value if k not in DEFAULT_RETENTION), key=str)
    if unknown:
        raise SettingError(
            key,
            f"unknown status {unknown[0]!r}: a retention names {', '.join(DEFAULT_RETENTION)} "
            f"(pending and processing messages are never removed), like {_RETENTION_EXAMPLE}.",
            "zeroloss.E008",
        )
    return {status: _retention_seconds(f"{key}[{status!r}]", v) for status, v in value.items()}


def _retention_seconds(key: str, value: Any) -> float | None:
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        seconds = parse_duration_text(value)
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        seconds = float(value)
    if seconds is None or not 0 < seconds <= MAX_SECONDS:
        raise SettingError(
            key,
            "must be a duration more than 0 and at most 100 years: seconds, a timedelta or a text like "
            f"90s, 15m, 2h, 7d (None: kept for ever), got {value!r}.",
            "zeroloss.E008",
        )
    return seconds


#: The options a declared queue accepts: name -> parser(key, value) returning the typed value
#: (raising :class:`SettingError`).
QUEUE_OPTIONS: dict[str, Any] = {
    "concurrency": limit_parser(parse_concurrency),
    "rate": limit_parser(parse_rate),
    "retention": parse_retention,
}


def parse_json_encoder(key: str, value: Any) -> type[json.JSONEncoder]:
    """The ``json.JSONEncoder`` subclass a dotted path names, or :class:`SettingError` (E005)."""
    from django.utils.module_loading import import_string

    if not isinstance(value, str) or "." not in value:
        raise SettingError(
            key,
            f"must be the dotted path of a json.JSONEncoder subclass, e.g. "
            f'"django.core.serializers.json.DjangoJSONEncoder", got {value!r}.',
            "zeroloss.E005",
        )
    try:
        found = import_string(value)
    except ImportError as exc:
        raise SettingError(key, f"{value!r} cannot be imported: {exc}", "zeroloss.E005") from None
    if not (isinstance(found, type) and issubclass(found, json.JSONEncoder)):
        raise SettingError(key, f"{value!r} is not a json.JSONEncoder subclass.", "zeroloss.E005")
    return found
