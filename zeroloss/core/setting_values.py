"""How a ``ZEROLOSS`` setting is declared: :func:`setting`, and the kinds of value it may hold.

A setting is one field of :class:`~zeroloss.core.settings.ZeroLossSettings`: its annotation is
its type and its default is written once; :func:`setting` attaches a :class:`Spec` saying how a
raw value is validated (its :class:`Kind`), which system check reports it, and what the docs'
table says of it. Parsing, the system checks, a queue's options and ``docs/settings.md`` are all
read from those fields.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .durations import parse_duration_text
from .states import Status


class SettingError(ImproperlyConfigured):
    """One invalid ``ZEROLOSS`` entry. ``check_id`` is the stable id ``manage.py check`` reports."""

    def __init__(self, key: str, message: str, check_id: str = "zeroloss.E003") -> None:
        super().__init__(f"ZEROLOSS[{key!r}]: {message}")
        self.key = key
        self.check_id = check_id
        self.hint = message


#: The check id of a bad value, unless its setting names its own.
INVALID_VALUE = "zeroloss.E003"
#: Longest duration any setting, delay, window or age may name (100 years): both databases can add
#: it to "now" or take it away, and nothing useful lies further.
MAX_SECONDS = 100 * 365 * 24 * 3600.0
#: The largest integer a setting may name unless it says less (the database columns are 32-bit).
DEFAULT_INT_MAX = 2**31 - 1

#: ``parse(key, value, check_id)``: the typed value, or :class:`SettingError` with ``check_id``.
Parser = Callable[[str, Any, str], Any]


@dataclass(frozen=True)
class Kind:
    """What a setting accepts: its parser, and how the docs' "valid" column says it."""

    parse: Parser
    valid: str
    unit: str = ""


@dataclass(frozen=True)
class Spec:
    """A setting's declaration, beside its type and default (the dataclass field's)."""

    kind: Kind
    help: str
    check_id: str = INVALID_VALUE
    #: The docs' unit column (a number of seconds: ``s``, from its kind).
    unit: str | None = None
    #: The docs' default column, when the default's Python text does not say it well.
    shown: str | None = None
    #: Said after the default in the docs: ``262144`` (256 KiB).
    note: str | None = None

    def parse(self, key: str, value: Any) -> Any:
        return self.kind.parse(key, value, self.check_id)


_SPEC = "zeroloss.setting"


def setting(
    default: Any,
    kind: Kind,
    help: str,
    *,
    check_id: str = INVALID_VALUE,
    unit: str | None = None,
    shown: str | None = None,
    note: str | None = None,
) -> Any:
    """A settings field: ``NAME: type = setting(default, kind, help, ...)``. ``help`` is the docs'
    text (Markdown, relative links from ``docs/``); its line breaks are spaces."""
    spec = Spec(kind, " ".join(help.split()), check_id, unit, shown, note)
    if isinstance(default, dict | list):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={_SPEC: spec})
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def specs(cls: type) -> dict[str, Spec]:
    """Every field of a settings dataclass ``cls`` declared with :func:`setting`, by name, in order."""
    return {f.name: f.metadata[_SPEC] for f in dataclasses.fields(cls) if _SPEC in f.metadata}


def seconds(*, zero: bool = False, none: bool = False) -> Kind:
    """A number of seconds, > 0 (``zero``: >= 0), at most :data:`MAX_SECONDS`; ``none``: or None."""

    def parse(key: str, value: Any, check_id: str) -> float | None:
        if value is None and none:
            return None
        return parse_number(key, value, allow_zero=zero, check_id=check_id)

    return Kind(parse, ("≥ 0" if zero else "> 0") + (" or `None`" if none else ""), "s")


def parse_number(key: str, value: Any, *, allow_zero: bool, check_id: str = INVALID_VALUE) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SettingError(key, f"must be a number of seconds, got {value!r}.", check_id)
    if value < 0 or (value == 0 and not allow_zero):
        raise SettingError(
            key, f"must be {'>= 0' if allow_zero else '> 0'} seconds, got {value!r}.", check_id
        )
    if value > MAX_SECONDS:
        raise SettingError(
            key, f"must be at most 100 years ({MAX_SECONDS:g} seconds), got {value!r}.", check_id
        )
    return float(value)


