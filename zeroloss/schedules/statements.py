"""The scheduler's statements, by name (rendered by the engine, as :mod:`zeroloss.ledger.statements`).

``{rows}`` is the engine's batch of rows (``unnest`` of arrays, or ``json_each`` of one JSON
array) with the columns of :data:`ROWS`, so each statement has one text whatever its size.
"""

from __future__ import annotations

from .models import Schedule, ScheduleState

_SCHEDULE = Schedule._meta.db_table
_STATE = ScheduleState._meta.db_table

#: The database clock and the version of the database schedules: every write bumps a row's
#: ``revision`` (their sum moves), a delete lowers the count, a create adds a new highest id. No
#: host's clock is in it, so an edit from a host whose clock is behind is seen like any other.
CLOCK = (
    f"SELECT {{clock}}, v.n, v.revisions, v.newest FROM (SELECT count(*) AS n, sum(revision) AS revisions, "
    f"max(id) AS newest FROM {_SCHEDULE}) v"
)
CREATE_STATES = (
    f"INSERT INTO {_STATE} (name, updated_at) SELECT b.name, {{now}} FROM {{rows}} "
    "WHERE true ON CONFLICT (name) DO NOTHING"
)
#: A schedule a scheduler sees enabled without a start (new in the settings, or re-enabled there):
#: it starts at that scheduler's clock reading, unless another started it first.
START_STATES = (
    f"INSERT INTO {_STATE} (name, last_tick, updated_at) SELECT b.name, b.last_tick, {{now}} FROM {{rows}} "
    f"WHERE true ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick, updated_at = excluded.updated_at "
    f"WHERE {_STATE}.last_tick IS NULL"
)
#: A settings schedule a scheduler sees disabled: it loses its start, so enabling it again starts
#: it afresh instead of catching up on the time it was off.
STOP_STATES = (
    f"UPDATE {_STATE} SET last_tick = NULL, updated_at = {{now}} WHERE last_tick IS NOT NULL "
    "AND name IN (SELECT b.name FROM {rows})"
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
    "START_STATES": (("name", "text"), ("last_tick", "timestamptz")),
    "STOP_STATES": (("name", "text"),),
    "LOCK_STATES": (("name", "text"),),
    "SAVE_STATES": (("name", "text"), ("last_tick", "timestamptz"), ("last_sent", "timestamptz")),
}
