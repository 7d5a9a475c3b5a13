"""The operator's bulk statements outside the moves, by name (rendered by the engine, as
:mod:`.statements`): the purge, and the payload sizes that bound management batches."""

from __future__ import annotations

# -- the purge ------------------------------------------------------------------------------

# The oldest finished messages of a status, by the time of their last move (a cancelled
# message's last move is its cancellation: nothing moves it after). Parameters: status,
# minus the age in seconds, [queue,] batch size.
_PURGE_PICK = (
    "SELECT id, queue_name FROM {msg} WHERE status = %s AND {stamp} < {after}{queue} "
    "ORDER BY {stamp} LIMIT %s{skip_locked}"
)
_STAMPS = {"COMPLETED": "completed_at", "DEAD": "dead_at", "CANCELLED": "updated_at"}
_PICK = {
    f"PURGE_PICK_{status}{suffix}": _PURGE_PICK.replace("{stamp}", stamp).replace("{queue}", queue)
    for status, stamp in _STAMPS.items()
    for suffix, queue in (
        ("", ""),
        ("_OF_QUEUE", " AND queue_name = %s"),
        # Retention: every queue but those with a retention of their own (a batch of names).
        ("_EXCEPT_QUEUES", " AND queue_name NOT IN (SELECT b.q FROM {rows})"),
    )
}
PURGE_PICK_COMPLETED = _PICK["PURGE_PICK_COMPLETED"]
PURGE_PICK_COMPLETED_OF_QUEUE = _PICK["PURGE_PICK_COMPLETED_OF_QUEUE"]
PURGE_PICK_DEAD = _PICK["PURGE_PICK_DEAD"]
PURGE_PICK_DEAD_OF_QUEUE = _PICK["PURGE_PICK_DEAD_OF_QUEUE"]
PURGE_PICK_CANCELLED = _PICK["PURGE_PICK_CANCELLED"]
PURGE_PICK_CANCELLED_OF_QUEUE = _PICK["PURGE_PICK_CANCELLED_OF_QUEUE"]
PURGE_PICK_COMPLETED_EXCEPT_QUEUES = _PICK["PURGE_PICK_COMPLETED_EXCEPT_QUEUES"]
PURGE_PICK_DEAD_EXCEPT_QUEUES = _PICK["PURGE_PICK_DEAD_EXCEPT_QUEUES"]
PURGE_PICK_CANCELLED_EXCEPT_QUEUES = _PICK["PURGE_PICK_CANCELLED_EXCEPT_QUEUES"]
PURGE_EVENTS = "DELETE FROM {evt} WHERE message_id IN (SELECT b.id FROM {rows})"
PURGE_MESSAGES = "DELETE FROM {msg} WHERE id IN (SELECT b.id FROM {rows})"
# Their ids out of the key table (models.MessageKey; empty on SQLite): a resend after the purge
# stores the message again, as it did before the key table.
PURGE_KEYS = "DELETE FROM {key} WHERE message_id IN (SELECT m.message_id FROM {msg} m WHERE m.id IN (SELECT b.id FROM {rows}))"

# -- payload sizes, for byte-bounded batches --------------------------------------------------

PAYLOAD_SIZES = "SELECT id, {payload_size} FROM {msg} WHERE id > %s ORDER BY id LIMIT %s"
PAYLOAD_SIZES_OF_QUEUE = (
    "SELECT id, {payload_size} FROM {msg} WHERE id > %s AND queue_name = %s ORDER BY id LIMIT %s"
)
PAYLOAD_SIZES_OF = "SELECT id, {payload_size} FROM {msg} WHERE id IN (SELECT b.id FROM {rows}) ORDER BY id"

ROWS: dict[str, tuple[tuple[str, str], ...]] = {
    "PURGE_EVENTS": (("id", "bigint"),),
    "PURGE_MESSAGES": (("id", "bigint"),),
    "PURGE_KEYS": (("id", "bigint"),),
    "PAYLOAD_SIZES_OF": (("id", "bigint"),),
    **{f"PURGE_PICK_{status}_EXCEPT_QUEUES": (("q", "text"),) for status in _STAMPS},
}

# -- a maintenance duty's turn (models.MaintenanceTurn) ---------------------------------------

#: Taken when due (parameters: its name, the holder, seconds it is held): the holder's row if taken.
TAKE_TURN = (
    "INSERT INTO zeroloss_maintenance (name, holder, due_at) VALUES (%s, %s, {after}) "
    "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, due_at = excluded.due_at "
    "WHERE zeroloss_maintenance.due_at <= {now} RETURNING holder"
)
#: Held longer, or left due again later (parameters: seconds from now, its name, the holder).
HOLD_TURN = "UPDATE zeroloss_maintenance SET due_at = {after} WHERE name = %s AND holder = %s"

# -- sessions: idle workers' wake-up, dead peers (PostgreSQL) ---------------------------------

#: The channel the ledger's ``{notify}`` fragment sends a queue's name on.
LISTEN = "LISTEN zeroloss_wakeup"
#: TCP keepalive idle, interval and count, and the user timeout (ms), for this session.
KEEPALIVES = (
    "SELECT set_config('tcp_keepalives_idle', %s, false), set_config('tcp_keepalives_interval', %s, false), "
    "set_config('tcp_keepalives_count', %s, false), set_config('tcp_user_timeout', %s, false)"
)
