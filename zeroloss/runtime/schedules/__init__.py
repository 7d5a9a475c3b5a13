"""Periodic messages, exactly once per tick (docs/schedules.md).

- :mod:`.spec`: ``ZEROLOSS["SCHEDULES"]`` and database schedules parsed and validated;
- :mod:`.ticks`: when a schedule ticks (time zones, the DST rule);
- :mod:`.scheduler`: a round reads the database clock once and inserts every due tick's
  message, named ``<name>@<tick UTC ISO 8601>``, in one batch: the unique id is the proof.
"""
