"""Public path of :func:`parse_schedule` (docs/schedules.md): defined in :mod:`zeroloss.runtime.schedules.spec`."""

from ..runtime.schedules.spec import ScheduleError, ScheduleSpec, parse_schedule

__all__ = ["ScheduleError", "ScheduleSpec", "parse_schedule"]
