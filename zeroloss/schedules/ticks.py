"""Public path of the tick helpers (docs/schedules.md): defined in :mod:`zeroloss.runtime.schedules.ticks`."""

from ..runtime.schedules.ticks import latest_ticks, next_tick, next_ticks

__all__ = ["latest_ticks", "next_tick", "next_ticks"]
