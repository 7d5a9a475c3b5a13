"""The scheduler's statements, by name (rendered by the engine, as :mod:`zeroloss.ledger.statements`).

``{rows}`` is the engine's batch of rows (``unnest`` of arrays, or ``json_each`` of one JSON
array) with the columns of :data:`ROWS`, so each statement has one text whatever its size.
"""

from __future__ import annotations

from .models import Schedule, ScheduleState

_SCHEDULE = Schedule._meta.db_table
_STATE = ScheduleState._meta.db_table

#: The database clock and the version of the database schedules (their count and latest change).
CLOCK = f"SELECT {{clock}}, (SELECT count(*) FROM {_SCHEDULE}), (SELECT max(updated_at) FROM {_SCHEDULE})"
CREATE_STATES = (
    f"INSERT INTO {_STATE} (name, updated_at) SELECT b.name, {{now}} FROM {{rows}} "
    "WHERE true ON CONFLICT (name) DO NOTHING"
)
#: Locked in name order: schedulers running the same round queue up, never deadlock.
LOCK_STATES = (
    f"SELECT name, last_tick, last_sent FROM {_STATE} WHERE name IN (SELECT b.name FROM {{rows}}) "
    "ORDER BY name{lock_row}"
)
SAVE_STATES = (
    f"UPDATE {_STATE} SET last_tick = b.last_tick, last_sent = b.last_sent, updated_at = {{now}} "
    f"FROM {{rows}} WHERE {_STATE}.name = b.name"
)

ROWS: dict[str, tuple[tuple[str, str], ...]] = {
    "CREATE_STATES": (("name", "text"),),
    "LOCK_STATES": (("name", "text"),),
    "SAVE_STATES": (("name", "text"), ("last_tick", "timestamptz"), ("last_sent", "timestamptz")),
}
