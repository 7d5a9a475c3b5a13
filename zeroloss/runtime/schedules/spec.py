"""``ZEROLOSS["SCHEDULES"]`` (and database-defined schedules): parsed into typed :class:`ScheduleSpec`.

Every error names the schedule and the field, and carries the stable id ``manage.py check``
reports (:mod:`zeroloss.ops.checks`). Parsing is all or nothing: a scheduler refuses to start on a
bad settings schedule rather than run the good ones and silently drop the rest.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import zoneinfo
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ...core.names import validate_queue_name
from ...core.setting_values import MAX_SECONDS
from ...core.settings import get_settings
from ...exceptions import UnknownQueue
from ..handlers import get_handler

CATCH_UP = ("latest", "all", "none")
OVERLAP = ("allow", "skip")
DEFAULT_MAX_CATCH_UP = 100
#: A tick id is ``<name>@<ISO 8601 UTC>`` (25-32 characters) and must fit the 255 of a message id.
MAX_NAME_LENGTH = 200
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]*")

#: Stable check ids, one per kind of error (zeroloss.ops.checks lists them).
E_STRUCTURE = "zeroloss.E050"  # SCHEDULES is not a dict of name -> dict, or a bad name
E_UNKNOWN_KEY = "zeroloss.E051"
E_WHEN = "zeroloss.E052"  # both or neither of cron / every
E_CRON = "zeroloss.E053"
E_EVERY = "zeroloss.E054"
E_TIMEZONE = "zeroloss.E055"
E_QUEUE = "zeroloss.E056"  # unknown queue, or both or neither of queue / task
E_TASK = "zeroloss.E057"
E_VALUE = "zeroloss.E058"  # any other key with an invalid value


class ScheduleError(ImproperlyConfigured):
    """One invalid schedule field. ``field`` is the key at fault (``"*"`` for the whole schedule)."""

    def __init__(self, name: str, field: str, message: str, check_id: str) -> None:
        where = f"ZEROLOSS['SCHEDULES'][{name!r}]" if name else "ZEROLOSS['SCHEDULES']"
        if field != "*":
            where += f"[{field!r}]"
        super().__init__(f"{where}: {message}")
        self.name = name
        self.field = field
        self.check_id = check_id
        self.message = message


def validate_cron(expr: Any) -> str:
    """A five-field cron expression, as ``cronsim`` reads it; ValueError says what is wrong."""

    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise ValueError(f"must be a cron expression of five fields, got {expr!r}.")
    try:
        CronSim(expr, dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    except CronSimError as exc:
        raise ValueError(f"is not a valid cron expression ({exc}), got {expr!r}.") from None
    return " ".join(expr.split())


def validate_timezone(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be an IANA time zone name such as 'Europe/Berlin', got {value!r}.")
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"is not a known IANA time zone, got {value!r}.") from None
    return value


def _every(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"must be a number of seconds > 0, got {value!r}.")
    if value < 0.001 or value > MAX_SECONDS:
        raise ValueError(f"must be from 0.001 seconds to 100 years, got {value!r}.")
    return float(value)


def _json(value: Any) -> Any:
    try:
        encoded = json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be JSON ({exc}).") from None
    if json.loads(encoded) != value:
        raise ValueError("changes in a JSON round trip (dict keys must be strings).")
    return value


def _args(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ValueError(f"must be a list, got {value!r}.")
    return tuple(_json(list(value)))


def _kwargs(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a dict, got {value!r}.")
    return dict(_json(dict(value)))


def _integer(low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"must be an integer from {low} to {high}, got {value!r}.")
        return value

    return parse


def _one_of(options: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"must be one of {options}, got {value!r}.")
        return str(value)

    return parse


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be True or False, got {value!r}.")
    return value


def _ordering_key(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 255 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"must be printable text of at most 255 characters, got {value!r}.")
    return value


def _task_path(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a task's import path, got {value!r}.")
    return value


_READ = "zeroloss.schedule_key"


def _reads(parse: Callable[[Any], Any], check_id: str = E_VALUE) -> dict[str, Any]:
    """A schedule key's field metadata: how its value is read (ValueError says what is wrong) and
    the check id of a bad one."""
    return {_READ: (parse, check_id)}


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule, validated. Exactly one of ``cron`` / ``every``; of ``queue`` / ``task``.
    Each key of a ``SCHEDULES`` entry is a field whose metadata says how it is read."""

    name: str
    queue: str = field(metadata=_reads(validate_queue_name, E_QUEUE))  # InvalidMessage is a ValueError
    task: str | None = field(default=None, metadata=_reads(_task_path, E_TASK))
    cron: str | None = field(default=None, metadata=_reads(validate_cron, E_CRON))
    every: float | None = field(default=None, metadata=_reads(_every, E_EVERY))
    timezone: str = field(default="UTC", metadata=_reads(validate_timezone, E_TIMEZONE))
    payload: Any = field(default=None, metadata=_reads(_json))
    args: tuple[Any, ...] = field(default=(), metadata=_reads(_args))
    kwargs: dict[str, Any] = field(default_factory=dict, metadata=_reads(_kwargs))
    priority: int = field(default=0, metadata=_reads(_integer(-100, 100)))
    ordering_key: str = field(default="", metadata=_reads(_ordering_key))
    enabled: bool = field(default=True, metadata=_reads(_flag))
    catch_up: str = field(default="latest", metadata=_reads(_one_of(CATCH_UP)))
    max_catch_up: int = field(default=DEFAULT_MAX_CATCH_UP, metadata=_reads(_integer(1, 10_000)))
    overlap: str = field(default="allow", metadata=_reads(_one_of(OVERLAP)))
    #: "settings" or "database" (the admin shows settings-defined ones read-only).
    source: str = "settings"

    @property
    def tz(self) -> dt.tzinfo:
        return zoneinfo.ZoneInfo(self.timezone)

    @property
    def when(self) -> str:
        return f"cron {self.cron!r} ({self.timezone})" if self.cron else f"every {self.every:g}s"

    def message_id(self, tick: dt.datetime) -> str:
        return tick_message_id(self.name, tick)

    def as_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "args": list(self.args)}


