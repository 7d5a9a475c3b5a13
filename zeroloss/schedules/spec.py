"""``ZEROLOSS["SCHEDULES"]`` (and database-defined schedules): parsed into typed :class:`ScheduleSpec`.

Every error names the schedule and the field, and carries the stable id ``manage.py check``
reports (:mod:`zeroloss.checks`). Parsing is all or nothing: a scheduler refuses to start on a
bad settings schedule rather than run the good ones and silently drop the rest.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

#: Keys a schedule may have (the names are fixed by the public surface, docs/schedules.md).
KEYS = frozenset(
    {
        "queue",
        "task",
        "cron",
        "every",
        "timezone",
        "payload",
        "args",
        "kwargs",
        "priority",
        "ordering_key",
        "enabled",
        "catch_up",
        "max_catch_up",
        "overlap",
    }
)
CATCH_UP = ("latest", "all", "none")
OVERLAP = ("allow", "skip")
DEFAULT_MAX_CATCH_UP = 100
#: A tick id is ``<name>@<ISO 8601 UTC>`` (25-32 characters) and must fit the 255 of a message id.
MAX_NAME_LENGTH = 200
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]*")

#: Stable check ids, one per kind of error (zeroloss.checks lists them).
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


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule, validated. Exactly one of ``cron`` / ``every``; of ``queue`` / ``task``."""

    name: str
    queue: str
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    payload: Any = None
    task: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    ordering_key: str = ""
    enabled: bool = True
    catch_up: str = "latest"
    max_catch_up: int = DEFAULT_MAX_CATCH_UP
    overlap: str = "allow"
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
        data = {
            "name": self.name,
            "queue": self.queue,
            "task": self.task,
            "cron": self.cron,
            "every": self.every,
            "timezone": self.timezone,
            "payload": self.payload,
            "args": list(self.args),
            "kwargs": self.kwargs,
            "priority": self.priority,
            "ordering_key": self.ordering_key,
            "enabled": self.enabled,
            "catch_up": self.catch_up,
            "max_catch_up": self.max_catch_up,
            "overlap": self.overlap,
            "source": self.source,
        }
        return data


def tick_message_id(name: str, tick: dt.datetime) -> str:
    """``<name>@<tick in UTC, ISO 8601>``: every scheduler names a tick the same, so the ledger's
    unique message id lets exactly one insert of it succeed."""
    return f"{name}@{tick.astimezone(dt.UTC).isoformat()}"


def _default_timezone() -> str:
    from django.conf import settings

    return str(getattr(settings, "TIME_ZONE", None) or "UTC")


def _json(name: str, key: str, value: Any) -> Any:
    try:
        encoded = json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(name, key, f"must be JSON ({exc}).", E_VALUE) from None
    if json.loads(encoded) != value:
        raise ScheduleError(name, key, "changes in a JSON round trip (dict keys must be strings).", E_VALUE)
    return value


def validate_cron(expr: Any) -> str:
    """A five-field cron expression, as ``cronsim`` reads it; ValueError says what is wrong."""
    from cronsim import CronSim, CronSimError

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


def _known_queue(queue: str) -> bool:
    from ..exceptions import UnknownQueue
    from ..handlers import get_handler

    try:
        get_handler(queue)
    except UnknownQueue:
        return False
    return True


def resolve_task(path: str) -> Any:
    """The Django task at ``path`` (``django.tasks`` or the ``django-tasks`` backport); ValueError else."""
    from django.utils.module_loading import import_string

    try:
        found = import_string(path)
    except ImportError as exc:
        raise ValueError(f"cannot be imported ({exc}), got {path!r}.") from None
    if not hasattr(found, "enqueue") or not hasattr(found, "module_path") or not hasattr(found, "func"):
        raise ValueError(f"is not a Django task (decorate the function with @task), got {path!r}.")
    return found