def integer(minimum: int, maximum: int = DEFAULT_INT_MAX) -> Kind:
    """An integer from ``minimum`` to ``maximum`` (not a bool, not a float)."""

    def parse(key: str, value: Any, check_id: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingError(key, f"must be an integer, got {value!r}.", check_id)
        if not minimum <= value <= maximum:
            raise SettingError(key, f"must be from {minimum} to {maximum}, got {value!r}.", check_id)
        return value

    shown = f"integer ≥ {minimum}" if maximum == DEFAULT_INT_MAX else f"integer from {minimum} to {maximum:,}"
    return Kind(parse, shown)


def flag() -> Kind:
    def parse(key: str, value: Any, check_id: str) -> bool:
        if not isinstance(value, bool):
            raise SettingError(key, f"must be True or False, got {value!r}.", check_id)
        return value

    return Kind(parse, "`True`, `False`")


def choice(*options: str) -> Kind:
    def parse(key: str, value: Any, check_id: str) -> str:
        if value not in options:
            raise SettingError(key, f"must be one of {options}, got {value!r}.", check_id)
        return str(value)

    return Kind(parse, ", ".join(f'`"{o}"`' for o in options))


def anything(valid: str) -> Kind:
    """Kept as given: validated elsewhere (``SCHEDULES``: :mod:`zeroloss.runtime.schedules.spec`)."""
    return Kind(lambda key, value, check_id: value, valid)


def partition_period() -> Kind:
    """Whole hours dividing a day, or whole days: every period starts at an hour, and a day's
    periods start at midnight UTC."""

    def parse(key: str, value: Any, check_id: str) -> float:
        seconds = parse_number(key, value, allow_zero=False, check_id=check_id)
        hours = seconds / 3600
        if hours != int(hours) or not (24 % int(hours) == 0 or int(hours) % 24 == 0):
            raise SettingError(
                key,
                "must be whole hours dividing a day (3600, 7200, ..., 43200) or whole days (86400, ...), "
                f"got {value!r}.",
                check_id,
            )
        return seconds

    return Kind(parse, "whole hours dividing a day (3600 … 43200), or whole days", "s")


def is_printable(text: str) -> bool:
    """No control characters (a trailing newline from an environment variable) and valid UTF-8."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: The statuses a retention names, and how long each is kept by default (seconds; None: for ever).
DEFAULT_RETENTION: dict[str, float | None] = {
    Status.COMPLETED.value: 7 * 86400.0,
    Status.CANCELLED.value: 7 * 86400.0,
    Status.DEAD.value: 30 * 86400.0,
}
_RETENTION_EXAMPLE = '{"completed": "7d", "cancelled": "7d", "dead": "30d"}'


def retention(*, fill: bool) -> Kind:
    """``RETENTION`` (``fill``: the statuses not given keep their default) or a queue's
    ``retention`` (only the statuses given: the others are ``RETENTION``'s)."""

    def parse(key: str, value: Any, check_id: str) -> dict[str, float | None]:
        given = parse_retention(key, value, check_id)
        return {**DEFAULT_RETENTION, **given} if fill else given

    return Kind(parse, "see [Retention](#retention)", "s")


def parse_retention(key: str, value: Any, check_id: str = "zeroloss.E008") -> dict[str, float | None]:
    """``RETENTION`` or a queue's ``retention``: status -> seconds, a ``timedelta`` or a
    duration text (``90s``, ``15m``, ``2h``, ``7d``); None keeps them for ever. The statuses
    given (E008 otherwise); the caller fills in the others."""
    if value is None:
        return dict.fromkeys(DEFAULT_RETENTION, None)
    if not isinstance(value, dict):
        raise SettingError(
            key,
            f"must be a dict of status -> duration like {_RETENTION_EXAMPLE}, got {value!r}.",
            check_id,
        )
    unknown = sorted((k for k in value if k not in DEFAULT_RETENTION), key=str)
    if unknown:
        raise SettingError(
            key,
            f"unknown status {unknown[0]!r}: a retention names {', '.join(DEFAULT_RETENTION)} "
            f"(pending and processing messages are never removed), like {_RETENTION_EXAMPLE}.",
            check_id,
        )
    return {status: _retention_seconds(f"{key}[{status!r}]", v, check_id) for status, v in value.items()}


def _retention_seconds(key: str, value: Any, check_id: str) -> float | None:
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
            check_id,
        )
    return seconds


def limit(parse_limit: Callable[[Any], Any], valid: str) -> Kind:
    """A queue limit from a :mod:`zeroloss.core.rates` parser (its ValueError says what to write)."""

    def parse(key: str, value: Any, check_id: str) -> Any:
        try:
            return parse_limit(value)
        except ValueError as exc:
            raise SettingError(key, str(exc), check_id) from None

    return Kind(parse, valid)


def json_encoder_path() -> Kind:
    def parse(key: str, value: Any, check_id: str) -> str | None:
        if value is not None:
            parse_json_encoder(key, value, check_id)  # importable, and an encoder
        return value

    return Kind(parse, "`None` or the dotted path of a `json.JSONEncoder` subclass")


def parse_json_encoder(key: str, value: Any, check_id: str = "zeroloss.E005") -> type[json.JSONEncoder]:
    """The ``json.JSONEncoder`` subclass a dotted path names, or :class:`SettingError` (E005)."""

    if not isinstance(value, str) or "." not in value:
        raise SettingError(
            key,
            f"must be the dotted path of a json.JSONEncoder subclass, e.g. "
            f'"django.core.serializers.json.DjangoJSONEncoder", got {value!r}.',
            check_id,
        )
    try:
        found = import_string(value)
    except ImportError as exc:
        raise SettingError(key, f"{value!r} cannot be imported: {exc}", check_id) from None
    if not (isinstance(found, type) and issubclass(found, json.JSONEncoder)):
        raise SettingError(key, f"{value!r} is not a json.JSONEncoder subclass.", check_id)
    return found