#: How each key a schedule may have is read (the names are fixed by the public surface,
#: docs/schedules.md), in the order a schedule is checked.
READERS: dict[str, tuple[Callable[[Any], Any], str]] = {
    f.name: f.metadata[_READ] for f in fields(ScheduleSpec) if _READ in f.metadata
}
KEYS = frozenset(READERS)
_FIELDS = {f.name: f for f in fields(ScheduleSpec)}
#: Read by :func:`_when` and :func:`_target`, which also check how they go together; every other
#: key is read on its own.
_PAIRED = frozenset({"cron", "every", "timezone", "queue", "task", "payload"})


def tick_message_id(name: str, tick: dt.datetime) -> str:
    """``<name>@<tick in UTC, ISO 8601>``: every scheduler names a tick the same, so the ledger's
    unique message id lets exactly one insert of it succeed."""
    return f"{name}@{tick.astimezone(dt.UTC).isoformat()}"


def _default_timezone() -> str:

    return str(getattr(settings, "TIME_ZONE", None) or "UTC")


def _known_queue(queue: str) -> bool:

    try:
        get_handler(queue)
    except UnknownQueue:
        return False
    return True


def resolve_task(path: str) -> Any:
    """The Django task at ``path`` (``django.tasks`` or the ``django-tasks`` backport); ValueError else."""

    try:
        found = import_string(path)
    except ImportError as exc:
        raise ValueError(f"cannot be imported ({exc}), got {path!r}.") from None
    if not hasattr(found, "enqueue") or not hasattr(found, "module_path") or not hasattr(found, "func"):
        raise ValueError(f"is not a Django task (decorate the function with @task), got {path!r}.")
    return found


def _read(name: str, key: str, value: Any) -> Any:
    """``value`` of ``key`` as its field declares; a :class:`ScheduleError` naming both otherwise."""
    parse, check_id = READERS[key]
    try:
        return parse(value)
    except ValueError as exc:
        raise ScheduleError(name, key, str(exc), check_id) from None


def _given(raw: Mapping[str, Any], key: str) -> Any:
    """``raw[key]``, or the field's default when the schedule leaves it out."""
    if key in raw:
        return raw[key]
    declared = _FIELDS[key]
    return declared.default if declared.default_factory is MISSING else declared.default_factory()


def parse_schedule(
    name: Any, raw: Any, *, source: str = "settings", check_targets: bool = True
) -> ScheduleSpec:
    """Validate one schedule. ``check_targets=False`` skips the queue and task look-ups (used by
    tools that only compute ticks)."""
    _check_shape(name, raw)
    values: dict[str, Any] = {"name": name, "source": source}
    values.update(_when(name, raw))
    values.update(_target(name, raw, check_targets))
    for key in READERS:
        if key not in _PAIRED:
            values[key] = _read(name, key, _given(raw, key))
    return ScheduleSpec(**values)