def parse_schedule(
    name: Any, raw: Any, *, source: str = "settings", check_targets: bool = True
) -> ScheduleSpec:
    """Validate one schedule. ``check_targets=False`` skips the queue and task look-ups (used by
    tools that only compute ticks)."""
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
    values: dict[str, Any] = {"name": name, "source": source}
    has_cron, has_every = raw.get("cron") is not None, raw.get("every") is not None
    if has_cron == has_every:
        raise ScheduleError(
            name,
            "cron" if has_cron else "*",
            "give exactly one of 'cron' (five fields) or 'every' (seconds), "
            + ("not both." if has_cron else "got neither."),
            E_WHEN,
        )
    if has_cron:
        try:
            values["cron"] = validate_cron(raw["cron"])
        except ValueError as exc:
            raise ScheduleError(name, "cron", str(exc), E_CRON) from None
    else:
        every = raw["every"]
        if (
            isinstance(every, bool)
            or not isinstance(every, int | float)
            or not math.isfinite(every)
            or every <= 0
        ):
            raise ScheduleError(name, "every", f"must be a number of seconds > 0, got {every!r}.", E_EVERY)
        if every < 0.001 or every > 100 * 365 * 86400:
            raise ScheduleError(
                name, "every", f"must be from 0.001 seconds to 100 years, got {every!r}.", E_EVERY
            )
        values["every"] = float(every)
    tz = raw.get("timezone")
    try:
        values["timezone"] = validate_timezone(_default_timezone() if tz is None else tz)
    except ValueError as exc:
        raise ScheduleError(name, "timezone", str(exc), E_TIMEZONE) from None

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
        if not isinstance(task, str) or not task:
            raise ScheduleError(name, "task", f"must be a task's import path, got {task!r}.", E_TASK)
        values["task"] = task
        if check_targets:
            try:
                values["queue"] = str(resolve_task(task).queue_name)
            except ValueError as exc:
                raise ScheduleError(name, "task", str(exc), E_TASK) from None
        else:
            values["queue"] = ""
        if raw.get("payload") is not None:
            raise ScheduleError(
                name, "payload", "a task schedule takes 'args'/'kwargs', not 'payload'.", E_VALUE
            )
    else:
        from ..ledger.validation import validate_queue_name

        try:
            values["queue"] = validate_queue_name(queue)
        except Exception as exc:
            raise ScheduleError(name, "queue", str(exc), E_QUEUE) from None
        if check_targets and not _known_queue(values["queue"]):
            raise ScheduleError(
                name, "queue", f"no @zeroloss.handler or task backend serves queue {queue!r}.", E_QUEUE
            )
        for key in ("args", "kwargs"):
            if raw.get(key) is not None:
                raise ScheduleError(
                    name, key, f"'{key}' needs 'task'; a queue schedule takes 'payload'.", E_VALUE
                )
        values["payload"] = _json(name, "payload", raw.get("payload"))

    args = raw.get("args")
    if args is not None:
        if not isinstance(args, list | tuple):
            raise ScheduleError(name, "args", f"must be a list, got {args!r}.", E_VALUE)
        values["args"] = tuple(_json(name, "args", list(args)))
    kwargs = raw.get("kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, Mapping):
            raise ScheduleError(name, "kwargs", f"must be a dict, got {kwargs!r}.", E_VALUE)
        values["kwargs"] = dict(_json(name, "kwargs", dict(kwargs)))
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ScheduleError(
            name, "priority", f"must be an integer from -100 to 100, got {priority!r}.", E_VALUE
        )
    values["priority"] = priority
    key = raw.get("ordering_key", "")
    if not isinstance(key, str) or len(key) > 255 or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ScheduleError(
            name, "ordering_key", f"must be printable text of at most 255 characters, got {key!r}.", E_VALUE
        )
    values["ordering_key"] = key
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ScheduleError(name, "enabled", f"must be True or False, got {enabled!r}.", E_VALUE)
    values["enabled"] = enabled
    catch_up = raw.get("catch_up", "latest")
    if catch_up not in CATCH_UP:
        raise ScheduleError(name, "catch_up", f"must be one of {CATCH_UP}, got {catch_up!r}.", E_VALUE)
    values["catch_up"] = catch_up
    max_catch_up = raw.get("max_catch_up", DEFAULT_MAX_CATCH_UP)
    if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int) or not 1 <= max_catch_up <= 10_000:
        raise ScheduleError(
            name, "max_catch_up", f"must be an integer from 1 to 10000, got {max_catch_up!r}.", E_VALUE
        )
    values["max_catch_up"] = max_catch_up
    overlap = raw.get("overlap", "allow")
    if overlap not in OVERLAP:
        raise ScheduleError(name, "overlap", f"must be one of {OVERLAP}, got {overlap!r}.", E_VALUE)
    values["overlap"] = overlap
    return ScheduleSpec(**values)


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
    from ..conf import get_settings

    raw = get_settings().SCHEDULES
    errors = schedule_errors(raw, check_targets=check_targets)
    if errors:
        raise errors[0]
    return {
        name: parse_schedule(name, entry, check_targets=check_targets) for name, entry in (raw or {}).items()
    }