def _check_shape(name: Any, raw: Any) -> None:
    """A valid name, a dict, and no key a schedule does not have (E050, E051)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise ScheduleError(
            str(name),
            "*",
            f"a schedule name must match {NAME_RE.pattern} (no '@', no spaces) and have at most "
            f"{MAX_NAME_LENGTH} characters, got {name!r}.",
            E_STRUCTURE,
        )
    if not isinstance(raw, Mapping):
        raise ScheduleError(name, "*", f"must be a dict, got {type(raw).__name__}.", E_STRUCTURE)
    unknown = sorted(set(raw) - KEYS, key=str)
    if unknown:
        raise ScheduleError(
            name, str(unknown[0]), f"unknown key; known keys are {', '.join(sorted(KEYS))}.", E_UNKNOWN_KEY
        )


def _when(name: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Exactly one of ``cron`` and ``every`` (E052), and the ``timezone`` (Django's by default)."""
    has_cron, has_every = raw.get("cron") is not None, raw.get("every") is not None
    if has_cron == has_every:
        raise ScheduleError(
            name,
            "cron" if has_cron else "*",
            "give exactly one of 'cron' (five fields) or 'every' (seconds), "
            + ("not both." if has_cron else "got neither."),
            E_WHEN,
        )
    key = "cron" if has_cron else "every"
    timezone = raw.get("timezone")
    return {
        key: _read(name, key, raw[key]),
        "timezone": _read(name, "timezone", _default_timezone() if timezone is None else timezone),
    }


def _target(name: str, raw: Mapping[str, Any], check_targets: bool) -> dict[str, Any]:
    """Exactly one of ``queue`` (with a ``payload``) and ``task`` (with ``args``, ``kwargs``)."""
    queue, task = raw.get("queue"), raw.get("task")
    if (queue is None) == (task is None):
        raise ScheduleError(
            name,
            "queue" if queue is not None else "*",
            "give exactly one of 'queue' (a zeroloss handler's queue) or 'task' (a Django task's import "
            "path), " + ("not both." if queue is not None else "got neither."),
            E_QUEUE,
        )
    if task is not None:
        values = {"task": _read(name, "task", task), "queue": ""}
        if check_targets:
            try:
                values["queue"] = str(resolve_task(task).queue_name)
            except ValueError as exc:
                raise ScheduleError(name, "task", str(exc), E_TASK) from None
        if raw.get("payload") is not None:
            raise ScheduleError(
                name, "payload", "a task schedule takes 'args'/'kwargs', not 'payload'.", E_VALUE
            )
        return values
    values = {"queue": _read(name, "queue", queue)}
    if check_targets and not _known_queue(values["queue"]):
        raise ScheduleError(
            name, "queue", f"no @zeroloss.handler or task backend serves queue {queue!r}.", E_QUEUE
        )
    for key in ("args", "kwargs"):
        if raw.get(key) is not None:
            raise ScheduleError(
                name, key, f"'{key}' needs 'task'; a queue schedule takes 'payload'.", E_VALUE
            )
    values["payload"] = _read(name, "payload", raw.get("payload"))
    return values


def schedule_errors(raw: Any, *, check_targets: bool = True) -> list[ScheduleError]:
    """Every invalid schedule of a ``SCHEDULES`` value (one error each: its first bad field)."""
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        return [
            ScheduleError(
                "", "*", f"must be a dict of name -> schedule, got {type(raw).__name__}.", E_STRUCTURE
            )
        ]
    errors = []
    for name, entry in raw.items():
        try:
            parse_schedule(name, entry, check_targets=check_targets)
        except ScheduleError as exc:
            errors.append(exc)
    return errors


def settings_schedules(*, check_targets: bool = True) -> dict[str, ScheduleSpec]:
    """``ZEROLOSS["SCHEDULES"]`` parsed; raises the first :class:`ScheduleError` (nothing half-applied)."""

    raw = get_settings().SCHEDULES
    errors = schedule_errors(raw, check_targets=check_targets)
    if errors:
        raise errors[0]
    return {
        name: parse_schedule(name, entry, check_targets=check_targets) for name, entry in (raw or {}).items()
    }
